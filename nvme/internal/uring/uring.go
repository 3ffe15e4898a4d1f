//go:build linux

// Package uring is a thin binding of Linux io_uring over golang.org/x/sys/unix:
// ring setup and mmap, the SQ/CQ head and tail through atomics, SQE
// preparation (read, write, fixed-buffer read and write, fsync), buffer and
// file registration, io_uring_enter with a minimum completion count, and the
// probe of supported operations. It holds no policy: no retries, no queue
// depth accounting, no error mapping. The nvme package builds those on top.
//
// Lifecycle: New maps the rings; Close unmaps them and closes the ring fd.
// A Ring is not safe for concurrent use of the submission side (GetSQE,
// Flush, Submit) nor of the completion side (PeekCQE, Advance) from more than
// one goroutine each; one submitter and one reaper may run at the same time,
// as in liburing.
//
// Memory: the rings are shared with the kernel through mmap, outside the Go
// heap. Buffers named in SQEs are raw addresses; the caller keeps them alive
// and unmoved until their completion is reaped. user_data is an opaque
// integer chosen by the caller (nvme uses a slot index, never a pointer).
package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Opcodes (include/uapi/linux/io_uring.h, enum io_uring_op).
const (
	OpNop        uint8 = 0
	OpFsync      uint8 = 3
	OpReadFixed  uint8 = 4
	OpWriteFixed uint8 = 5
	OpRead       uint8 = 22
	OpWrite      uint8 = 23
	opLast       uint8 = 64
)

// Setup flags (IORING_SETUP_*).
const (
	SetupCQSize       uint32 = 1 << 3
	SetupClamp        uint32 = 1 << 4
	SetupSubmitAll    uint32 = 1 << 7
	SetupCoopTaskrun  uint32 = 1 << 8
	SetupSingleIssuer uint32 = 1 << 12
)

// Features reported by the kernel (IORING_FEAT_*).
const (
	FeatSingleMmap uint32 = 1 << 0
	FeatNoDrop     uint32 = 1 << 1
)

// SQE flags (IOSQE_*) and fsync flags.
const (
	SQEFixedFile  uint8  = 1 << 0
	FsyncDatasync uint32 = 1 << 0
)

const (
	enterGetEvents uint32 = 1 << 0

	offSQRing int64 = 0
	offCQRing int64 = 0x8000000
	offSQEs   int64 = 0x10000000

	regBuffers         = 0
	regUnregisterBufs  = 1
	regFiles           = 2
	regUnregisterFiles = 3
	regRegisterEventfd = 4
	regProbe           = 8

	probeOpSupported = 1 << 0
)

// sqringOffsets mirrors struct io_sqring_offsets.
type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

// cqringOffsets mirrors struct io_cqring_offsets.
type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// params mirrors struct io_uring_params.
type params struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  sqringOffsets
	CqOff                                                                  cqringOffsets
}

// SQE mirrors struct io_uring_sqe (64 bytes).
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IOPrio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32 // rw_flags / fsync_flags
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	_           uint64
}

// CQE mirrors struct io_uring_cqe (16 bytes, no CQE32).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

func init() {
	if unsafe.Sizeof(SQE{}) != 64 || unsafe.Sizeof(CQE{}) != 16 || unsafe.Sizeof(params{}) != 120 {
		panic("uring: struct layout does not match the kernel ABI")
	}
}

// Ring is one io_uring instance with its mapped rings.
type Ring struct {
	fd       int
	features uint32

	sqRing []byte
	cqRing []byte // aliases sqRing with IORING_FEAT_SINGLE_MMAP
	sqeMem []byte

	sqHead  *uint32 // written by the kernel
	sqTail  *uint32 // written by us
	sqMask  uint32
	sqArray []uint32
	sqes    []SQE
	// sqeTail counts SQEs handed out by GetSQE; sqeHead counts those
	// published to the kernel's tail (liburing's sqe_tail / sqe_head).
	sqeTail, sqeHead uint32

	cqHead *uint32 // written by us
	cqTail *uint32 // written by the kernel
	cqMask uint32
	cqes   []CQE

	sqEntries, cqEntries uint32
}

