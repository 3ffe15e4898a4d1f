package nvme

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ProbeDirectIO says whether the filesystem of dir does direct I/O: it
// creates a file there, opens it with O_DIRECT, writes one aligned block
// through the pread engine and removes it. nil: it does. An error matching
// ErrNoDirectIO: the filesystem refuses it (tmpfs and some FUSE at the
// open, others with EINVAL on a write whose buffer, offset and length are
// all aligned). Any other error is its own cause (no such directory, no
// permission, a full disk): not a missing O_DIRECT.
func ProbeDirectIO(dir string) error {
	tmp, err := os.CreateTemp(dir, "strata-probe-")
	if err != nil {
		return fmt.Errorf("nvme: probe %s: %w", dir, err)
	}
	name := tmp.Name()
	tmp.Close()
	defer os.Remove(name)
	f, err := OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	page := int64(os.Getpagesize())
	n := int((f.Alignment() + page - 1) / page * page) // mmap's addresses are page-aligned
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("nvme: probe %s: buffer: %w", dir, err)
	}
	defer unix.Munmap(buf)
	eng, err := Open(Options{Engine: EnginePread, QueueDepth: 1})
	if err != nil {
		return err
	}
	defer eng.Close()
	if err := eng.WriteAt(f, buf, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("nvme: probe %s: aligned write of %d bytes refused: %w: %w", dir, n, ErrNoDirectIO, inner{err})
		}
		return err
	}
	return nil
}
