package timeline

import (
	"sync"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Recorder is one rank's part of a timeline: the clocks of its compute,
// comm and copy streams, its host-timed spans (cpuadam, the optimizer
// phase, shard waits, tier-store moves) and the busy log the host
// optimizer's overlap figures read (Take). With a nil Tracer it keeps the
// busy log only. Every method of a nil *Recorder does nothing (Mark
// returns nil, Now the zero time, Take zero): the engine calls it
// unguarded, and without a timeline and a host optimizer it holds none.
type Recorder struct {
	t       *Tracer
	log     *busyLog // the compute stream's, cpuadam's and the optimizer-state waits' spans
	r       int
	dev     gpu.Device
	compute *streamClock // the rank's compute stream
	comm    *streamClock // the rank's comm stream
	copy    *streamClock // the rank's up and down streams (uploads, downloads)
	open    gpu.Event    // the open compute span's first event (Begin)
}

// NewRecorder makes rank r's recorder on dev, recording into t (nil: the
// busy log only) for owner (a Tracer serves one owner: the engine), its
// busy log on the clock that starts at t0.
func NewRecorder(t *Tracer, owner any, r int, dev gpu.Device, t0 time.Time) (*Recorder, error) {
	if t != nil {
		if err := t.attach(owner, r, dev); err != nil {
			return nil, err
		}
	}
	log := &busyLog{t0: t0}
	compute := newStreamClock(t, r, TidCompute)
	compute.log = log.compute
	return &Recorder{t: t, log: log, r: r, dev: dev, compute: compute, comm: newStreamClock(t, r, TidComm), copy: newStreamClock(t, r, TidCopy)}, nil
}

// Label names a stream span of a chunk without building the name: the
// span is named "Op Chunk", then " (Note)" when Note is set, with the args
// chunk (Index), pass (when Pass is set) and micro (when HasMicro). The
// name and args are made when the span is recorded, not when it is
// queued, and not at all without a Tracer.
type Label struct {
	Op, Chunk, Note, Pass string
	Index, Micro          int
	HasMicro              bool
}

func (l Label) name() string {
	n := l.Op + " " + l.Chunk
	if l.Note != "" {
		n += " (" + l.Note + ")"
	}
	return n
}

func (l Label) args() map[string]any {
	a := map[string]any{"chunk": l.Index}
	if l.Pass != "" {
		a["pass"] = l.Pass
	}
	if l.HasMicro {
		a["micro"] = l.Micro
	}
	return a
}

// Mark records a new event on s; nil on a nil recorder.
func (rt *Recorder) Mark(s gpu.Stream) gpu.Event {
	if rt == nil {
		return nil
	}
	ev := rt.dev.NewEvent()
	s.Record(ev)
	return ev
}

// Compute queues a span of the compute stream from event from to event to.
func (rt *Recorder) Compute(from, to gpu.Event, l Label) {
	if rt != nil {
		rt.compute.span(from, to, CatCompute, l)
	}
}

// Comm queues a span of the comm stream from event from to event to.
func (rt *Recorder) Comm(from, to gpu.Event, l Label) {
	if rt != nil {
		rt.comm.span(from, to, CatComm, l)
	}
}

// Copy queues a span of a copy stream (uploads, downloads) from event
// from to event to.
func (rt *Recorder) Copy(from, to gpu.Event, l Label) {
	if rt != nil {
		rt.copy.span(from, to, CatComm, l)
	}
}

// Begin opens the compute span of a chunk just acquired on s.
func (rt *Recorder) Begin(s gpu.Stream) {
	if rt != nil {
		rt.open = rt.Mark(s)
	}
}

// End closes the compute span Begin opened, if one is open, on s.
func (rt *Recorder) End(s gpu.Stream, l Label) {
	if rt != nil && rt.open != nil {
		rt.compute.span(rt.open, rt.Mark(s), CatCompute, l)
		rt.open = nil
	}
}

// Drop forgets the open compute span (a failed pass).
func (rt *Recorder) Drop() {
	if rt != nil {
		rt.open = nil
	}
}

// Now is the time when the recorder is on, else zero.
func (rt *Recorder) Now() time.Time {
	if rt == nil {
		return time.Time{}
	}
	return time.Now()
}

// StepBegin marks that the rank began step now.
func (rt *Recorder) StepBegin(step int64) {
	if rt != nil {
		rt.t.stepBegin(step, time.Now())
	}
}

// Adam records cpuadam's run on chunk index (named chunk, elems elements
// of the rank's shard), begun at t0 (Now).
func (rt *Recorder) Adam(chunk string, index, elems int, t0 time.Time) {
	if rt == nil {
		return
	}
	t1 := time.Now()
	if rt.t != nil {
		rt.t.span(rt.r, TidAdam, CatAdam, "adam "+chunk, t0, t1.Sub(t0), map[string]any{"chunk": index, "elems": elems})
	}
	rt.log.put(&rt.log.adam, t0, t1)
}

// Optimizer records the rank's optimizer span named name, begun at t0
// (Now), and ends step there.
func (rt *Recorder) Optimizer(name string, step int64, t0 time.Time) {
	if rt == nil {
		return
	}
	t1 := time.Now()
	rt.t.span(rt.r, TidOptimizer, CatOptimizer, name, t0, t1.Sub(t0), nil)
	rt.t.stepEnd(step, t1)
}

// Stall records the rank's wait in tier.Runner.Use for access a; an
// optimizer-phase wait also goes into the busy log.
func (rt *Recorder) Stall(a shard.Access, start time.Time, waited time.Duration) {
	if rt == nil {
		return
	}
	rt.t.stall(rt.r, a, start, waited)
	if a.Phase == shard.Optimizer {
		rt.log.put(&rt.log.wait, start, start.Add(waited))
	}
}

// Move records a completed tier-store move of the rank's shard that put
// bytes on the link (hbmBytes of them on the HBM side of a move through
// the host), or failed.
func (rt *Recorder) Move(m shard.Move, start time.Time, dur time.Duration, bytes, hbmBytes int64, err error) {
	if rt != nil && rt.t != nil {
		rt.t.move(rt.r, m, start, dur, bytes, hbmBytes, err)
	}
}

// Take flushes the compute stream's clock (the caller has synchronized
// the stream) and returns the host optimizer's figures since the last
// Take.
func (rt *Recorder) Take() Exposure {
	if rt == nil {
		return Exposure{}
	}
	rt.compute.flush()
	return rt.log.take()
}

// Flush waits until every span queued on the rank's streams is recorded.
func (rt *Recorder) Flush() {
	if rt == nil {
		return
	}
	rt.compute.flush()
	rt.comm.flush()
	rt.copy.flush()
}

// Close records what is queued and stops the clocks.
func (rt *Recorder) Close() {
	if rt == nil {
		return
	}
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
	from, to gpu.Event
	cat      string
	label    Label
}

func newStreamClock(t *Tracer, r, tid int) *streamClock {
	c := &streamClock{t: t, rank: r, tid: tid, stopped: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	go c.loop()
	return c
}

// span queues a span from event from to event to, both recorded on the
// clock's stream, from after every span queued before.
func (c *streamClock) span(from, to gpu.Event, cat string, l Label) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		panic("engine: trace span after close")
	}
	if c.t == nil && c.log == nil {
		return // no timeline and no busy log: nothing would record it
	}
	c.queue = append(c.queue, streamSpan{from, to, cat, l})
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
		if c.t != nil {
			c.t.span(c.rank, c.tid, sp.cat, sp.label.name(), t0, t1.Sub(t0), sp.label.args())
		}
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
