package nvme

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/nvme/internal/uring"
	"golang.org/x/sys/unix"
)

// wakeUserData marks the NOP that Close sends to stop the reaper; every
// other user_data is a slot index.
const wakeUserData = ^uint64(0)

type bufRegion struct {
	start, end uintptr
	index      uint16
}

// uringBackend submits under mu (single producer of the SQ) and reaps on one
// goroutine (single consumer of the CQ), as liburing's threading rules want.
//
// Nobody sleeps holding mu: a submitter whose io_uring_enter fails
// transiently (EAGAIN, EBUSY, ENOMEM: the kernel is short of memory or wants
// the CQ drained) backs off with mu released, so that the reaper, which
// needs mu to reap, can drain the CQ meanwhile; the reaper itself never backs
// off inside a submission, it goes on reaping and tries again on its next
// round. If io_uring_enter makes no progress for enterStallLimit, the SQEs it
// would not take are withdrawn and their requests fail with the error.
type uringBackend struct {
	e    *Engine
	ring *uring.Ring

	mu      sync.Mutex // the SQ, backlog, stallSince, bufs, fixedFd, reaping
	bufs    []bufRegion
	fixedFd map[int]int32
	// reaping is set while the reaper runs completion callbacks: requests
	// submitted meanwhile (often by those callbacks) are prepared but left
	// for the reaper to hand over, batch per io_uring_enter, the last
	// enter also waiting for the next completion.
	reaping bool
	// backlog holds, in order, slots issued while the SQ was full; they get
	// SQEs as the kernel consumes the queue. At most QueueDepth slots exist,
	// so its capacity is allocated once.
	backlog []int32
	// stallSince is when io_uring_enter began failing transiently without
	// taking an SQE; zero while it makes progress.
	stallSince time.Time
	withdrawn  []uint64 // scratch for Withdraw

	// batch is Options.SubmitBatch: the most SQEs one io_uring_enter
	// hands over. More are handed over in several calls, in order.
	batch uint32

	// events is an eventfd registered with the ring: the kernel signals it
	// at every completion, and the reaper sleeps in a read of it (Go's
	// poller: no thread, no P held) instead of in io_uring_enter. A
	// goroutine blocked in io_uring_enter keeps its P until the runtime's
	// monitor takes it back (up to 10 ms later while the rest runs), and
	// the reaper blocked there after every completion: the CPU backend's
	// compute ran on one core for a while after each transfer, its
	// forward 25 % slower with params streaming from NVMe.
	events *os.File

	reaperDone chan struct{}
	enterHook  func(toSubmit, minComplete, ready uint32) error
}

// enterStallLimit is how long io_uring_enter may keep failing transiently
// before the requests it refuses are failed; enterBackoff is the pause
// between tries. Tests shorten the limit.
var (
	enterStallLimit = 10 * time.Second
	enterBackoff    = 50 * time.Microsecond
)

// transient says whether an io_uring_enter error is worth trying again: a
// signal (EINTR), or the kernel short of memory or wanting the completion
// queue drained first (EAGAIN, EBUSY, ENOMEM). Every other error (EBADF,
// EFAULT, EINVAL) means the ring itself is broken: a bug, not an I/O error.
func transient(err error) bool {
	return errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) ||
		errors.Is(err, unix.ENOMEM)
}

// enter hands the oldest prepared SQEs to the kernel, at most batch of
// them, without waiting. It returns how many SQEs the kernel took, and
// counts the call and the SQEs in the engine's Stats.
func (b *uringBackend) enter() (int, error) {
	if b.enterHook != nil {
		if err := b.enterHook(min(b.ring.Unconsumed(), b.batch), 0, b.ring.Ready()); err != nil {
			return 0, err
		}
	}
	n, err := b.ring.SubmitN(b.batch, 0)
	if n > 0 {
		b.e.enters.Add(1)
		b.e.sqes.Add(uint64(n))
	}
	return n, err
}

// wait sleeps until the kernel has posted a completion since the last
// wait (the eventfd's counter), parked in Go's poller.
func (b *uringBackend) wait() {
	var buf [8]byte
	if _, err := b.events.Read(buf[:]); err != nil {
		panic(fmt.Sprintf("nvme: read the io_uring completion eventfd: %v (broken ring state)", err))
	}
}

// uringSetup is replaced by tests to simulate a kernel without io_uring.
var uringSetup = func(e *Engine) (backend, error) { return newUringBackend(e) }

