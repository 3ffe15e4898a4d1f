package nvme

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

var (
	// ErrMisaligned: a buffer address, offset or length is not a multiple of
	// the alignment O_DIRECT needs. Nothing was sent to the kernel.
	ErrMisaligned = errors.New("misaligned for O_DIRECT")
	// ErrClosed: the engine or swap is closed.
	ErrClosed = errors.New("closed")
	// ErrNoSpace: a size larger than the free space was refused before writing.
	ErrNoSpace = errors.New("not enough free space")
	// ErrNoDirectIO: the filesystem does not do direct I/O (tmpfs, some FUSE).
	ErrNoDirectIO = errors.New("filesystem does not support O_DIRECT")
	// ErrCorrupt matches every *CorruptionError.
	ErrCorrupt = errors.New("checksum mismatch")
	// ErrNoData: an extent read before a successful write (or after a failed one).
	ErrNoData = errors.New("extent holds no valid data")
)

// IOError is a failed request: which operation, file, offset and length, how
// many bytes had been transferred, and the cause (an errno, io.ErrUnexpectedEOF,
// io.ErrShortWrite, ErrMisaligned ...).
type IOError struct {
	Op        Op
	Path      string
	Offset    int64
	Length    int
	DoneBytes int // bytes transferred before the failure; the rest is lost
	Hint      string
	Err       error
}

func (e *IOError) Error() string {
	s := fmt.Sprintf("nvme: %s %s at offset %d length %d", e.Op, e.Path, e.Offset, e.Length)
	if e.DoneBytes > 0 {
		s += fmt.Sprintf(" (%d bytes done, %d lost)", e.DoneBytes, e.Length-e.DoneBytes)
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s + ": " + e.Err.Error()
}

func (e *IOError) Unwrap() error { return e.Err }

// CorruptionError is a stripe unit of an extent whose CRC-32C does not match
// what was recorded when it was written: the data at that place is lost.
type CorruptionError struct {
	Extent    uint64
	Path      string
	Offset    int64 // in the file
	Length    int64
	Want, Got uint32
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("nvme: extent %d: %s at offset %d length %d: crc32c %08x, want %08x: data lost",
		e.Extent, e.Path, e.Offset, e.Length, e.Got, e.Want)
}

func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }

// errnoHint adds the likely cause to errnos whose meaning depends on context.
func errnoHint(errno syscall.Errno) string {
	switch errno {
	case syscall.EINVAL:
		return "probable misalignment for O_DIRECT, or the filesystem refuses direct I/O"
	case syscall.ENOSPC:
		return "the filesystem is full"
	case syscall.ECANCELED:
		return "the request was cancelled"
	}
	return ""
}

// inner is an error of this package wrapped in another of its errors (a
// request's IOError inside a swap extent's): it prints without its own
// "nvme: " prefix, on every line of a joined error, so the chain names the
// package once. errors.Is and errors.As see through it.
type inner struct{ err error }

func (i inner) Error() string {
	return strings.ReplaceAll(strings.TrimPrefix(i.err.Error(), "nvme: "), "\nnvme: ", "\n")
}

func (i inner) Unwrap() error { return i.err }
