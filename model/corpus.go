package model

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Corpus is a training text of token ids, read in windows: the Sampler
// reads the seq+1 tokens of each row it draws and keeps nothing else.
// Tokens holds a corpus in memory; FileCorpus reads one from a file, one
// token per byte, so a corpus larger than RAM trains with memory that does
// not grow with it.
type Corpus interface {
	// Len is the number of tokens.
	Len() int64
	// Read fills dst with tokens off .. off+len(dst)-1. It may be called
	// from several goroutines at once.
	Read(off int64, dst []int32) error
}

// Tokens is a corpus held in memory (model.Encode of a text).
type Tokens []int32

// Len is the number of tokens.
func (t Tokens) Len() int64 { return int64(len(t)) }

// Read copies tokens off .. off+len(dst)-1 into dst.
func (t Tokens) Read(off int64, dst []int32) error {
	if off < 0 || off > int64(len(t)) || int64(len(dst)) > int64(len(t))-off {
		return fmt.Errorf("model: read %d tokens at %d of a corpus of %d", len(dst), off, len(t))
	}
	copy(dst, t[off:])
	return nil
}

// FileCorpus is a regular file read as byte-level tokens (token i is byte
// i, as Encode makes them), a window at a time with pread: nothing is kept
// per byte of the file, so memory does not depend on its size. Read is
// safe from several goroutines; Close once when done.
type FileCorpus struct {
	f    *os.File
	path string
	size int64
}

// ErrNotRegular says a data file is not a regular file (a device, a pipe,
// a directory), whose size is unknown, so windows cannot be drawn from it.
var ErrNotRegular = errors.New("not a regular file")

// OpenCorpus opens the regular file at path as a corpus of its bytes.
// Anything else is refused with an error wrapping ErrNotRegular that names
// the file and what it is: a device such as /dev/zero has no size to draw
// windows from, and a pipe could be read only once.
func OpenCorpus(path string) (*FileCorpus, error) {
	// Stat first: opening a named pipe would block until a writer came.
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("model: data: %w", err)
	}
	if err := regular(path, fi); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: data: %w", err)
	}
	if fi, err = f.Stat(); err == nil {
		err = regular(path, fi) // the path may have changed since the Stat
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &FileCorpus{f: f, path: path, size: fi.Size()}, nil
}

// regular refuses what is not a regular file, saying what it is.
func regular(path string, fi fs.FileInfo) error {
	what := FileKind(fi.Mode())
	if what == "" {
		return nil
	}
	return fmt.Errorf("model: data %s: %w (%s): training draws windows at random offsets and needs a file of known size; give a regular file", path, ErrNotRegular, what)
}

// Path is the file's path as given to OpenCorpus.
func (c *FileCorpus) Path() string { return c.path }

// Len is the file's size in bytes (tokens), taken when it was opened.
func (c *FileCorpus) Len() int64 { return c.size }

// Read reads bytes off .. off+len(dst)-1 of the file (one pread, a short
// read retried) and widens each to a token. An I/O error, or a file that
// shrank since it was opened, is an error naming the file and the offset.
func (c *FileCorpus) Read(off int64, dst []int32) error {
	buf := make([]byte, len(dst))
	if _, err := c.f.ReadAt(buf, off); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the file ended before the window did
		}
		return fmt.Errorf("model: data %s: read %d bytes at offset %d: %w", c.path, len(buf), off, err)
	}
	for i, b := range buf {
		dst[i] = int32(b)
	}
	return nil
}

// Close closes the file.
func (c *FileCorpus) Close() error { return c.f.Close() }

// FileKind names what a file of mode m is when it is not a regular file
// ("a directory", "a named pipe", ...), and is "" for a regular file: the
// words of the errors that refuse a data file that cannot be read at
// random offsets.
func FileKind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return ""
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file"
}
