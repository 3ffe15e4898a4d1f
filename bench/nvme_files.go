package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
)

// benchFilePattern names the temporary file made in a directory --path:
// strata-bench-nvme-<pid>-<random>.dat, created with O_EXCL, so that it is
// never a file someone else made (an earlier run's leftover included).
const benchFilePattern = "strata-bench-nvme-*.dat"

// benchTarget is the file a --path names.
type benchTarget struct {
	path      string // as given
	name      string // an existing file; for a directory, the directory
	created   bool   // a directory was given: a temporary file is made there
	sizeBytes int64  // an existing file's size
}

// resolveBenchPaths names the file of each --path and refuses two paths
// that lead to the same place (the same directory spelled twice, links):
// blocks would be counted twice.
func resolveBenchPaths(paths []string) ([]benchTarget, error) {
	var ts []benchTarget
	for _, p := range paths {
		t := benchTarget{path: p, name: p}
		st, err := os.Stat(p)
		switch {
		case err == nil && st.IsDir():
			t.created = true
		case err == nil && !st.Mode().IsRegular():
			return nil, fmt.Errorf("bench: nvme: --path %s is neither a directory nor a regular file", p)
		case err == nil:
			t.sizeBytes = st.Size()
		case os.IsNotExist(err):
			// Never create a file at a mistyped path: it would measure
			// whatever drive holds the parent directory.
			return nil, fmt.Errorf("bench: nvme: --path %s does not exist: give a directory on the drive to test "+
				"(a temporary file is created there and removed) or an existing file", p)
		default:
			return nil, fmt.Errorf("bench: nvme: --path %s: %w", p, err)
		}
		for _, u := range ts {
			if sameFile(u.name, t.name) {
				return nil, fmt.Errorf("bench: nvme: --path %s and --path %s both lead to %s: give each drive once",
					u.path, p, filepath.Clean(t.name))
			}
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// sameFile says whether two names are one file or directory: the same
// cleaned name, or the same inode (links, bind mounts).
func sameFile(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, ea := os.Stat(a)
	sb, eb := os.Stat(b)
	return ea == nil && eb == nil && os.SameFile(sa, sb)
}

// checkExisting refuses to change a file the bench did not create: a write
// run would overwrite it, a read run on a file shorter than --size would
// extend it. --force allows both.
func checkExisting(t benchTarget, opts NVMeOptions) error {
	if t.created || opts.Force {
		return nil
	}
	if opts.RW != "read" && opts.RW != "randread" {
		return fmt.Errorf("bench: nvme: --rw %s would overwrite %s (%s), a file this bench did not create: "+
			"give a directory instead (a temporary file is made there and removed) or --force to overwrite it",
			opts.RW, t.name, units.FormatBytes(t.sizeBytes))
	}
	if t.sizeBytes < opts.SizeBytes {
		most := t.sizeBytes / opts.BlockBytes * opts.BlockBytes
		return fmt.Errorf("bench: nvme: %s holds %s (%d bytes), less than --size %s, and a read run does not extend a file it did not create: "+
			"give --size %d or less, or --force to extend it (the added part is written once)",
			t.name, units.FormatBytes(t.sizeBytes), t.sizeBytes, units.FormatBytes(opts.SizeBytes), most)
	}
	return nil
}

// openBenchFiles opens (or creates) the file of every --path. The files it
// returns, also with an error, are closed by closeBenchFiles, which removes
// the ones it created.
func openBenchFiles(ctx context.Context, eng *nvme.Engine, opts NVMeOptions) (files []benchFile, reclaimed []string, err error) {
	targets, err := resolveBenchPaths(opts.Paths)
	if err != nil {
		return nil, nil, err
	}
	for _, t := range targets {
		if err := checkExisting(t, opts); err != nil {
			return nil, nil, err
		}
	}
	for _, t := range targets {
		dir := filepath.Dir(t.name)
		if t.created {
			dir = t.name
			reclaimed = append(reclaimed, removeDeadBenchFiles(dir)...)
		}
		if need := opts.SizeBytes - t.sizeBytes; need > 0 {
			free, err := nvme.FreeBytes(dir)
			if err != nil {
				return files, reclaimed, fmt.Errorf("bench: %w", err)
			}
			if need > free {
				return files, reclaimed, fmt.Errorf("bench: nvme: %s needs %s more, only %s free on its filesystem: %w",
					t.path, units.FormatBytes(need), units.FormatBytes(free), nvme.ErrNoSpace)
			}
		}
		bf, err := openBenchFile(t, dir, opts)
		if bf.f != nil {
			files = append(files, bf)
		}
		if err != nil {
			return files, reclaimed, err
		}
		if t.sizeBytes < opts.SizeBytes {
			if err := bf.f.Allocate(opts.SizeBytes); err != nil {
				return files, reclaimed, fmt.Errorf("bench: %w", err)
			}
			// Preallocated blocks read as zeros without touching the
			// device; a read workload needs them written once.
			if opts.RW != "write" && opts.RW != "randwrite" {
				if err := fillFile(ctx, eng, bf.f, t.sizeBytes, opts.SizeBytes); err != nil {
					return files, reclaimed, err
				}
			}
		}
	}
	return files, reclaimed, nil
}

// benchFilePrefix starts the names of a run's temporary files, the pid of
// its process next: strata-bench-nvme-PID-RANDOM.dat.
const benchFilePrefix = "strata-bench-nvme-"

// removeDeadBenchFiles removes the temporary files in dir that killed
// runs left (the process of the pid in the name is gone: a kill skips the
// run's own clean-up) and says what it got back, a line, or nothing.
func removeDeadBenchFiles(dir string) []string {
	names, _ := filepath.Glob(filepath.Join(dir, benchFilePrefix+"*.dat"))
	var n int
	var b int64
	for _, name := range names {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(name), benchFilePrefix+"%d-", &pid); err != nil || pid <= 0 || pid == os.Getpid() || !processGone(pid) {
			continue
		}
		if st, err := os.Stat(name); err == nil && os.Remove(name) == nil {
			n, b = n+1, b+st.Size()
		}
	}
	if n == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s: removed %d temporary files of killed bench runs, reclaimed %s", dir, n, units.FormatBytes(b))}
}

// openBenchFile opens an existing file (read-only unless the run may
// change it) or creates a new temporary file in dir with O_EXCL. The
// returned benchFile carries the open file also with an error.
func openBenchFile(t benchTarget, dir string, opts NVMeOptions) (benchFile, error) {
	var bf benchFile
	if t.created {
		for try := 0; ; try++ {
			name := filepath.Join(dir, fmt.Sprintf("%s%d-%08x.dat", benchFilePrefix, os.Getpid(), rand.Uint32()))
			f, err := nvme.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			if err == nil {
				bf = benchFile{f: f, path: name, created: true}
				break
			}
			if !os.IsExist(err) || try == 9 {
				return bf, fmt.Errorf("bench: %w", err)
			}
		}
	} else {
		flag := os.O_RDONLY
		if opts.Force {
			flag = os.O_RDWR
		}
		f, err := nvme.OpenFile(t.name, flag, 0)
		if err != nil {
			return bf, fmt.Errorf("bench: %w", err)
		}
		bf = benchFile{f: f, path: t.name}
	}
	if opts.BlockBytes%bf.f.Alignment() != 0 {
		return bf, fmt.Errorf("bench: nvme: --bs %d is not a multiple of the I/O alignment %d of %s (%s)",
			opts.BlockBytes, bf.f.Alignment(), bf.path, bf.f.AlignmentSource())
	}
	return bf, nil
}

func closeBenchFiles(files []benchFile) {
	for _, f := range files {
		f.f.Close()
		if f.created {
			os.Remove(f.path)
		}
	}
}

// fillFile writes [from, to) with random data, 1 MiB at a time, 16 in
// flight, from huge-page buffers; it stops early when ctx is done.
func fillFile(ctx context.Context, eng *nvme.Engine, f *nvme.File, from, to int64) error {
	const chunk = units.MiB
	// Up, never down: the bytes the file already had are not the bench's
	// to overwrite (O_DIRECT writes whole aligned chunks). The gap up to
	// the first whole MiB stays a hole, read as zeros.
	from = units.AlignUp(from, chunk)
	buf, err := newIOBuffers(16 * chunk)
	if err != nil {
		return err
	}
	defer buf.close()
	mem := buf.mem
	fillRandom(mem, 7)
	for off := from; off < to; {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bench: prepare %s: %w", f.Path(), context.Cause(ctx))
		}
		var c nvme.Completion
		var reqs []*nvme.Request
		for i := 0; i < 16 && off < to; i++ {
			n := min(chunk, to-off)
			reqs = append(reqs, &nvme.Request{Op: nvme.OpWrite, File: f, Buf: mem[int64(i)*chunk : int64(i)*chunk+n], Offset: off, Wait: &c})
			off += n
		}
		if err := eng.Submit(reqs...); err != nil {
			return fmt.Errorf("bench: prepare %s: %w", f.Path(), err)
		}
		if err := c.Wait(); err != nil {
			return fmt.Errorf("bench: prepare %s: %w", f.Path(), err)
		}
	}
	if err := eng.Sync(f); err != nil {
		return fmt.Errorf("bench: prepare %s: %w", f.Path(), err)
	}
	return nil
}
