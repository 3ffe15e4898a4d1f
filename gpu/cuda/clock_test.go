package cuda

import (
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
// (bench/cuda-verify.sh).
type fakeDevice struct {
	now        float64 // device time, ms
	events     map[uintptr]*fakeEvent
	next       uintptr
	clock      uintptr // the clock stream, once made
	failCreate bool
}

type fakeEvent struct {
	timing, done bool
	at           float64
}

func newFakeDriver(f *fakeDevice) *driverAPI {
	f.events = map[uintptr]*fakeEvent{}
	return &driverAPI{
		cuCtxSetCurrent: func(uintptr) cuResult { return cudaSuccess },
		cuGetErrorName:  func(cuResult, **byte) cuResult { return 1 },
		cuStreamCreate: func(s *uintptr, _ uint32) cuResult {
			f.clock = 1000
			*s = f.clock
			return cudaSuccess
		},
		cuEventCreate: func(e *uintptr, flags uint32) cuResult {
			if f.failCreate {
				return 2
			}
			f.next++
			f.events[f.next] = &fakeEvent{timing: flags&cuEventDisableTiming == 0}
			*e = f.next
			return cudaSuccess
		},
		cuEventDestroy: func(e uintptr) cuResult { delete(f.events, e); return cudaSuccess },
		cuEventRecord: func(e, s uintptr) cuResult {
			ev := f.events[e]
			ev.at, ev.done = f.now, s == f.clock
			return cudaSuccess
		},
		cuEventSynchronize: func(uintptr) cuResult { return cudaSuccess },
		cuEventElapsedTime: func(ms *float32, start, end uintptr) cuResult {
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
	if a == nil || f.events[a.ev] == nil || f.events[a.ev].at != 100 {
		t.Fatalf("no anchor recorded at the device's time: %+v", a)
	}
	if _, ok := e.CompletedAt(); ok {
		t.Fatal("an event whose work runs has a completion time")
	}
	ev := f.events[e.cur]
	if !ev.timing {
		t.Fatal("the event was made without timing: cuEventElapsedTime would refuse it")
	}
	ev.done, ev.at = true, 105.25 // the work completed 5.25 ms after the anchor
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
	f.events[e2.cur].done, f.events[e2.cur].at = true, 201
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
	f.failCreate = true
	if err := e3.record(s); err != nil {
		t.Fatalf("a failed anchor failed the Record: %v", err)
	}
	if e3.anc != nil {
		t.Fatal("an event recorded without an anchor kept one")
	}
	f.events[e3.cur].done = true
	if _, ok := e3.CompletedAt(); ok {
		t.Fatal("an event without an anchor has a completion time")
	}
}
