package cuda

import (
	"sync"
	"testing"
	"time"

	"github.com/strata-ai/strata/gpu"
)

var _ gpu.TimedEvent = (*Event)(nil)

// fakeDevice is the part of the driver API the event clock calls, over a
// simulated device clock in milliseconds: events complete when the test
// says so (the clock stream's at once, being idle), and
// cuEventElapsedTime refuses an event made without timing or not yet
// complete, as the driver does. It tests Event's arithmetic and
// bookkeeping; the driver calls themselves run only on a GPU
// (bench/cuda-verify.sh). Its state is guarded by mu, as the driver is
// thread-safe; the test takes mu too where it reads or sets events.
type fakeDevice struct {
	mu         sync.Mutex // the events' cleanups destroy them from other goroutines, as the driver allows
	now        float64    // device time, ms
	events     map[uintptr]*fakeEvent
	next       uintptr
	clock      uintptr // the clock stream, once made
	failCreate bool
}

type fakeEvent struct {
	timing, done bool
	at           float64
}

// timing and recordedAt read an event; complete marks it done at device
// time at (its work ran).
func (f *fakeDevice) timing(h uintptr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.events[h] != nil && f.events[h].timing
}

func (f *fakeDevice) recordedAt(h uintptr) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ev := f.events[h]; ev != nil {
		return ev.at, true
	}
	return 0, false
}

func (f *fakeDevice) complete(h uintptr, at float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events[h].done, f.events[h].at = true, at
}

func newFakeDriver(f *fakeDevice) *driverAPI {
	f.events = map[uintptr]*fakeEvent{}
	return &driverAPI{
		cuCtxSetCurrent: func(uintptr) cuResult { return cudaSuccess },
		cuGetErrorName:  func(cuResult, **byte) cuResult { return 1 },
		cuStreamCreate: func(s *uintptr, _ uint32) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.clock = 1000
			*s = f.clock
			return cudaSuccess
		},
		cuEventCreate: func(e *uintptr, flags uint32) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.failCreate {
				return 2
			}
			f.next++
			f.events[f.next] = &fakeEvent{timing: flags&cuEventDisableTiming == 0}
			*e = f.next
			return cudaSuccess
		},
		cuEventDestroy: func(e uintptr) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			delete(f.events, e)
			return cudaSuccess
		},
		cuEventRecord: func(e, s uintptr) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			ev := f.events[e]
			ev.at, ev.done = f.now, s == f.clock
			return cudaSuccess
		},
		cuEventSynchronize: func(uintptr) cuResult { return cudaSuccess },
		cuEventElapsedTime: func(ms *float32, start, end uintptr) cuResult {
			f.mu.Lock()
			defer f.mu.Unlock()
			a, b := f.events[start], f.events[end]
			if a == nil || b == nil || !a.timing || !b.timing {
				return 400 // CUDA_ERROR_INVALID_HANDLE
			}
			if !a.done || !b.done {
				return cudaNotReady
			}
			*ms = float32(b.at - a.at)
			return cudaSuccess
		},
	}
}

// TestEventCompletedAt: a CUDA Event is a gpu.TimedEvent: its completion
// time is its context's anchor time plus the device time since the
// anchor; not ready, never recorded or without an anchor it says false;
// a stale anchor is replaced at the next Record while older events keep
// theirs.
func TestEventCompletedAt(t *testing.T) {
	f := &fakeDevice{}
	drv := newFakeDriver(f)
	g := &gpuCtx{l: &lib{drv: drv}}
	s := &Stream{dev: &Device{g: g}, h: 7}
	e := newEvent(drv)
	if _, ok := e.CompletedAt(); ok {
		t.Fatal("an event never recorded has a completion time")
	}
	f.now = 100
	if err := e.record(s); err != nil {
		t.Fatal(err)
	}
	a := g.anchor
	if at, ok := f.recordedAt(a.ev); a == nil || !ok || at != 100 {
		t.Fatalf("no anchor recorded at the device's time: %+v", a)
	}
	if _, ok := e.CompletedAt(); ok {
		t.Fatal("an event whose work runs has a completion time")
	}
	if !f.timing(e.cur) {
		t.Fatal("the event was made without timing: cuEventElapsedTime would refuse it")
	}
	f.complete(e.cur, 105.25) // the work completed 5.25 ms after the anchor
	got, ok := e.CompletedAt()
	if want := a.at.Add(5250 * time.Microsecond); !ok || !got.Equal(want) {
		t.Fatalf("CompletedAt = %v, %v; want the anchor's time + 5.25 ms = %v", got, ok, want)
	}

	// A stale anchor: the next Record takes a new one; the old event keeps its own.
	a.at = a.at.Add(-anchorAge)
	old, oldAt := a, a.at
	e2 := newEvent(drv)
	f.now = 200
	if err := e2.record(s); err != nil {
		t.Fatal(err)
	}
	if g.anchor == old || e2.anc != g.anchor || e.anc != old {
		t.Fatalf("anchor not renewed after %v: new %p, old %p, events %p %p", anchorAge, g.anchor, old, e2.anc, e.anc)
	}
	f.complete(e2.cur, 201)
	if got, ok := e2.CompletedAt(); !ok || !got.Equal(g.anchor.at.Add(time.Millisecond)) {
		t.Fatalf("after a new anchor: CompletedAt = %v, %v; want its time + 1 ms", got, ok)
	}
	if got, ok := e.CompletedAt(); !ok || !got.Equal(oldAt.Add(5250*time.Microsecond)) {
		t.Fatalf("the older event: CompletedAt = %v, %v; want its own anchor's time + 5.25 ms", got, ok)
	}

	// No anchor can be taken: Record still records, CompletedAt says false.
	e3 := newEvent(drv)
	if err := e3.record(s); err != nil { // makes e3's CUevent
		t.Fatal(err)
	}
	g.anchor.at = g.anchor.at.Add(-anchorAge)
	f.mu.Lock()
	f.failCreate = true
	f.mu.Unlock()
	if err := e3.record(s); err != nil {
		t.Fatalf("a failed anchor failed the Record: %v", err)
	}
	if e3.anc != nil {
		t.Fatal("an event recorded without an anchor kept one")
	}
	f.complete(e3.cur, 300)
	if _, ok := e3.CompletedAt(); ok {
		t.Fatal("an event without an anchor has a completion time")
	}
}
