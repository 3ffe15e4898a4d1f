//go:build linux

package nvme

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// alignedBuf maps n bytes of page-aligned anonymous memory outside the Go
// heap, as pinned does in production.
func alignedBuf(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// diskDir is a temporary directory on a filesystem that does direct I/O: the
// test's own, else one under /var/tmp. It skips only when neither does
// (ErrNoDirectIO); any other probe error fails the test.
func diskDir(t testing.TB) string {
	t.Helper()
	var why []string
	for _, parent := range []string{"", "/var/tmp"} {
		d := t.TempDir()
		if parent != "" {
			var err error
			if d, err = os.MkdirTemp(parent, "nvme-test-"); err != nil {
				why = append(why, err.Error())
				continue
			}
			t.Cleanup(func() { os.RemoveAll(d) })
		}
		err := ProbeDirectIO(d)
		if err == nil {
			return d
		}
		if !errors.Is(err, ErrNoDirectIO) {
			t.Fatalf("probing O_DIRECT in %s: %v", d, err)
		}
		why = append(why, err.Error())
	}
	t.Skipf("no directory here does direct I/O: %s", strings.Join(why, "; "))
	return ""
}

func openEngine(t *testing.T, kind string, qd int) *Engine {
	t.Helper()
	e, err := Open(Options{Engine: kind, QueueDepth: qd})
	skipWithoutUring(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func openFile(t *testing.T, dir, name string, size int64) *File {
	t.Helper()
	f, err := OpenFile(dir+"/"+name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if size > 0 {
		if err := f.Allocate(size); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// writeUnits writes n units of unit bytes of src to f (unit i at offset
// i × unit) in one Submit and waits for them.
func writeUnits(t *testing.T, e *Engine, f *File, src []byte, unit, n int) {
	t.Helper()
	var c Completion
	reqs := make([]*Request, n)
	for i := range reqs {
		reqs[i] = &Request{Op: OpWrite, File: f, Buf: src[i*unit : (i+1)*unit], Offset: int64(i * unit), Wait: &c}
	}
	if err := e.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
}

func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

var engines = []string{EngineUring, EnginePread}

// skipWithoutUring skips when io_uring itself is unavailable here (seccomp,
// kernel.io_uring_disabled, an old kernel): a missing kernel feature, not a
// failure of this package. The pread variants of the same tests still run.
func skipWithoutUring(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) {
		t.Skipf("io_uring unavailable: %v", err)
	}
}