// ringSizes chooses the SQ and CQ sizes for a queue depth; tests shrink
// them to force full queues.
var ringSizes = func(queueDepth int) (sqEntries, cqEntries uint32) {
	n := uint32(max(queueDepth, 8))
	return n, 2*n + 2
}

// enterHook, set only by tests before Open, is consulted before every
// io_uring_enter of the backend (toSubmit SQEs, at most SubmitBatch;
// minComplete is 0: no enter waits, the reaper sleeps on its eventfd; with
// ready completions unreaped); a non-nil error is returned as if the
// kernel had failed the call, and the call is not made.
var enterHook func(toSubmit, minComplete, ready uint32) error

func newUringBackend(e *Engine) (*uringBackend, error) {
	entries, cqEntries := ringSizes(e.opts.QueueDepth)
	// No cooperative task running (IORING_SETUP_COOP_TASKRUN): requests
	// are submitted from the callers' threads too, and a completion left as
	// task work of a thread busy computing would wait until it enters the
	// kernel; the reaper waits on an eventfd, not in io_uring_enter.
	ring, err := uring.New(entries, cqEntries, uring.SetupClamp)
	if err != nil {
		return nil, setupError(err)
	}
	probe, err := ring.Probe()
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("io_uring probe: %w", err)
	}
	for _, op := range []struct {
		code uint8
		name string
	}{{uring.OpRead, "READ"}, {uring.OpWrite, "WRITE"}, {uring.OpReadFixed, "READ_FIXED"}, {uring.OpWriteFixed, "WRITE_FIXED"}, {uring.OpFsync, "FSYNC"}} {
		if !probe.Supported(op.code) {
			ring.Close()
			return nil, fmt.Errorf("io_uring: kernel lacks IORING_OP_%s (needs Linux 5.6+)", op.name)
		}
	}
	b := &uringBackend{e: e, ring: ring, reaperDone: make(chan struct{}), enterHook: enterHook,
		backlog: make([]int32, 0, e.opts.QueueDepth), batch: uint32(e.opts.SubmitBatch)}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("io_uring completion eventfd: %w", err)
	}
	b.events = os.NewFile(uintptr(efd), "io_uring completions")
	if err := ring.RegisterEventfd(int32(efd)); err != nil {
		b.events.Close()
		ring.Close()
		return nil, fmt.Errorf("io_uring register eventfd: %w", err)
	}
	e.info.SQEntries, e.info.CQEntries = ring.SQEntries(), ring.CQEntries()
	e.info.SubmitBatch = e.opts.SubmitBatch
	go b.reap()
	return b, nil
}

// setupError says the likely cause of an io_uring_setup failure.
func setupError(err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		why := "blocked by seccomp, or kernel.io_uring_disabled"
		if b, e := os.ReadFile("/proc/sys/kernel/io_uring_disabled"); e == nil {
			why += "=" + strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%w (%s)", err, why)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w (kernel without io_uring, or filtered by a container runtime)", err)
	case errors.Is(err, unix.ENOMEM):
		return fmt.Errorf("%w (RLIMIT_MEMLOCK too small for the rings on kernels before 5.12)", err)
	}
	return err
}

func (b *uringBackend) issue(slots []int32) {
	b.mu.Lock()
	b.queueLocked(slots)
	if b.reaping {
		b.mu.Unlock()
		return
	}
	failed, err := b.submitLocked()
	b.mu.Unlock()
	b.fail(failed, err)
}

// queueLocked prepares an SQE for each slot, after the backlog, in order;
// what does not fit in the SQ joins the backlog.
func (b *uringBackend) queueLocked(slots []int32) {
	b.refillLocked()
	for i, idx := range slots {
		var sqe *uring.SQE
		if len(b.backlog) == 0 {
			sqe = b.ring.GetSQE()
		}
		if sqe == nil {
			b.backlog = append(b.backlog, slots[i:]...)
			return
		}
		b.prep(sqe, idx)
	}
}

// refillLocked moves the backlog into free SQEs.
func (b *uringBackend) refillLocked() {
	n := 0
	for ; n < len(b.backlog); n++ {
		sqe := b.ring.GetSQE()
		if sqe == nil {
			break
		}
		b.prep(sqe, b.backlog[n])
	}
	if n > 0 {
		b.backlog = b.backlog[:copy(b.backlog, b.backlog[n:])]
	}
}

