package cuda

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// countingCompile is a compile function that returns a fixed module and
// counts its calls (the cache logic, not NVRTC, is under test).
func countingCompile(bin []byte, calls *int) func() ([]byte, error) {
	return func() ([]byte, error) {
		*calls++
		return bytes.Clone(bin), nil
	}
}

func TestKernelCacheStoreLoad(t *testing.T) {
	c := kernelCache{dir: filepath.Join(t.TempDir(), "k")}
	bin := []byte("\x7fELF fake cubin bytes")
	calls := 0
	b, hit, serr, err := c.get("key1", countingCompile(bin, &calls))
	if err != nil || serr != nil || hit || calls != 1 || !bytes.Equal(b, bin) {
		t.Fatalf("cold get: %q hit %v store %v err %v calls %d", b, hit, serr, err, calls)
	}
	b, hit, serr, err = c.get("key1", countingCompile(bin, &calls))
	if err != nil || serr != nil || !hit || calls != 1 || !bytes.Equal(b, bin) {
		t.Fatalf("warm get: %q hit %v store %v err %v calls %d (want no compile)", b, hit, serr, err, calls)
	}
	if _, _, _, err := c.get("key2", countingCompile(bin, &calls)); err != nil || calls != 2 {
		t.Fatalf("another key must compile: calls %d err %v", calls, err)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(c.dir)
	if len(ents) != 2 {
		t.Errorf("cache folder holds %d entries, want 2: %v", len(ents), ents)
	}
}

func TestKernelCacheCorruptEntries(t *testing.T) {
	bin := []byte("0123456789abcdef module")
	cases := map[string]func(b []byte) []byte{
		"empty":        func(b []byte) []byte { return nil },
		"short header": func(b []byte) []byte { return b[:10] },
		"truncated":    func(b []byte) []byte { return b[:len(b)-3] },
		"bad magic":    func(b []byte) []byte { b[0] ^= 1; return b },
		"flipped byte": func(b []byte) []byte { b[len(b)-1] ^= 0x40; return b },
		"extra bytes":  func(b []byte) []byte { return append(b, 'x') },
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			c := kernelCache{dir: t.TempDir()}
			if err := c.store("k", bin); err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(c.path("k"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(c.path("k"), spoil(raw), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, ok := c.load("k"); ok {
				t.Fatal("a corrupt entry was accepted")
			}
			calls := 0
			b, hit, serr, err := c.get("k", countingCompile(bin, &calls))
			if err != nil || serr != nil || hit || calls != 1 || !bytes.Equal(b, bin) {
				t.Fatalf("rebuild: hit %v calls %d store %v err %v", hit, calls, serr, err)
			}
			if got, ok := c.load("k"); !ok || !bytes.Equal(got, bin) {
				t.Fatal("the rebuilt entry was not written back")
			}
		})
	}
}

func TestKernelCacheDisabledAndEnv(t *testing.T) {
	for _, v := range []string{"off", "0", "false", "OFF"} {
		t.Setenv(EnvKernelCache, v)
		if c := kernelCacheFromEnv(); c.dir != "" {
			t.Errorf("%s=%s: cache folder %q, want disabled", EnvKernelCache, v, c.dir)
		}
	}
	dir := t.TempDir()
	t.Setenv(EnvKernelCache, dir)
	if c := kernelCacheFromEnv(); c.dir != dir {
		t.Errorf("%s=%s: cache folder %q", EnvKernelCache, dir, c.dir)
	}
	t.Setenv(EnvKernelCache, "")
	t.Setenv("XDG_CACHE_HOME", dir)
	if c := kernelCacheFromEnv(); c.dir != filepath.Join(dir, "strata", "kernels") {
		t.Errorf("default cache folder %q", c.dir)
	}
	// Disabled: every get compiles, nothing is written.
	c := kernelCache{}
	calls := 0
	for range 2 {
		if _, hit, _, err := c.get("k", countingCompile([]byte("m"), &calls)); err != nil || hit {
			t.Fatalf("disabled cache: hit %v err %v", hit, err)
		}
	}
	if calls != 2 {
		t.Errorf("disabled cache compiled %d times, want 2", calls)
	}
}

// TestCubinForCacheWarmStart: a second process (a fresh in-memory map) with
// the same source, options, architecture and versions compiles nothing; a
// different driver version compiles again.
func TestCubinForCacheWarmStart(t *testing.T) {
	c := kernelCache{dir: t.TempDir()}
	reset := func() {
		cubinMu.Lock()
		cubins = map[string][]byte{}
		cubinMu.Unlock()
	}
	t.Cleanup(reset)
	calls := 0
	compile := countingCompile([]byte("cubin sm_90"), &calls)
	reset()
	if _, err := cubinForCache(c, "13.0", 13000, 9, 0, compile); err != nil {
		t.Fatal(err)
	}
	reset() // a new process
	hits := kernelCacheHits
	b, err := cubinForCache(c, "13.0", 13000, 9, 0, compile)
	if err != nil || calls != 1 || kernelCacheHits != hits+1 || string(b) != "cubin sm_90" {
		t.Fatalf("warm start: calls %d hits %d->%d err %v", calls, hits, kernelCacheHits, err)
	}
	if _, err := cubinForCache(c, "13.0", 13010, 9, 0, compile); err != nil || calls != 2 {
		t.Fatalf("a new driver must recompile: calls %d err %v", calls, err)
	}
}

func TestKernelCacheStatus(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvKernelCache, dir)
	cubinMu.Lock()
	saved, hits := cubins, kernelCacheHits
	cubins, kernelCacheHits = map[string][]byte{"a": nil, "b": nil}, 1
	cubinMu.Unlock()
	t.Cleanup(func() {
		cubinMu.Lock()
		cubins, kernelCacheHits = saved, hits
		cubinMu.Unlock()
	})
	if got, want := kernelCacheStatus(), "kernel cache "+dir+": 1 of 2 modules read from it"; got != want {
		t.Errorf("status %q, want %q", got, want)
	}
	t.Setenv(EnvKernelCache, "off")
	if got := kernelCacheStatus(); !strings.HasPrefix(got, "kernel cache off") {
		t.Errorf("status when off: %q", got)
	}
}
