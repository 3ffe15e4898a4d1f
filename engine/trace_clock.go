package engine

import (
	"sync"
	"time"

	"github.com/strata-ai/strata/gpu"
)

// rankTrace is a rank's part of the tracer: the watchers of its two
// streams, and the log of the host optimizer's overlap (busyLog). nil when
// the engine runs without a Tracer and without the host optimizer; t is
// nil when only the overlap is measured (no timeline).
type rankTrace struct {
	t        *Tracer
	log      *busyLog // the compute stream's, cpuadam's and the optimizer-state waits' spans
	r        int
	dev      gpu.Device
	compute  *streamClock // the rank's s
	comm     *streamClock // the rank's cs
	copy     *streamClock // the rank's up and down (uploads, downloads)
	computeC gpu.Event    // the open compute span's first event (Acquire)
	stepAt   time.Time
}

func newRankTrace(t *Tracer, e *Engine, r int, dev gpu.Device) (*rankTrace, error) {
	if t != nil {
		if err := t.attach(e, r, dev); err != nil {
			return nil, err
		}
	}
	log := &busyLog{t0: e.t0}
	compute := newStreamClock(t, r, traceTidCompute)
	compute.log = log.compute
	return &rankTrace{t: t, log: log, r: r, dev: dev, compute: compute, comm: newStreamClock(t, r, traceTidComm), copy: newStreamClock(t, r, traceTidCopy)}, nil
}

// mark records a new event on s.
func (rt *rankTrace) mark(s gpu.Stream) gpu.Event {
	ev := rt.dev.NewEvent()
	s.Record(ev)
	return ev
}

func (rt *rankTrace) flush() {
	rt.compute.flush()
	rt.comm.flush()
	rt.copy.flush()
}

func (rt *rankTrace) close() {
	rt.compute.close()
	rt.comm.close()
	rt.copy.close()
}

// streamClock times spans of one stream: a goroutine waits for each span's
// two events in the order they were recorded (the stream's order) and takes
// the time each completed: the backend's stamp (gpu.TimedEvent: the CPU
// backend's), else the host clock when the goroutine sees it.
type streamClock struct {
	t        *Tracer
	rank     int
	tid      int
	mu       sync.Mutex
	cond     *sync.Cond
	queue    []streamSpan
	inFlight bool // the goroutine holds a span it has not recorded yet
	closed   bool
	log      func(t0, t1 time.Time) // also given every span's times (the compute stream's busy time); nil: none
	stopped  chan struct{}
}

type streamSpan struct {
	from, to  gpu.Event
	cat, name string
	args      map[string]any
}

func newStreamClock(t *Tracer, r, tid int) *streamClock {
	c := &streamClock{t: t, rank: r, tid: tid, stopped: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	go c.loop()
	return c
}

// span queues a span from event from to event to, both recorded on the
// clock's stream, from after every span queued before.
func (c *streamClock) span(from, to gpu.Event, cat, name string, args map[string]any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		panic("engine: trace span after close")
	}
	if c.t == nil && c.log == nil {
		return // no timeline and no busy log: nothing would record it
	}
	c.queue = append(c.queue, streamSpan{from, to, cat, name, args})
	c.cond.Broadcast()
}

func (c *streamClock) loop() {
	defer close(c.stopped)
	c.mu.Lock()
	for {
		for len(c.queue) == 0 && !c.closed {
			c.cond.Wait()
		}
		if len(c.queue) == 0 {
			c.mu.Unlock()
			return
		}
		sp := c.queue[0]
		c.queue[0] = streamSpan{}
		c.queue = c.queue[1:]
		c.inFlight = true
		c.mu.Unlock()
		sp.from.Synchronize()
		t0 := completedAt(sp.from)
		sp.to.Synchronize()
		t1 := completedAt(sp.to)
		c.t.span(c.rank, c.tid, sp.cat, sp.name, t0, t1.Sub(t0), sp.args)
		if c.log != nil {
			c.log(t0, t1)
		}
		c.mu.Lock()
		c.inFlight = false
		c.cond.Broadcast()
	}
}

// completedAt is when ev (complete) completed: the backend's stamp where
// it has one (gpu.TimedEvent), else now, which is late by the clock's
// wake-up.
func completedAt(ev gpu.Event) time.Time {
	if te, ok := ev.(gpu.TimedEvent); ok {
		if t, ok := te.CompletedAt(); ok {
			return t
		}
	}
	return time.Now()
}

// flush waits until every queued span is recorded (its events completed).
func (c *streamClock) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.queue) > 0 || c.inFlight {
		c.cond.Wait()
	}
}

// close records what is queued and stops the goroutine.
func (c *streamClock) close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.cond.Broadcast()
	}
	c.mu.Unlock()
	<-c.stopped
}