// New sets up a ring with at least entries SQEs (rounded up to a power of two
// by the kernel) and cqEntries CQEs (0: the kernel's default, twice entries).
func New(entries, cqEntries uint32, flags uint32) (*Ring, error) {
	var p params
	p.Flags = flags
	if cqEntries > 0 {
		p.Flags |= SetupCQSize
		p.CqEntries = cqEntries
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), features: p.Features, sqEntries: p.SqEntries, cqEntries: p.CqEntries}
	if err := r.mmap(&p); err != nil {
		unix.Close(r.fd)
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(p *params) error {
	sqSize := int(p.SqOff.Array) + int(p.SqEntries)*4
	cqSize := int(p.CqOff.Cqes) + int(p.CqEntries)*int(unsafe.Sizeof(CQE{}))
	single := p.Features&FeatSingleMmap != 0
	if single && cqSize > sqSize {
		sqSize = cqSize
	}
	var err error
	r.sqRing, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap sq ring: %w", err)
	}
	if single {
		r.cqRing = r.sqRing
	} else {
		r.cqRing, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			unix.Munmap(r.sqRing)
			return fmt.Errorf("mmap cq ring: %w", err)
		}
	}
	sqeSize := int(p.SqEntries) * int(unsafe.Sizeof(SQE{}))
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.unmapRings()
		return fmt.Errorf("mmap sqes: %w", err)
	}
	sq := unsafe.Pointer(&r.sqRing[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.SqOff.Head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.SqOff.Tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.SqOff.RingMask))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Add(sq, p.SqOff.Array)), p.SqEntries)
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqeMem[0])), p.SqEntries)
	cq := unsafe.Pointer(&r.cqRing[0])
	r.cqHead = (*uint32)(unsafe.Add(cq, p.CqOff.Head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.CqOff.Tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.CqOff.RingMask))
	r.cqes = unsafe.Slice((*CQE)(unsafe.Add(cq, p.CqOff.Cqes)), p.CqEntries)
	// The SQ index array is the identity mapping, as liburing sets it up
	// (io_uring_queue_mmap → sq->array[i] = i), so SQE i is slot i of the ring.
	for i := range r.sqArray {
		r.sqArray[i] = uint32(i)
	}
	r.sqeTail = atomic.LoadUint32(r.sqTail)
	r.sqeHead = r.sqeTail
	return nil
}

func (r *Ring) unmapRings() {
	if r.cqRing != nil && &r.cqRing[0] != &r.sqRing[0] {
		unix.Munmap(r.cqRing)
	}
	if r.sqRing != nil {
		unix.Munmap(r.sqRing)
	}
	r.sqRing, r.cqRing = nil, nil
}

// Close unmaps the rings and closes the ring; pending requests are cancelled
// by the kernel. Buffers must stay valid until then.
func (r *Ring) Close() error {
	if r.fd < 0 {
		return nil
	}
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
		r.sqeMem = nil
	}
	r.unmapRings()
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// Fd is the ring's file descriptor.
func (r *Ring) Fd() int { return r.fd }

// Features is the IORING_FEAT_* mask the kernel reported.
func (r *Ring) Features() uint32 { return r.features }

// SQEntries and CQEntries are the ring sizes the kernel chose.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }
func (r *Ring) CQEntries() uint32 { return r.cqEntries }

// GetSQE returns the next free SQE, zeroed, or nil when the submission queue
// is full (flush with Submit first). Mirrors liburing's io_uring_get_sqe.
func (r *Ring) GetSQE() *SQE {
	// head = io_uring_smp_load_acquire(sq->khead): the kernel advances it
	// after consuming SQEs, so we read it with acquire ordering.
	head := atomic.LoadUint32(r.sqHead)
	if r.sqeTail-head >= r.sqEntries {
		return nil
	}
	sqe := &r.sqes[r.sqeTail&r.sqMask]
	*sqe = SQE{}
	r.sqeTail++
	return sqe
}

// Pending is the number of SQEs prepared but not yet published to the kernel.
func (r *Ring) Pending() uint32 { return r.sqeTail - r.sqeHead }

