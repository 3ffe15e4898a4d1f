package nvme

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

const tmpfsMagic = 0x01021994

// File is a file opened with O_DIRECT and the alignment its I/O needs.
type File struct {
	path        string
	fd          int
	memAlign    int64 // buffer address alignment
	offsetAlign int64 // file offset and length alignment
	alignSource string

	mu     sync.Mutex
	closed bool
}

// Path is the file's name as given to OpenFile.
func (f *File) Path() string { return f.path }

// Fd is the file descriptor (valid until Close).
func (f *File) Fd() int { return f.fd }

// Alignment is the multiple that buffer addresses, offsets and lengths must
// respect: the larger of the memory and offset alignment.
func (f *File) Alignment() int64 { return max(f.memAlign, f.offsetAlign) }

// AlignmentSource says where the alignment came from (statx or the device).
func (f *File) AlignmentSource() string { return f.alignSource }

// OpenFile opens path with O_DIRECT. flag is os.O_RDONLY, os.O_RDWR, maybe
// with os.O_CREATE. It refuses tmpfs (no direct I/O: it would measure and
// store in RAM) and says so.
func OpenFile(path string, flag int, perm os.FileMode) (*File, error) {
	dir := path
	if flag&os.O_CREATE != 0 {
		if i := strings.LastIndexByte(path, '/'); i > 0 {
			dir = path[:i]
		} else if i < 0 {
			dir = "."
		}
	}
	if err := checkDirectIOFS(dir); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, flag|unix.O_DIRECT|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil, fmt.Errorf("nvme: open %s: path does not exist: %w", path, err)
		case errors.Is(err, unix.EINVAL):
			return nil, fmt.Errorf("nvme: open %s: %w: %w", path, ErrNoDirectIO, err)
		}
		return nil, fmt.Errorf("nvme: open %s: %w", path, err)
	}
	f := &File{path: path, fd: fd}
	f.memAlign, f.offsetAlign, f.alignSource = alignment(fd)
	return f, nil
}

// checkDirectIOFS refuses filesystems where O_DIRECT is not direct I/O.
func checkDirectIOFS(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("nvme: %s: path does not exist: %w", path, err)
		}
		return fmt.Errorf("nvme: statfs %s: %w", path, err)
	}
	if st.Type == tmpfsMagic {
		return fmt.Errorf("nvme: %s is on tmpfs (memory, no block device): %w; use a path on an NVMe filesystem such as ext4 or xfs", path, ErrNoDirectIO)
	}
	return nil
}

// alignment asks statx for the direct-I/O alignment (Linux 6.1+), else the
// logical block size of the device under the file, else 4096 (a multiple of
// every logical block size in use).
func alignment(fd int) (memAlign, offsetAlign int64, source string) {
	var stx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx)
	if err == nil && stx.Mask&unix.STATX_DIOALIGN != 0 && stx.Dio_offset_align > 0 {
		return int64(max(stx.Dio_mem_align, 1)), int64(stx.Dio_offset_align), "statx STATX_DIOALIGN"
	}
	if err == nil {
		if n := logicalBlockSize(stx.Dev_major, stx.Dev_minor); n > 0 {
			return n, n, fmt.Sprintf("logical block size of device %d:%d", stx.Dev_major, stx.Dev_minor)
		}
	}
	return 4096, 4096, "default (device block size unknown)"
}

// logicalBlockSize reads queue/logical_block_size of a block device (or of
// the disk holding a partition) from sysfs; the same number BLKSSZGET returns.
func logicalBlockSize(major, minor uint32) int64 {
	base := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	for _, p := range []string{base + "/queue/logical_block_size", base + "/../queue/logical_block_size"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 0
}

// Size is the file's current size in bytes.
func (f *File) Size() (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return 0, fmt.Errorf("nvme: stat %s: %w", f.path, err)
	}
	return st.Size, nil
}

// Allocate preallocates [0, size) with fallocate (no holes, no zero-fill
// writes later).
func (f *File) Allocate(size int64) error {
	for {
		err := unix.Fallocate(f.fd, 0, 0, size)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOSPC) {
			return fmt.Errorf("nvme: fallocate %s to %d bytes: %w: %w", f.path, size, ErrNoSpace, err)
		}
		if err != nil {
			return fmt.Errorf("nvme: fallocate %s to %d bytes: %w", f.path, size, err)
		}
		return nil
	}
}

// Close closes the file; requests on it must have completed.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if err := unix.Close(f.fd); err != nil {
		return fmt.Errorf("nvme: close %s: %w", f.path, err)
	}
	return nil
}

// FreeBytes is the space an unprivileged writer may still use on the
// filesystem holding path (statfs f_bavail × f_bsize).
func FreeBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, fmt.Errorf("nvme: %s: path does not exist: %w", path, err)
		}
		return 0, fmt.Errorf("nvme: statfs %s: %w", path, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

func bufAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
