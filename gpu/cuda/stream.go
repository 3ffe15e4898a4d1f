package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
)

// Stream is a non-blocking CUDA stream of one device, with an error slot in
// device memory where the kernels that check runtime data (token ids,
// targets) report what they found.
type Stream struct {
	dev  *Device
	h    uintptr
	slot uint64

	mu        sync.Mutex
	err       error // first host-side error since the last Synchronize
	destroyed bool
	checked   atomic.Bool // a checking op was enqueued since the last Synchronize

	sc streamScratch // the ops' and collectives' scratch (scratch.go)
}

// Error codes written by check_ids and check_pos (kernels.cu).
const (
	codeEmbeddingID = iota + 1
	codeTarget
	codePos        // an embedding position past wpe (check_ids)
	codeAttnPos    // an attention position outside [0, t] (check_pos)
	codeAttnBwdPos // the same in attention-backward
)

// Home returns the front end of the stream's device (gpu.Queue).
func (s *Stream) Home() *gpu.Front { return s.dev.front }

func (b *Backend) newStream(d *Device) (*Stream, error) {
	s := &Stream{dev: d}
	slot, err := d.g.slot()
	if err != nil {
		return nil, err
	}
	s.slot = slot
	drv := d.g.l.drv
	err = d.g.do(func() error {
		if err := drv.check(drv.cuStreamCreate(&s.h, cuStreamNonBlocking), "cuStreamCreate"); err != nil {
			return err
		}
		return drv.check(drv.cuMemsetD8Async(s.slot, 0, slotBytes, s.h), "cuMemsetD8Async error slot")
	})
	if err != nil {
		d.g.releaseSlot(slot)
		return nil, fmt.Errorf("gpu/cuda: %s: %w", d.Name(), err)
	}
	if err := b.track(s); err != nil {
		s.destroy()
		return nil, err
	}
	return s, nil
}

func (s *Stream) destroy() error {
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return nil
	}
	s.destroyed = true
	s.mu.Unlock()
	drv := s.dev.g.l.drv
	err := s.dev.g.do(func() error {
		s.sc.mu.Lock()
		s.sc.release(s)
		s.sc.mu.Unlock()
		e1 := drv.check(drv.cuStreamSynchronize(s.h), "cuStreamSynchronize")
		e2 := drv.check(drv.cuStreamDestroy(s.h), "cuStreamDestroy")
		return errors.Join(e1, e2)
	})
	s.dev.g.releaseSlot(s.slot)
	return err
}

// fail records a host-side error that the next Synchronize returns.
func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// run calls f with the device's context current and records its error on
// the stream. Enqueueing on a closed backend's stream panics.
func (s *Stream) run(f func() error) {
	s.mu.Lock()
	dead := s.destroyed
	s.mu.Unlock()
	if dead {
		panic("gpu/cuda: use of a stream of a closed backend")
	}
	if err := s.dev.g.do(f); err != nil {
		s.fail(fmt.Errorf("gpu/cuda: %s: %w", s.dev.Name(), err))
	}
}

// launch enqueues a kernel on s.
func (s *Stream) launch(name string, grid, block uint32, args ...any) {
	s.run(func() error { return s.dev.g.launch(s.h, name, grid, block, 0, args...) })
}

// launchN enqueues a grid-stride kernel over n elements with 256 threads a block.
func (s *Stream) launchN(name string, n int64, args ...any) {
	if n <= 0 {
		return
	}
	s.launch(name, s.dev.g.gridFor(n, 256), 256, args...)
}

// checkIDs enqueues check_ids over ids (n int32 values that must lie in
// [lo, limit)); the kernels of the same op skip when it finds one outside.
// The second check of an op passes accumulate, so that the op's kernels
// skip when either check failed.
func (s *Stream) checkIDs(ids *Buffer, n, lo, limit int, code int32, accumulate bool) {
	s.checked.Store(true)
	acc := int32(0)
	if accumulate {
		acc = 1
	}
	s.launch("check_ids", 1, 256, ids.p(), int64(n), int32(lo), int32(limit), code, devPtr(s.slot), acc)
}

// checkPos enqueues check_pos over an attention op's positions (batch×seq,
// each in [0, its column]; code names the op in the error) and returns
// the flag the op's kernels read to skip. With nothing to check (pos nil,
// or no token) it returns a null flag, so that the kernels never read one
// an earlier op left.
func (s *Stream) checkPos(pos *Buffer, batch, seq int, code int32) devPtr {
	n := int64(batch) * int64(seq)
	if pos == nil || n == 0 {
		return 0
	}
	s.checked.Store(true)
	s.launch("check_pos", 1, 256, pos.p(), n, int32(seq), code, devPtr(s.slot))
	return s.badFlag()
}