// submitLocked hands every prepared SQE and the backlog to the kernel. On a
// transient failure it backs off with mu released (the reaper drains the CQ
// meanwhile) and tries again; after enterStallLimit without progress it
// withdraws what is left and returns those slots with the error, for the
// caller to fail once it has released mu.
func (b *uringBackend) submitLocked() ([]int32, error) {
	for {
		b.refillLocked()
		if b.ring.Unconsumed() == 0 {
			return nil, nil
		}
		before := b.ring.Unconsumed()
		_, err := b.enter()
		if b.ring.Unconsumed() < before {
			b.stallSince = time.Time{} // progress, whatever it says
			continue
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil {
			err = unix.EAGAIN // took nothing without saying why
		}
		if failed, err := b.stalledLocked(err); failed != nil || err != nil {
			return failed, err
		}
		b.mu.Unlock()
		time.Sleep(enterBackoff)
		b.mu.Lock()
	}
}

// stalledLocked records a failed io_uring_enter that took nothing. It panics
// on a broken ring; after enterStallLimit without progress it withdraws every
// unconsumed SQE and the backlog and returns their slots and the error to
// fail them with.
func (b *uringBackend) stalledLocked(err error) ([]int32, error) {
	if !transient(err) {
		panic(fmt.Sprintf("nvme: io_uring_enter: %v (broken ring state)", err))
	}
	now := time.Now()
	if b.stallSince.IsZero() {
		b.stallSince = now
	}
	if now.Sub(b.stallSince) < enterStallLimit {
		return nil, nil
	}
	b.stallSince = time.Time{}
	b.withdrawn = b.ring.Withdraw(b.withdrawn[:0])
	var failed []int32
	for _, ud := range b.withdrawn {
		if ud != wakeUserData {
			failed = append(failed, int32(ud))
		}
	}
	failed = append(failed, b.backlog...)
	b.backlog = b.backlog[:0]
	return failed, fmt.Errorf("io_uring_enter: %w (no progress for %v)", err, enterStallLimit)
}

// fail completes withdrawn slots with err; it runs without mu, since the
// completion callbacks may submit.
func (b *uringBackend) fail(slots []int32, err error) {
	for _, idx := range slots {
		b.e.fail(idx, err)
	}
}

func (b *uringBackend) prep(sqe *uring.SQE, idx int32) {
	r := b.e.slots[idx]
	fd := int32(r.File.fd)
	fixed := false
	if i, ok := b.fixedFd[r.File.fd]; ok {
		fd, fixed = i, true
	}
	switch r.Op {
	case OpSync:
		uring.PrepFsync(sqe, fd, uring.FsyncDatasync)
	case OpRead, OpWrite:
		rest := r.Buf[r.done:]
		addr, n, off := bufAddr(rest), uint32(len(rest)), uint64(r.Offset)+uint64(r.done)
		bi, isFixed := b.findBuf(addr, uintptr(n))
		if isFixed {
			b.e.fixedBufs.Add(1)
		}
		switch {
		case r.Op == OpRead && isFixed:
			uring.PrepReadFixed(sqe, fd, addr, n, off, bi)
		case r.Op == OpRead:
			uring.PrepRead(sqe, fd, addr, n, off)
		case isFixed:
			uring.PrepWriteFixed(sqe, fd, addr, n, off, bi)
		default:
			uring.PrepWrite(sqe, fd, addr, n, off)
		}
	}
	if fixed {
		sqe.Flags |= uring.SQEFixedFile
		b.e.fixedFiles.Add(1)
	}
	sqe.UserData = uint64(idx)
}

func (b *uringBackend) findBuf(addr, n uintptr) (uint16, bool) {
	i := sort.Search(len(b.bufs), func(i int) bool { return b.bufs[i].end > addr })
	if i < len(b.bufs) && b.bufs[i].start <= addr && addr+n <= b.bufs[i].end {
		return b.bufs[i].index, true
	}
	return 0, false
}

func (b *uringBackend) reap() {
	defer close(b.reaperDone)
	cqes := make([]uring.CQE, b.ring.CQEntries())
	again := make([]int32, 0, len(cqes))
	for {
		// Hand over what the last round of callbacks queued, then sleep
		// until a completion is posted (the eventfd: one posted since the
		// check makes the read return at once). On a transient failure do
		// not sleep (the queued SQEs may be all there is to wait for):
		// reap what is there and try again.
		b.mu.Lock()
		b.reaping = false
		backoff, failed, failErr := b.handOverLocked()
		b.mu.Unlock()
		b.fail(failed, failErr)
		switch {
		case backoff:
			time.Sleep(enterBackoff)
		case b.ring.Ready() == 0:
			// Completions that found the CQ full wait in the kernel's
			// overflow list until an io_uring_enter flushes them; the
			// eventfd was signaled for them already.
			switch err := b.ring.FlushCQ(); {
			case err != nil && !transient(err):
				panic(fmt.Sprintf("nvme: io_uring_enter (flush): %v (broken ring state)", err))
			case err != nil:
				time.Sleep(enterBackoff) // not flushed: look again
			case b.ring.Ready() == 0:
				b.wait()
			}
		}
		// Taking mu also orders this goroutine after the submitter that
		// filled the slots (the kernel's ordering is invisible to Go).
		b.mu.Lock()
		n := b.ring.ReapCQEs(cqes)
		b.reaping = n > 0
		b.mu.Unlock()
		stop := false
		again = again[:0]
		for _, c := range cqes[:n] {
			if c.UserData == wakeUserData {
				stop = true
				continue
			}
			idx := int32(c.UserData)
			if b.e.result(idx, int(c.Res)) {
				again = append(again, idx)
			}
		}
		if len(again) > 0 {
			b.issue(again)
		}
		if stop {
			// Close sends the wake-up once every slot is free, so nothing
			// is queued or in flight any more.
			return
		}
	}
}

// handOverLocked gives the kernel what the last round of callbacks queued,
// batch SQEs per io_uring_enter, none of them waiting. backoff: an enter took nothing
// (EINTR, or a transient error: failed and failErr, from stalledLocked, are
// the requests to fail, if any); the reaper pauses and reaps what is there
// instead of blocking, since the SQEs left may be all there is to wait for.
func (b *uringBackend) handOverLocked() (backoff bool, failed []int32, failErr error) {
	for {
		b.refillLocked()
		left := b.ring.Unconsumed()
		if left == 0 {
			return false, nil, nil
		}
		_, err := b.enter()
		switch {
		case b.ring.Unconsumed() < left:
			b.stallSince = time.Time{}
		case errors.Is(err, unix.EINTR):
			return true, nil, nil // nothing taken: try again soon
		default:
			if err == nil {
				err = unix.EAGAIN // took nothing without saying why
			}
			failed, failErr = b.stalledLocked(err)
			return true, failed, failErr
		}
	}
}

func (b *uringBackend) registerBuffers(bufs [][]byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.bufs) > 0 {
		if err := b.ring.UnregisterBuffers(); err != nil {
			return err
		}
		b.bufs = nil
	}
	if len(bufs) == 0 {
		return nil
	}
	if len(bufs) > 1<<14 {
		return fmt.Errorf("%d buffers: at most 16384", len(bufs))
	}
	if err := b.ring.RegisterBuffers(bufs); err != nil {
		if errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("%w (pinning the buffers exceeds RLIMIT_MEMLOCK; raise it or run with CAP_IPC_LOCK)", err)
		}
		return err
	}
	regions := make([]bufRegion, len(bufs))
	for i, buf := range bufs {
		regions[i] = bufRegion{bufAddr(buf), bufAddr(buf) + uintptr(len(buf)), uint16(i)}
	}
	sort.Slice(regions, func(i, j int) bool { return regions[i].start < regions[j].start })
	b.bufs = regions
	return nil
}

