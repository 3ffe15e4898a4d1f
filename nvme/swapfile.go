package nvme

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/strata-ai/strata/internal/units"
)

// ErrSwapInUse: a swap file is locked by another live run (or another
// Swap of this one). Match with errors.Is.
var ErrSwapInUse = errors.New("swap file in use by another run")

// SwapFileGlob matches the swap files NewSwap creates (one per run and path,
// "strata-<pid>-<random>.swap") and the single "strata.swap" of earlier
// versions.
const SwapFileGlob = "strata-*.swap"

const legacySwapFileName = "strata.swap"

// newSwapFileName is a name no other run uses: the pid says who made it (for
// a person reading a directory), the random part keeps two Swaps of one
// process, or a reused pid, apart.
func newSwapFileName() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("nvme: crypto/rand: %v", err)) // never fails on Linux
	}
	return fmt.Sprintf("strata-%d-%s.swap", os.Getpid(), hex.EncodeToString(b[:]))
}

// StaleFile is a swap file that no live run holds: its run was killed
// (kill -9, a crash, power loss) before it could remove it. Nothing reads
// it again; removing it reclaims its space (RemoveStaleSwapFiles, or rm).
type StaleFile struct {
	Path      string
	SizeBytes int64 // allocated on disk
	ModTime   time.Time
}

func (s StaleFile) String() string {
	return fmt.Sprintf("%s (%d bytes, last written %s ago)", s.Path, s.SizeBytes, time.Since(s.ModTime).Round(time.Second))
}

// ResolvePath is a directory's one true name: absolute, symlinks followed.
// Two spellings of one directory ("/x", "/x/", "x" from /, a symlink to it)
// resolve to the same string.
func ResolvePath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("nvme: swap path %s: %w", p, err)
	}
	r, err := filepath.EvalSymlinks(abs)
	if err != nil {
		if os.IsNotExist(err) {
			return "", fmt.Errorf("nvme: swap path %s does not exist", p)
		}
		return "", fmt.Errorf("nvme: swap path %s: %w", p, err)
	}
	return r, nil
}

// candidates lists dir's swap files (this version's and the legacy name).
func swapCandidates(dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, SwapFileGlob))
	if err != nil {
		return nil, fmt.Errorf("nvme: list swap files in %s: %w", dir, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, legacySwapFileName)); err == nil {
		names = append(names, filepath.Join(dir, legacySwapFileName))
	}
	return names, nil
}

// StaleSwapFiles lists the swap files in dir that no live run holds (their
// lock is free). A file a live run holds is never listed, nor one this
// process may not open (another user's).
func StaleSwapFiles(dir string) ([]StaleFile, error) {
	return staleSwapFiles(dir, false)
}

// RemoveStaleSwapFiles removes the swap files in dir that no live run holds,
// each while holding its lock (so a run cannot be using it), and returns
// what it removed.
func RemoveStaleSwapFiles(dir string) ([]StaleFile, error) {
	return staleSwapFiles(dir, true)
}

// ReclaimStaleSwapFiles removes the swap files of killed runs on each of
// paths (RemoveStaleSwapFiles) and says what each path got back: a note
// per path that had any, and one per path whose stale files stayed.
func ReclaimStaleSwapFiles(paths []string) (notes []string) {
	for _, p := range paths {
		removed, err := RemoveStaleSwapFiles(p)
		if len(removed) > 0 {
			var b int64
			for _, f := range removed {
				b += f.SizeBytes
			}
			notes = append(notes, fmt.Sprintf("nvme_path %s: removed %d stale swap files of killed runs (no live process held their lock), reclaimed %s (%d bytes)",
				p, len(removed), units.FormatBytes(b), b))
		}
		if err != nil {
			notes = append(notes, fmt.Sprintf("nvme_path %s: stale swap files left: %v", p, err))
		}
	}
	return notes
}
