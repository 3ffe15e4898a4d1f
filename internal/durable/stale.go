package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/internal/flock"
)

// A temporary beside a file or directory NAME is .NAME.tmp-PID-RANDOM: PID
// is its writer's process, which holds a flock on it while it writes
// (WriteFile's file; hf's export directory). A writer killed mid-write
// (SIGKILL, a crash, the machine's power) leaves it; RemoveStale removes
// the ones whose writer is provably gone.

// TempPattern is the os.CreateTemp / os.MkdirTemp pattern of a temporary
// of base (a file or directory name) written by this process.
func TempPattern(base string) string {
	return "." + base + ".tmp-" + strconv.Itoa(os.Getpid()) + "-*"
}

// LockTemp takes the flock that says f (a temporary of TempPattern, file
// or directory) is being written; it goes with f's close or this
// process's death. Where there is no flock it does nothing (RemoveStale
// then removes nothing).
func LockTemp(f *os.File) error {
	if err := flock.TryLock(int(f.Fd())); err != nil && !errors.Is(err, flock.ErrNotSupported) {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return nil
}

// RemoveStale removes the temporaries of base in dir (.base.tmp-PID-*)
// that a killed writer left: those whose PID is not a live process and
// whose flock nobody holds. Both must hold: the pid alone could be another
// pid namespace's (a container sharing the disk), the free lock alone
// could be a writer between its create and its lock, or one that closed
// and is renaming. A temporary without a pid (an older Strata's) is left
// alone: nothing proves it dead. It returns one line per removal, to
// print.
func RemoveStale(dir, base string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	prefix := "." + base + ".tmp-"
	var removed []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !(e.IsDir() || e.Type().IsRegular()) {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || pidAlive(pid) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.OpenFile(path, os.O_RDONLY|openTempFlags, 0)
		if err != nil {
			continue // gone meanwhile, or not ours to open
		}
		if flock.TryLock(int(f.Fd())) != nil { // held, or no flock here: not provably dead
			f.Close()
			continue
		}
		err = os.RemoveAll(path)
		f.Close()
		if err != nil {
			return removed, fmt.Errorf("remove the stale temporary %s: %w", path, err)
		}
		what := "file"
		if e.IsDir() {
			what = "directory"
		}
		removed = append(removed, fmt.Sprintf("removed %s, the temporary %s of a write by process %d, which is gone (killed mid-write)", path, what, pid))
	}
	if len(removed) > 0 {
		if err := SyncDir(dir); err != nil {
			return removed, err
		}
	}
	return removed, nil
}