// Unconsumed is the number of SQEs prepared (published or not) that the
// kernel has not consumed yet.
func (r *Ring) Unconsumed() uint32 {
	// io_uring_smp_load_acquire(sq->khead), as in io_uring_sq_ready.
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// Withdraw takes back every SQE the kernel has not consumed (Unconsumed of
// them, published or not): it appends their user_data to dst in queue order,
// moves the tail back to the kernel's head and returns dst. The kernel reads
// the SQ only inside io_uring_enter (this package never sets up SQPOLL), so
// this is safe as long as no io_uring_enter that submits runs on the ring
// meanwhile; the caller serialises them, as it does GetSQE and Submit.
// liburing has no counterpart: it is what lets a caller give up on SQEs that
// io_uring_enter keeps refusing, without them being submitted later.
func (r *Ring) Withdraw(dst []uint64) []uint64 {
	head := atomic.LoadUint32(r.sqHead)
	for i := head; i != r.sqeTail; i++ {
		dst = append(dst, r.sqes[i&r.sqMask].UserData) // the SQ array is the identity
	}
	r.sqeTail, r.sqeHead = head, head
	// io_uring_smp_store_release(sq->ktail, ...), as in __io_uring_flush_sq.
	atomic.StoreUint32(r.sqTail, head)
	return dst
}

// flush publishes the prepared SQEs by moving the kernel-visible tail and
// returns how many the kernel has yet to consume. Mirrors __io_uring_flush_sq.
func (r *Ring) flush() uint32 {
	if r.sqeTail != r.sqeHead {
		r.sqeHead = r.sqeTail
		// io_uring_smp_store_release(sq->ktail, tail): the SQE contents
		// written above must be visible before the kernel sees the new tail.
		atomic.StoreUint32(r.sqTail, r.sqeTail)
	}
	// *sq->khead is read without a barrier in liburing here; an atomic load
	// is at least as strong.
	return r.sqeTail - atomic.LoadUint32(r.sqHead)
}

// Submit publishes prepared SQEs and calls io_uring_enter to submit them,
// waiting for at least waitNr completions when waitNr > 0. It returns the
// number of SQEs the kernel consumed. EINTR is returned as is (the caller
// decides to retry).
func (r *Ring) Submit(waitNr uint32) (int, error) { return r.SubmitN(^uint32(0), waitNr) }

// SubmitN is Submit handing the kernel at most limit of the prepared SQEs,
// the oldest first (io_uring_enter's to_submit); the rest stay published in
// the SQ for a later call. A caller that submits one SQE per call keeps
// io_uring from plugging the block layer, so adjacent requests are not
// merged (fio's iodepth_batch_submit=1).
func (r *Ring) SubmitN(limit, waitNr uint32) (int, error) {
	toSubmit := min(r.flush(), limit)
	var flags uint32
	if waitNr > 0 {
		flags |= enterGetEvents
	}
	if toSubmit == 0 && waitNr == 0 {
		return 0, nil
	}
	return r.Enter(toSubmit, waitNr, flags)
}

// Enter is the raw io_uring_enter(2) system call.
func (r *Ring) Enter(toSubmit, minComplete, flags uint32) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), uintptr(flags), 0, 0)
	if errno != 0 {
		return int(n), errno
	}
	return int(n), nil
}

// WaitCQE blocks in io_uring_enter until at least minComplete completions are
// available (it submits nothing). EINTR is returned to the caller.
func (r *Ring) WaitCQE(minComplete uint32) error {
	if r.Ready() >= minComplete {
		return nil
	}
	_, err := r.Enter(0, minComplete, enterGetEvents)
	return err
}

// FlushCQ moves the completions the kernel could not post to a full CQ
// (its overflow list) into the CQ, and runs this thread's pending task
// work, without waiting (io_uring_enter with GETEVENTS, min_complete 0).
func (r *Ring) FlushCQ() error {
	_, err := r.Enter(0, 0, enterGetEvents)
	return err
}

// Ready is the number of completions waiting in the CQ.
func (r *Ring) Ready() uint32 {
	// io_uring_smp_load_acquire(cq->ktail): the kernel publishes CQEs
	// before moving the tail, so acquire makes their contents visible.
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// PeekCQE copies out the oldest completion without consuming it.
func (r *Ring) PeekCQE() (CQE, bool) {
	head := atomic.LoadUint32(r.cqHead)
	// io_uring_smp_load_acquire(cq->ktail), as in __io_uring_peek_cqe.
	if head == atomic.LoadUint32(r.cqTail) {
		return CQE{}, false
	}
	return r.cqes[head&r.cqMask], true
}

// Advance consumes n completions (io_uring_cq_advance).
func (r *Ring) Advance(n uint32) {
	// io_uring_smp_store_release(cq->khead, head + n): our reads of the
	// CQEs must complete before the kernel may reuse their slots.
	atomic.AddUint32(r.cqHead, n)
}

// ReapCQEs copies up to len(dst) ready completions into dst, consumes them
// and returns how many it copied.
func (r *Ring) ReapCQEs(dst []CQE) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail) // acquire, as io_uring_peek_batch_cqe
	n := 0
	for head != tail && n < len(dst) {
		dst[n] = r.cqes[head&r.cqMask]
		head++
		n++
	}
	if n > 0 {
		atomic.StoreUint32(r.cqHead, head) // release, as io_uring_cq_advance
	}
	return n
}

// PrepRead prepares IORING_OP_READ of len bytes at addr from fd at off.
// With fixedFile, fd is an index into the registered files.
func PrepRead(sqe *SQE, fd int32, addr uintptr, n uint32, off uint64) {
	prepRW(sqe, OpRead, fd, addr, n, off)
}

// PrepWrite prepares IORING_OP_WRITE.
func PrepWrite(sqe *SQE, fd int32, addr uintptr, n uint32, off uint64) {
	prepRW(sqe, OpWrite, fd, addr, n, off)
}

// PrepReadFixed prepares IORING_OP_READ_FIXED into registered buffer bufIndex;
// addr must lie inside that buffer.
func PrepReadFixed(sqe *SQE, fd int32, addr uintptr, n uint32, off uint64, bufIndex uint16) {
	prepRW(sqe, OpReadFixed, fd, addr, n, off)
	sqe.BufIndex = bufIndex
}

