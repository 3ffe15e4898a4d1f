package nvme

import (
	"errors"
	"fmt"
	"os"
	"runtime"
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
type uringBackend struct {
	e    *Engine
	ring *uring.Ring

	mu      sync.Mutex // the SQ, bufs, fixedFd, reaping
	bufs    []bufRegion
	fixedFd map[int]int32
	// reaping is set while the reaper runs completion callbacks: requests
	// submitted meanwhile (often by those callbacks) are prepared but left
	// for the reaper to hand over in one io_uring_enter that also waits for
	// the next completion, as fio does.
	reaping bool

	reaperDone chan struct{}
}

// uringSetup is replaced by tests to simulate a kernel without io_uring.
var uringSetup = func(e *Engine) (backend, error) { return newUringBackend(e) }

func newUringBackend(e *Engine) (*uringBackend, error) {
	entries := uint32(max(e.opts.QueueDepth, 8))
	// Cooperative task running (Linux 5.19+): completions become task work
	// of the submitting thread without an IPI; in steady state that is the
	// reaper's locked thread, which sleeps in io_uring_enter and is woken.
	// Fall back to plain setup on kernels that refuse the flag.
	ring, err := uring.New(entries, 2*entries+2, uring.SetupClamp|uring.SetupCoopTaskrun)
	if errors.Is(err, unix.EINVAL) {
		ring, err = uring.New(entries, 2*entries+2, uring.SetupClamp)
	}
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
	b := &uringBackend{e: e, ring: ring, reaperDone: make(chan struct{})}
	e.info.SQEntries, e.info.CQEntries = ring.SQEntries(), ring.CQEntries()
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
	defer b.mu.Unlock()
	for _, idx := range slots {
		sqe := b.ring.GetSQE()
		for sqe == nil { // SQ full: hand what we have to the kernel first
			b.submitLocked()
			sqe = b.ring.GetSQE()
		}
		b.prep(sqe, idx)
	}
	if !b.reaping {
		b.submitLocked()
	}
}

// submitLocked hands every prepared SQE to the kernel, retrying on the
// transient errors of io_uring_enter.
func (b *uringBackend) submitLocked() {
	for tries := 0; b.ring.Pending() > 0 || tries == 0; tries++ {
		_, err := b.ring.Submit(0)
		switch {
		case err == nil:
			if b.ring.Pending() == 0 {
				return
			}
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOMEM):
			// The kernel is short of resources or the CQ is backed up:
			// let the reaper drain it and try again.
			time.Sleep(50 * time.Microsecond)
		default:
			// EBADF, EFAULT, EINVAL on enter mean the ring itself is
			// broken: a bug, not an I/O error.
			panic(fmt.Sprintf("nvme: io_uring_enter: %v (broken ring state)", err))
		}
		if tries > 100000 {
			panic(fmt.Sprintf("nvme: io_uring_enter: no progress after %d tries: %v", tries, err))
		}
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
	// One OS thread both waits and (in steady state) submits, so the task
	// work of most completions runs in the thread that waits for them.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cqes := make([]uring.CQE, b.ring.CQEntries())
	again := make([]int32, 0, len(cqes))
	for {
		// Hand over what the last round of callbacks submitted and wait
		// for the next completion, in one io_uring_enter.
		b.mu.Lock()
		toSubmit := b.ring.Pending()
		b.reaping = false
		var err error
		if toSubmit > 0 {
			_, err = b.ring.Submit(1)
			if err != nil && !transient(err) {
				panic(fmt.Sprintf("nvme: io_uring_enter: %v (broken ring state)", err))
			}
			if b.ring.Pending() > 0 {
				b.submitLocked()
			}
		}
		b.mu.Unlock()
		if toSubmit == 0 || err != nil {
			if err := b.ring.WaitCQE(1); err != nil && !transient(err) {
				panic(fmt.Sprintf("nvme: io_uring_enter (wait): %v (broken ring state)", err))
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
			b.mu.Lock()
			b.reaping = false
			b.submitLocked()
			b.mu.Unlock()
			return
		}
	}
}

func transient(err error) bool {
	return errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY)
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
	b.mu.Lock()
	sqe := b.ring.GetSQE()
	for sqe == nil {
		b.submitLocked()
		sqe = b.ring.GetSQE()
	}
	uring.PrepNop(sqe)
	sqe.UserData = wakeUserData
	b.submitLocked()
	b.mu.Unlock()
	<-b.reaperDone
	return b.ring.Close()
}
