//go:build !linux

package nvme

import (
	"errors"
	"os"
	"unsafe"
)

// errNotLinux: O_DIRECT, statx and io_uring are Linux interfaces.
var errNotLinux = errors.New("nvme: direct I/O is implemented for Linux only")

// File is a file opened for direct I/O (Linux only).
type File struct {
	path        string
	fd          int
	memAlign    int64
	offsetAlign int64
	alignSource string
}

func (f *File) Path() string                           { return f.path }
func (f *File) Fd() int                                { return f.fd }
func (f *File) Alignment() int64                       { return max(f.memAlign, f.offsetAlign) }
func (f *File) AlignmentSource() string                { return f.alignSource }
func (f *File) Size() (int64, error)                   { return 0, errNotLinux }
func (f *File) Allocate(int64) error                   { return errNotLinux }
func (f *File) Close() error                           { return nil }
func OpenFile(string, int, os.FileMode) (*File, error) { return nil, errNotLinux }
func FreeBytes(string) (int64, error)                  { return 0, errNotLinux }
func checkDirectIOFS(string) error                     { return errNotLinux }
func bufAddr(b []byte) uintptr                         { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

var uringSetup = func(*Engine) (backend, error) { return nil, errNotLinux }

type preadBackend struct{}

func newPreadBackend(*Engine) *preadBackend            { return &preadBackend{} }
func (b *preadBackend) issue([]int32)                  { panic("nvme: no files can be opened outside Linux") }
func (b *preadBackend) registerBuffers([][]byte) error { return nil }
func (b *preadBackend) registerFiles([]*File) error    { return nil }
func (b *preadBackend) close() error                   { return nil }