// PrepWriteFixed prepares IORING_OP_WRITE_FIXED from registered buffer bufIndex.
func PrepWriteFixed(sqe *SQE, fd int32, addr uintptr, n uint32, off uint64, bufIndex uint16) {
	prepRW(sqe, OpWriteFixed, fd, addr, n, off)
	sqe.BufIndex = bufIndex
}

// PrepFsync prepares IORING_OP_FSYNC (flags: 0 or FsyncDatasync).
func PrepFsync(sqe *SQE, fd int32, flags uint32) {
	sqe.Opcode = OpFsync
	sqe.Fd = fd
	sqe.OpFlags = flags
}

// PrepNop prepares IORING_OP_NOP (used to wake a waiting reaper).
func PrepNop(sqe *SQE) { sqe.Opcode = OpNop }

func prepRW(sqe *SQE, op uint8, fd int32, addr uintptr, n uint32, off uint64) {
	sqe.Opcode = op
	sqe.Fd = fd
	sqe.Addr = uint64(addr)
	sqe.Len = n
	sqe.Off = off
}

// iovec mirrors struct iovec for buffer registration.
type iovec struct {
	Base uintptr
	Len  uint64
}

// RegisterBuffers registers bufs as fixed buffers 0..len(bufs)-1
// (IORING_REGISTER_BUFFERS). The kernel pins their pages until
// UnregisterBuffers or Close; each must be non-empty.
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	if len(bufs) == 0 {
		return errors.New("uring: register buffers: none given")
	}
	iov := make([]iovec, len(bufs))
	for i, b := range bufs {
		if len(b) == 0 {
			return fmt.Errorf("uring: register buffers: buffer %d is empty", i)
		}
		iov[i] = iovec{uintptr(unsafe.Pointer(&b[0])), uint64(len(b))}
	}
	return r.register(regBuffers, unsafe.Pointer(&iov[0]), uint32(len(iov)))
}

// UnregisterBuffers drops all registered buffers.
func (r *Ring) UnregisterBuffers() error { return r.register(regUnregisterBufs, nil, 0) }

// RegisterFiles registers fds as fixed files 0..len(fds)-1.
func (r *Ring) RegisterFiles(fds []int32) error {
	if len(fds) == 0 {
		return errors.New("uring: register files: none given")
	}
	return r.register(regFiles, unsafe.Pointer(&fds[0]), uint32(len(fds)))
}

// UnregisterFiles drops all registered files.
func (r *Ring) UnregisterFiles() error { return r.register(regUnregisterFiles, nil, 0) }

// RegisterEventfd makes the kernel signal eventfd fd whenever it posts a
// completion (IORING_REGISTER_EVENTFD, Linux 5.2): a waiter can sleep in
// a read of fd instead of in io_uring_enter.
func (r *Ring) RegisterEventfd(fd int32) error {
	return r.register(regRegisterEventfd, unsafe.Pointer(&fd), 1)
}

func (r *Ring) register(op uint32, arg unsafe.Pointer, n uint32) error {
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uintptr(op), uintptr(arg), uintptr(n), 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_register(%d): %w", op, errno)
		}
		return nil
	}
}

// probeOp mirrors struct io_uring_probe_op.
type probeOp struct {
	Op    uint8
	_     uint8
	Flags uint16
	_     uint32
}

// probeHdr mirrors struct io_uring_probe without its flexible array.
type probeHdr struct {
	LastOp uint8
	OpsLen uint8
	_      uint16
	_      [3]uint32
}

// Probe lists the operations the running kernel supports.
type Probe struct {
	LastOp    uint8
	supported [opLast + 1]bool
}

// Supported reports whether opcode op is implemented by the kernel.
func (p *Probe) Supported(op uint8) bool { return int(op) < len(p.supported) && p.supported[op] }

// Probe asks the kernel which opcodes it supports (IORING_REGISTER_PROBE).
func (r *Ring) Probe() (*Probe, error) {
	const n = int(opLast) + 1
	buf := make([]byte, int(unsafe.Sizeof(probeHdr{}))+n*int(unsafe.Sizeof(probeOp{})))
	if err := r.register(regProbe, unsafe.Pointer(&buf[0]), uint32(n)); err != nil {
		return nil, err
	}
	hdr := (*probeHdr)(unsafe.Pointer(&buf[0]))
	ops := unsafe.Slice((*probeOp)(unsafe.Add(unsafe.Pointer(&buf[0]), unsafe.Sizeof(probeHdr{}))), n)
	p := &Probe{LastOp: hdr.LastOp}
	for i := 0; i < int(hdr.OpsLen) && i < n; i++ {
		if ops[i].Flags&probeOpSupported != 0 {
			p.supported[ops[i].Op] = true
		}
	}
	return p, nil
}
