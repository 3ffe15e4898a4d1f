package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/internal/units"
)

// maxLatestBytes bounds what is read of "latest": it holds one
// checkpoint's name and a newline ("step-00000100\n", 14 bytes; a
// suffixed one a few more), so a file longer than this is not one and is
// refused by its size, never read whole.
const maxLatestBytes = 4 << 10

// latestTooLargeError is a "latest" over maxLatestBytes.
type latestTooLargeError struct {
	path      string
	sizeBytes int64
	prefix    string // its first bytes, for the message
}

func (e *latestTooLargeError) Error() string {
	return fmt.Sprintf("%s is %s (%d bytes), not a checkpoint name (at most %d bytes): it starts %s; it was not written by a save",
		e.path, units.FormatBytes(e.sizeBytes), e.sizeBytes, maxLatestBytes, e.prefix)
}

// quotePrefix is s quoted for a message, cut to its first 40 bytes ("…"
// after the quote when cut).
func quotePrefix(s string) string {
	const n = 40
	if len(s) <= n {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:n]) + "…"
}

// readLatest reads the checkpoint name dir/latest holds (trimmed). It
// reads at most maxLatestBytes: a longer file is a *latestTooLargeError
// naming the file and its size. A missing file matches fs.ErrNotExist; a
// file that is not a regular one (a FIFO's read would wait for a writer)
// is an error without being opened.
func readLatest(dir string) (string, error) {
	path := filepath.Join(dir, latestName)
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLatestBytes+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxLatestBytes {
		size := fi.Size()
		if now, err := f.Stat(); err == nil {
			size = now.Size()
		}
		return "", &latestTooLargeError{path: path, sizeBytes: size, prefix: quotePrefix(string(b))}
	}
	return strings.TrimSpace(string(b)), nil
}

// fallBack is the newest complete checkpoint of dir, for a "latest" that
// could not be read (why: missing or unreadable): its directory and the
// note that says so; ok false when dir holds no complete checkpoint (a
// listed one has a manifest that reads and checks, and every rank file of
// its size).
func fallBack(dir string, why error) (path, note string, ok bool) {
	ls, err := List(dir)
	if err != nil || len(ls.Complete) == 0 {
		return "", "", false
	}
	c := ls.Complete[len(ls.Complete)-1]
	what := "could not be read (" + why.Error() + ")"
	if errors.Is(why, fs.ErrNotExist) {
		what = "is missing"
	}
	path = filepath.Join(dir, c.Name)
	return path, fmt.Sprintf("%s %s; using the newest complete checkpoint beside it, %s (step %d); a save writes %s again",
		filepath.Join(dir, latestName), what, path, c.Step, latestName), true
}
