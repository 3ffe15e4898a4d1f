package nvme

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProbeDirectIO: a disk directory does direct I/O and the probe leaves
// nothing behind; tmpfs is refused with ErrNoDirectIO; a missing directory
// is its own error, not a missing O_DIRECT (a test that skipped on it
// would hide a wrong path).
func TestProbeDirectIO(t *testing.T) {
	d := diskDir(t)
	if err := ProbeDirectIO(d); err != nil {
		t.Fatalf("probe %s: %v", d, err)
	}
	if left, _ := os.ReadDir(d); len(left) != 0 {
		t.Fatalf("probe left %d files in %s", len(left), d)
	}
	missing := filepath.Join(d, "missing")
	if err := ProbeDirectIO(missing); err == nil || errors.Is(err, ErrNoDirectIO) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("probe of a missing directory: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Log("no tmpfs at /dev/shm: the refusal is not checked")
		return
	}
	shm, err := os.MkdirTemp("/dev/shm", "nvme-probe-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	if err := ProbeDirectIO(shm); !errors.Is(err, ErrNoDirectIO) {
		t.Fatalf("probe of tmpfs: %v, want ErrNoDirectIO", err)
	}
}
