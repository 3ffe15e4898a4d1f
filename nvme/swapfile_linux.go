package nvme

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// lockSwap takes the exclusive lock that says a run is using the file. The
// lock is the open file's (flock), so it goes with the last close, or the
// death of the process, never to a stale holder.
func lockSwap(f *File) error {
	err := unix.Flock(f.fd, unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return nil
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("nvme: swap file %s: %w (%s): a swap file with a fixed name (SwapOptions.FileName) serves one run: give this run another name or path, or stop the other run", f.path, ErrSwapInUse, lockHolder(f.fd))
	}
	return fmt.Errorf("nvme: lock swap file %s: %w", f.path, err)
}

// lockHolder names the process that holds the flock of fd's file, from
// /proc/locks ("1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF").
func lockHolder(fd int) string {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return "holder unknown"
	}
	fh, err := os.Open("/proc/locks")
	if err != nil {
		return "holder unknown"
	}
	defer fh.Close()
	want := ":" + strconv.FormatUint(st.Ino, 10)
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 6 && f[1] == "FLOCK" && strings.HasSuffix(f[5], want) {
			return "held by pid " + f[4]
		}
	}
	return "holder unknown"
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
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
			unix.Close(fd) // a live run holds it
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			sf := StaleFile{Path: name, SizeBytes: st.Blocks * 512, ModTime: time.Unix(st.Mtim.Unix())}
			if remove {
				if err := os.Remove(name); err != nil && !os.IsNotExist(err) {
					errs = append(errs, fmt.Errorf("nvme: remove stale swap file %s: %w", name, err))
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
