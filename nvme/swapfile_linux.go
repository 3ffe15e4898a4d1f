package nvme

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/strata-ai/strata/internal/flock"
	"golang.org/x/sys/unix"
)

// lockSwap takes the exclusive lock that says a run is using the file
// (internal/flock: it goes with the last close or the process).
func lockSwap(f *File) error {
	err := flock.TryLock(f.fd)
	if errors.Is(err, flock.ErrHeld) {
		return fmt.Errorf("nvme: swap file %s: %w (%w): a swap file with a fixed name (SwapOptions.FileName) serves one run: give this run another name or path, or stop the other run", f.path, ErrSwapInUse, err)
	}
	if err != nil {
		return fmt.Errorf("nvme: lock swap file %s: %w", f.path, err)
	}
	return nil
}

func staleSwapFiles(dir string, remove bool) ([]StaleFile, error) {
	names, err := swapCandidates(dir)
	if err != nil {
		return nil, err
	}
	var out []StaleFile
	var errs []error
	for _, name := range names {
		fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			// Gone meanwhile (its run closed), or another user's (not ours
			// to report or remove): skipped.
			if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) {
				errs = append(errs, fmt.Errorf("nvme: open swap file %s: %w", name, err))
			}
			continue
		}
		if flock.TryLock(fd) != nil && !lockAfterDeadRun(fd, name) {
			unix.Close(fd) // a live run holds it
			continue
		}
		// Locked: no run holds this file. The name must still be it: a
		// run that closed while this opened it removed the name first
		// (and a new file may have taken it since).
		var st, now unix.Stat_t
		if unix.Fstat(fd, &st) != nil || unix.Lstat(name, &now) != nil || now.Dev != st.Dev || now.Ino != st.Ino {
			unix.Close(fd)
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			sf := StaleFile{Path: name, SizeBytes: st.Blocks * 512, ModTime: time.Unix(st.Mtim.Unix())}
			if remove {
				if err := os.Remove(name); err != nil {
					if !os.IsNotExist(err) {
						errs = append(errs, fmt.Errorf("nvme: remove stale swap file %s: %w", name, err))
					}
					sf.Path = ""
				}
			}
			if sf.Path != "" {
				out = append(out, sf)
			}
		}
		unix.Close(fd) // releases the lock
	}
	return out, errors.Join(errs...)
}

// deadRunLockWait bounds how long lockAfterDeadRun waits for the lock of a
// swap file whose run is gone.
const deadRunLockWait = 5 * time.Second

// lockAfterDeadRun takes the lock of a swap file whose run (the pid in its
// name) no longer exists but whose lock is still held: the kernel keeps a
// killed run's io_uring, and the files it registered, open until the
// ring's deferred teardown finishes, so the lock outlives the process for
// a moment (a crash loop's next run met it: the file it had to remove was
// "last written 0s ago"). It polls until the lock is free or
// deadRunLockWait has passed. A run that is alive is never waited for.
func lockAfterDeadRun(fd int, name string) bool {
	var pid int
	if _, err := fmt.Sscanf(filepath.Base(name), "strata-%d-", &pid); err != nil || pid <= 0 || pid == os.Getpid() {
		return false
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		return false // alive (or not ours to signal): its run may hold the file
	}
	for deadline := time.Now().Add(deadRunLockWait); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if flock.TryLock(fd) == nil {
			return true
		}
	}
	return false
}