func (b *uringBackend) registerFiles(files []*File) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fixedFd != nil {
		if err := b.ring.UnregisterFiles(); err != nil {
			return err
		}
		b.fixedFd = nil
	}
	if len(files) == 0 {
		return nil
	}
	fds := make([]int32, len(files))
	m := make(map[int]int32, len(files))
	for i, f := range files {
		fds[i] = int32(f.fd)
		m[f.fd] = int32(i)
	}
	if err := b.ring.RegisterFiles(fds); err != nil {
		return err
	}
	b.fixedFd = m
	return nil
}

func (b *uringBackend) close() error {
	// Every slot is free (Engine.Close waited for them), so the SQ has room
	// for the wake-up unless the kernel still holds SQEs it refused.
	b.mu.Lock()
	var sqe *uring.SQE
	for sqe = b.ring.GetSQE(); sqe == nil; sqe = b.ring.GetSQE() {
		if _, err := b.submitLocked(); err != nil {
			b.mu.Unlock()
			return fmt.Errorf("wake the reaper: %w", err)
		}
	}
	uring.PrepNop(sqe)
	sqe.UserData = wakeUserData
	_, err := b.submitLocked()
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("wake the reaper: %w", err)
	}
	<-b.reaperDone
	err = b.ring.Close()
	if err2 := b.events.Close(); err == nil {
		err = err2
	}
	return err
}