// badFlag is the device address of the slot word that says the latest
// checked op found bad data.
func (s *Stream) badFlag() devPtr { return devPtr(s.slot + 16) }

// Record marks the current end of the stream in e.
func (s *Stream) Record(ge gpu.Event) {
	e := event(ge)
	s.run(func() error { return e.record(s) })
}

// Wait makes later work on s wait for the work e recorded. e may have been
// recorded on a stream of any device.
func (s *Stream) Wait(ge gpu.Event) {
	e := event(ge)
	h, _ := e.current()
	if h == 0 {
		return
	}
	drv := s.dev.g.l.drv
	s.run(func() error { return drv.check(drv.cuStreamWaitEvent(s.h, h, 0), "cuStreamWaitEvent") })
}

// Synchronize blocks until the stream's work has completed and returns the
// first error raised since the last Synchronize: a failed enqueue, bad data
// a kernel found, or an error of the CUDA context.
func (s *Stream) Synchronize() error {
	drv := s.dev.g.l.drv
	var slot [8]int32
	checked := s.checked.Swap(false)
	syncErr := s.dev.g.do(func() error {
		if err := drv.check(drv.cuStreamSynchronize(s.h), "cuStreamSynchronize"); err != nil {
			return err
		}
		if !checked {
			return nil
		}
		if err := drv.check(drv.cuMemcpyDtoHAsync(unsafe.Pointer(&slot[0]), s.slot, slotBytes, s.h), "read error slot"); err != nil {
			return err
		}
		if err := drv.check(drv.cuStreamSynchronize(s.h), "cuStreamSynchronize"); err != nil {
			return err
		}
		if slot[0] != 0 {
			return drv.check(drv.cuMemsetD8Async(s.slot, 0, slotBytes, s.h), "reset error slot")
		}
		return nil
	})
	runtime.KeepAlive(&slot)
	s.mu.Lock()
	err := s.err
	s.err = nil
	s.mu.Unlock()
	if err == nil && syncErr != nil {
		err = fmt.Errorf("gpu/cuda: %s: %w", s.dev.Name(), syncErr)
	}
	if err == nil && slot[0] != 0 {
		err = slotError(slot)
	}
	return err
}

// slotError is the error of a filled slot: [0] the code, [1] the bad
// value, [2] its index, [3] the limit (check_pos: seq, so that the index
// names the token's row and column), with gpu/cpu's wording.
func slotError(slot [8]int32) error {
	what := "embedding: id"
	switch slot[0] {
	case codeTarget:
		what = "cross-entropy: target"
	case codePos:
		what = "embedding: position"
	case codeAttnPos, codeAttnBwdPos:
		op, seq := "attention", max(slot[3], 1)
		if slot[0] == codeAttnBwdPos {
			op = "attention-backward"
		}
		t := slot[2] % seq
		return fmt.Errorf("gpu/cuda: %s: position %d of row %d, column %d outside [0, %d]", op, slot[1], slot[2]/seq, t, t)
	}
	return fmt.Errorf("gpu/cuda: %s %d at position %d outside [0, %d)", what, slot[1], slot[2], slot[3])
}

// Event marks a point in a stream. Its CUDA events are made lazily, one
// per GPU context it is recorded in, with timing (gpu.TimedEvent), and
// destroyed when the Event is garbage collected.
type Event struct {
	mu   sync.Mutex
	h    *eventHandles
	cur  uintptr      // the CUevent of the latest Record; 0: never recorded
	curG *gpuCtx      // the context of cur
	anc  *clockAnchor // cur's context's anchor when it was recorded; nil: none could be taken
}

// clockAnchor ties a GPU context's event times to the host clock: an
// event recorded on the context's otherwise idle clock stream, waited
// for, and the host time the wait returned (late by the wake-up, a few
// microseconds). An event recorded after it completed at the anchor's
// time plus cuEventElapsedTime(anchor, event), device time at about half
// a microsecond's resolution. A context takes a new anchor when its
// newest is anchorAge old, so that the float32 milliseconds of
// cuEventElapsedTime keep microseconds and the two clocks' drift stays
// below them; each event keeps the anchor of its Record.
type clockAnchor struct {
	ev uintptr
	at time.Time
}

