package hostmem

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAvailable reads MemAvailable in bytes; a missing file, a missing
// line or a value past int64 is "cannot tell".
func TestAvailable(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if b, ok := Available(write("ok", "MemTotal: 16 kB\nMemAvailable:    8388608 kB\n")); !ok || b != 8<<30 {
		t.Errorf("got %d %v, want 8 GiB", b, ok)
	}
	for name, text := range map[string]string{"none": "MemTotal: 16 kB\n", "huge": "MemAvailable: 99999999999999999 kB\n", "bad": "MemAvailable: x kB\n"} {
		if b, ok := Available(write(name, text)); ok {
			t.Errorf("%s: got %d, want cannot tell", name, b)
		}
	}
	if _, ok := Available(filepath.Join(dir, "missing")); ok {
		t.Error("missing file: got ok")
	}
	if _, err := os.Stat(MeminfoPath); err == nil {
		if b, ok := Available(MeminfoPath); !ok || b <= 0 {
			t.Errorf("this host: %d %v", b, ok)
		}
	}
}
