package cmd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/strata-ai/strata/nvme"
)

// nvmeTestDir is a new directory on a filesystem that does direct I/O: under
// the test's temporary directory, else (when that is tmpfs) under /var/tmp,
// removed at the end. Each candidate is probed with an aligned O_DIRECT open
// and write. The test skips, saying why, only when no candidate does direct
// I/O; any other failure of the probe fails it, and so does every error of
// the run that follows (an alignment bug is not a missing O_DIRECT).
func nvmeTestDir(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("O_DIRECT and io_uring are Linux interfaces")
	}
	var refused []string
	for _, parent := range []string{"", "/var/tmp"} {
		d := t.TempDir()
		if parent != "" {
			var err error
			if d, err = os.MkdirTemp(parent, "strata-cmd-test-"); err != nil {
				refused = append(refused, err.Error())
				continue
			}
			t.Cleanup(func() { os.RemoveAll(d) })
		}
		err := probeDirectIO(d)
		if err == nil {
			return d
		}
		if !errors.Is(err, nvme.ErrNoDirectIO) {
			t.Fatalf("probe O_DIRECT in %s: %v", d, err)
		}
		refused = append(refused, err.Error())
	}
	t.Skipf("no directory here does direct I/O: %s", strings.Join(refused, "; "))
	return ""
}

// probeDirectIO opens a file in dir with O_DIRECT and writes one aligned
// block to it: nil when the filesystem does direct I/O, an error matching
// nvme.ErrNoDirectIO when it refuses it (at the open, or with EINVAL on a
// write whose buffer, offset and length are all aligned).
func probeDirectIO(dir string) error {
	name := filepath.Join(dir, "odirect-probe")
	f, err := nvme.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(name)
	defer f.Close()
	eng, err := nvme.Open(nvme.Options{Engine: nvme.EnginePread, QueueDepth: 1})
	if err != nil {
		return err
	}
	defer eng.Close()
	// One block at an aligned address inside a Go slice (the heap does not
	// move: the kernel may read it in place).
	n := f.Alignment()
	mem := make([]byte, 2*n)
	skip := (n - int64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))%n) % n
	buf := mem[skip : skip+n]
	if err := eng.WriteAt(f, buf, 0); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("%w: aligned write of %d bytes to %s: %w", nvme.ErrNoDirectIO, n, name, err)
		}
		return err
	}
	return nil
}