const anchorAge = 30 * time.Second

// clockAnchor returns g's anchor, taking a new one where there is none or
// it is anchorAge old. It runs with g's context current.
func (g *gpuCtx) clockAnchor() (*clockAnchor, error) {
	g.clockMu.Lock()
	defer g.clockMu.Unlock()
	if a := g.anchor; a != nil && time.Since(a.at) < anchorAge {
		return a, nil
	}
	drv := g.l.drv
	if g.clockStream == 0 {
		if err := drv.check(drv.cuStreamCreate(&g.clockStream, cuStreamNonBlocking), "cuStreamCreate (clock)"); err != nil {
			g.clockStream = 0
			return nil, err
		}
	}
	var ev uintptr
	if err := drv.check(drv.cuEventCreate(&ev, 0), "cuEventCreate (clock)"); err != nil {
		return nil, err
	}
	err := drv.check(drv.cuEventRecord(ev, g.clockStream), "cuEventRecord (clock)")
	if err == nil {
		err = drv.check(drv.cuEventSynchronize(ev), "cuEventSynchronize (clock)")
	}
	if err != nil {
		drv.cuEventDestroy(ev)
		return nil, err
	}
	a := &clockAnchor{ev: ev, at: time.Now()}
	runtime.AddCleanup(a, func(ev uintptr) { g.do(func() error { drv.cuEventDestroy(ev); return nil }) }, ev)
	g.anchor = a
	return a, nil
}

type eventHandles struct {
	drv *driverAPI
	mu  sync.Mutex
	evs map[*gpuCtx]uintptr
}

func newEvent(drv *driverAPI) *Event {
	e := &Event{h: &eventHandles{drv: drv, evs: map[*gpuCtx]uintptr{}}}
	runtime.AddCleanup(e, func(h *eventHandles) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for g, ev := range h.evs {
			g.do(func() error { h.drv.cuEventDestroy(ev); return nil })
		}
	}, e.h)
	return e
}

func event(ge gpu.Event) *Event {
	e, ok := ge.(*Event)
	if !ok || e == nil {
		panic(fmt.Sprintf("gpu/cuda: event is not a gpu/cuda event (%T)", ge))
	}
	return e
}

// record runs with s's context current.
func (e *Event) record(s *Stream) error {
	g := s.dev.g
	drv := g.l.drv
	e.h.mu.Lock()
	ev, ok := e.h.evs[g]
	if !ok {
		if err := drv.check(drv.cuEventCreate(&ev, 0), "cuEventCreate"); err != nil {
			e.h.mu.Unlock()
			return err
		}
		e.h.evs[g] = ev
	}
	e.h.mu.Unlock()
	anc, err := g.clockAnchor()
	if err != nil {
		anc = nil // untimed: CompletedAt says so, and timelines use the host clock
	}
	if err := drv.check(drv.cuEventRecord(ev, s.h), "cuEventRecord"); err != nil {
		return err
	}
	e.mu.Lock()
	e.cur, e.curG, e.anc = ev, g, anc
	e.mu.Unlock()
	return nil
}

// CompletedAt is when the work of the latest Record completed, on the host
// clock (its anchor's time plus cuEventElapsedTime from the anchor), once
// it has: gpu.TimedEvent. False while it has not, for an event never
// recorded, or where no anchor could be taken.
func (e *Event) CompletedAt() (time.Time, bool) {
	e.mu.Lock()
	h, g, a := e.cur, e.curG, e.anc
	e.mu.Unlock()
	if h == 0 || a == nil {
		return time.Time{}, false
	}
	var ms float32
	var r cuResult
	g.do(func() error { r = e.h.drv.cuEventElapsedTime(&ms, a.ev, h); return nil })
	if r != cudaSuccess { // cudaNotReady while the work runs
		return time.Time{}, false
	}
	return a.at.Add(time.Duration(float64(ms) * float64(time.Millisecond))), true
}

func (e *Event) current() (uintptr, *gpuCtx) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur, e.curG
}

// Synchronize blocks until the recorded work has completed.
func (e *Event) Synchronize() {
	if h, g := e.current(); h != 0 {
		g.do(func() error { e.h.drv.cuEventSynchronize(h); return nil })
	}
}

// Done reports whether the recorded work has completed.
func (e *Event) Done() bool {
	h, g := e.current()
	if h == 0 {
		return true
	}
	var r cuResult
	g.do(func() error { r = e.h.drv.cuEventQuery(h); return nil })
	return r != cudaNotReady
}
