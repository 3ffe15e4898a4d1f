package hostmem

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
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

// TestAddressSpace reads VmSize in bytes; a missing line or a value past
// int64 is "cannot tell"; this process's is read.
func TestAddressSpace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "status")
	if err := os.WriteFile(p, []byte("Name:\tx\nVmPeak:\t 9 kB\nVmSize:\t 1048576 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, ok := AddressSpace(p); !ok || b != 1<<30 {
		t.Errorf("got %d %v, want 1 GiB", b, ok)
	}
	if err := os.WriteFile(p, []byte("VmSize: 99999999999999999 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, ok := AddressSpace(p); ok {
		t.Errorf("past int64: got %d, want cannot tell", b)
	}
	if _, err := os.Stat(StatusPath); err == nil {
		if b, ok := AddressSpace(StatusPath); !ok || b <= 0 {
			t.Errorf("this process: %d %v", b, ok)
		}
	}
}

// TestCheckAddressSpace: what is asked and the headroom must fit in the
// limit beside what the process holds; sums past int64 are refused, not
// wrapped; the error names RLIMIT_AS, its value, what needs the room and
// the limit that would do.
func TestCheckAddressSpace(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		need, limit, used int64
		ok                bool
	}{
		{0, 2 * gib, gib, true},
		{gib/2 - RunHeadroomBytes, 2 * gib, 3 * gib / 2, true},
		{gib/2 - RunHeadroomBytes + 1, 2 * gib, 3 * gib / 2, false},
		{0, 2 * gib, 3 * gib, false},
		{1 << 62, 1 << 62, 0, false},
		{math.MaxInt64, math.MaxInt64, 1, false},
	} {
		err := checkAddressSpace("strata.host_budget 1 GiB", tc.need, tc.limit, tc.used)
		if (err == nil) != tc.ok {
			t.Errorf("need %d, limit %d, used %d: %v, want ok %v", tc.need, tc.limit, tc.used, err, tc.ok)
		}
	}
	err := checkAddressSpace("strata.host_budget 1.00 GiB", gib, 2*gib, 3*gib/2)
	want := "the address-space limit RLIMIT_AS (ulimit -v) is 2.00 GiB, and the process holds 1.50 GiB of it already (VmSize: the Go runtime and the C library reserve a GiB or more they never touch), but strata.host_budget 1.00 GiB needs 1.50 GiB more (512.0 MiB of it for threads and the heap): raise the limit to at least 3.00 GiB (`ulimit -v 3145728`) or lift it"
	var ae *AddressSpaceError
	if !errors.As(err, &ae) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v\nwant %s...", err, want)
	}
}
