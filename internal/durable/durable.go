// Package durable writes files that survive a crash: each is fsynced before
// it is named, and the directory that names it after.
//
// # Guarantees
//
// WriteFile replaces a file atomically (a temporary file beside it,
// fsync, rename, fsync of the directory): a reader sees the old file or the
// new one, never a part. Create and Copy write a new file and fsync it; the
// caller fsyncs the directory (SyncDir) once it holds everything.
package durable

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// WriteFile writes path atomically from fill, through a buffer of bufBytes:
// a temporary file in the same directory, fsync, rename, fsync of the
// directory. On an error the temporary file is removed. The temporary
// is .NAME.tmp-PID-* (TempPattern), flocked while it is written, so that
// RemoveStale can prove one a killed writer left dead. The file is 0644
// less the umask, as os.WriteFile and Create make theirs (os.CreateTemp's
// 0600 would leave a run's weights unreadable to the group beside its
// 0644 files).
func WriteFile(path string, bufBytes int, fill func(io.Writer) error) error {
	dir := filepath.Dir(path)
	f, err := createTemp(dir, TempPattern(filepath.Base(path)), 0o644)
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := LockTemp(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	bw := bufio.NewWriterSize(tempWriter{f}, bufBytes)
	if err := fill(bw); err != nil {
		return fail(err)
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(bare(err))
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, bare(err))
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(dir)
}

// createTemp is os.CreateTemp with the permissions perm (less the umask)
// instead of 0600: a new file dir/PREFIX RANDOM SUFFIX for pattern
// PREFIX*SUFFIX, opened for writing.
func createTemp(dir, pattern string, perm fs.FileMode) (*os.File, error) {
	prefix, suffix, _ := strings.Cut(pattern, "*")
	for try := 0; ; try++ {
		name := filepath.Join(dir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10)+suffix)
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
		if errors.Is(err, fs.ErrExist) && try < 10000 {
			continue
		}
		return f, err
	}
}

// tempWriter writes WriteFile's temporary file; its errors leave out the
// temporary's name, which WriteFile removes (its error names the file
// being written: "write F: no space left on device", once).
type tempWriter struct{ f *os.File }

func (w tempWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	return n, bare(err)
}

// bare is an *fs.PathError's error without its path ("sync: EIO").
func bare(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		if pe.Op == "write" {
			return pe.Err
		}
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// SyncDir fsyncs the directory dir, so that the names it holds survive a
// crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// Create writes b to a new file at path (it must not exist) and fsyncs it.
func Create(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, bare(err))
	}
	return nil
}

// Copy copies the file src to dst and fsyncs it; on an error it removes
// dst, so no partial copy is left behind.
func Copy(dst, src string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(dst)
		}
	}()
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
