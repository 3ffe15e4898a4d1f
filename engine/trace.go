package engine

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// The timeline (Options.Trace): a Tracer records what every rank's streams,
// the runners' tier-store moves and the host optimizer did, and when, as
// Chrome trace events (ph "X" complete events, ts and dur in µs), so that
// Perfetto (ui.perfetto.dev) or chrome://tracing can show the overlap of
// compute, collectives and transfers. Off (nil) it costs one nil check per
// hook.
//
// Tracks (pid, tid):
//
//	pid 0         "engine"       tid 0 steps: "step N" from the first rank's
//	                             backward to the last rank's optimizer end
//	pid 1+r       "device r"     tid 1 compute stream: "fwd|bwd <chunk>" from
//	                             the Acquire to the Release of a chunk, as the
//	                             stream runs it; "adam <chunk> (device)"
//	                             tid 2 comm stream: "allgather", "reducescatter",
//	                             "allreduce", "grad to host", "upload"
//	                             tid 3 shard waits: the rank waiting in
//	                             tier.Runner.Use for a shard to reach a tier
//	                             tid 4 optimizer: the rank's optimizer phase
//	                             tid 5 cpu adam: cpuadam on one chunk shard
//	                             tid 200+k host->hbm, 300+k hbm->host: the
//	                             tier store's moves on the device's links
//	pid 1000      "nvme"         tid 100+k nvme->host (reads), 400+k
//	                             host->nvme (writes)
//
// Moves that overlap on one link (several in flight) go to lanes k = 0, 1,
// ... so that no track holds overlapping spans.
//
// How the times are taken: stream spans (compute, comm) are bracketed by
// two gpu.Events recorded on the stream; a watcher goroutine per stream
// (streamClock, trace_clock.go) waits for each event in stream order and
// takes its time: the backend's stamp where the event has one
// (gpu.TimedEvent: the CPU backend stamps it as its stream reaches it),
// else the host clock when the watcher sees it complete (late by the
// watcher's wake-up, never early). The span starts when the stream reached
// its first event (its waits satisfied, the work before it done) and ends
// when the stream has run its work, in the stream's order. Shard waits, cpuadam and the optimizer phase are host
// times around synchronous code on the rank's goroutine. A move spans from
// the runner's Submit (or, when it copies a copy still arriving, from that
// copy's arrival) to its completion (Submit plus tier.Op.Duration); bytes
// are what it put on the link (tier.Op.Bytes), so per link they add up to
// the store's counters.
//
// Not recorded: the model's compute outside a chunk's Acquire..Release (the
// embedding backward, the loss), moves the engine makes outside the
// planners (initial values, Params and Master reads), and individual NVMe
// requests (a move is one span however many requests it takes).
//
// Memory: at most TraceOptions.MaxEvents events are kept; later ones are
// counted in Dropped and the JSON says so.
//
// Overlap (trace_overlap.go) reads the exposed transfer time off the
// events: interval arithmetic on the spans, with no clock and no engine.

// Trace categories (TraceEvent.Cat).
const (
	TraceStep      = "step"
	TraceCompute   = "compute"
	TraceComm      = "comm"
	TraceStall     = "stall"
	TraceMove      = "move"
	TraceOptimizer = "optimizer"
	TraceAdam      = "adam"
)

// Track ids.
const (
	tracePidEngine    = 0
	tracePidNVMe      = 1000
	traceTidSteps     = 0
	traceTidCompute   = 1
	traceTidComm      = 2
	traceTidStall     = 3
	traceTidOptimizer = 4
	traceTidAdam      = 5
	traceTidCopy      = 6
	traceLaneCount    = 100 // lanes per link; more in flight share the last
)

// DefaultTraceMaxEvents is TraceOptions.MaxEvents when unset: about 60 MB
// of events at most.
const DefaultTraceMaxEvents = 1 << 18

// TraceOptions configure a Tracer.
type TraceOptions struct {
	// MaxEvents bounds the events kept (step spans aside); 0 =
	// DefaultTraceMaxEvents.
	MaxEvents int
}

// Validate says what is wrong with o.
func (o TraceOptions) Validate() error {
	if o.MaxEvents < 0 {
		return fmt.Errorf("engine: trace max events %d must be >= 0", o.MaxEvents)
	}
	return nil
}

// TraceEvent is one recorded span ("X") or instant ("i"). Start and Dur
// are since the Tracer was made.
type TraceEvent struct {
	Name     string
	Cat      string // TraceStep, TraceCompute, ...
	Phase    byte   // 'X' or 'i'
	Pid, Tid int
	Start    time.Duration
	Dur      time.Duration
	Rank     int        // the device; -1 for the engine and NVMe tracks
	Step     int64      // TraceStep events
	Link     shard.Link // TraceMove events
	Bytes    int64      // TraceMove events: bytes put on Link
	Args     map[string]any
}

// End is Start + Dur.
func (ev TraceEvent) End() time.Duration { return ev.Start + ev.Dur }

// Tracer records one Engine's timeline (Options.Trace). Its methods are
// safe for concurrent use: the ranks' goroutines, their stream watchers,
// the runners and the host optimizer record into it.
type Tracer struct {
	opts TraceOptions
	t0   time.Time

	mu       sync.Mutex
	owner    *Engine
	devNames []string
	events   []TraceEvent
	dropped  int64
	steps    map[int64]*traceStep
}

type traceStep struct {
	begin, end time.Duration
	ended      bool
}

// NewTracer returns a Tracer whose clock starts now; hand it to one Engine
// through Options.Trace.
func NewTracer(o TraceOptions) (*Tracer, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.MaxEvents == 0 {
		o.MaxEvents = DefaultTraceMaxEvents
	}
	return &Tracer{opts: o, t0: time.Now(), steps: map[int64]*traceStep{}}, nil
}

// since is t on the tracer's clock.
func (t *Tracer) since(at time.Time) time.Duration { return at.Sub(t.t0) }

// attach binds the tracer to e's rank idx on dev (newRank).
func (t *Tracer) attach(e *Engine, idx int, dev gpu.Device) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.owner != nil && t.owner != e {
		return errors.New("engine: Options.Trace: the Tracer records another engine (make one per engine)")
	}
	t.owner = e
	for len(t.devNames) <= idx {
		t.devNames = append(t.devNames, "")
	}
	t.devNames[idx] = dev.Name()
	return nil
}

func (t *Tracer) add(ev TraceEvent) {
	if t == nil {
		return // measuring without a timeline (rankTrace.log only)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.events) >= t.opts.MaxEvents {
		t.dropped++
		return
	}
	t.events = append(t.events, ev)
}

// span records a host-timed span of rank r (a tid of its device).
func (t *Tracer) span(r, tid int, cat, name string, from time.Time, dur time.Duration, args map[string]any) {
	if t == nil {
		return
	}
	t.add(TraceEvent{Name: name, Cat: cat, Phase: 'X', Pid: 1 + r, Tid: tid, Start: t.since(from), Dur: dur, Rank: r, Args: args})
}

func (t *Tracer) stepBegin(step int64, at time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.since(at)
	s := t.steps[step]
	if s == nil {
		t.steps[step] = &traceStep{begin: ts}
		return
	}
	s.begin = min(s.begin, ts)
}

func (t *Tracer) stepEnd(step int64, at time.Time) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.since(at)
	if s := t.steps[step]; s != nil {
		s.end, s.ended = max(s.end, ts), true
	}
}

// stall records the rank's wait in tier.Runner.Use for access a.
func (t *Tracer) stall(r int, a shard.Access, from time.Time, dur time.Duration) {
	if t == nil {
		return
	}
	t.span(r, traceTidStall, TraceStall, fmt.Sprintf("wait %s in %s", a.Key, a.Tier), from, dur,
		map[string]any{"key": a.Key.String(), "tier": a.Tier.String(), "phase": a.Phase.String(), "kind": a.Kind.String()})
}

// move records a completed tier-store move of rank r's shard that put
// bytes on the link from -> to (two hops: both links), or failed.
func (t *Tracer) move(r int, m shard.Move, from time.Time, dur time.Duration, bytes, hbmBytes int64, err error) {
	reason := m.Reason.String()
	if m.WriteBehind {
		reason = "writebehind"
	}
	one := func(l shard.Link, b int64, hops string) {
		pid := 1 + r
		if l == shard.NVMeToHost || l == shard.HostToNVMe {
			pid = tracePidNVMe
		}
		args := map[string]any{"key": m.Key.String(), "bytes": b, "reason": reason, "from": m.From.String(), "to": m.To.String()}
		if hops != "" {
			args["hops"] = hops
		}
		if err != nil {
			args["error"] = err.Error()
		}
		t.add(TraceEvent{Name: fmt.Sprintf("%s %s", reason, m.Key), Cat: TraceMove, Phase: 'X', Pid: pid, Tid: traceLinkTid(l, 0),
			Start: t.since(from), Dur: dur, Rank: r, Link: l, Bytes: b, Args: args})
	}
	if l, ok := shard.LinkOf(m.From, m.To); ok {
		one(l, bytes, "")
		return
	}
	// HBM <-> NVMe through a host staging buffer: the store times the move
	// as a whole, so both links get the whole span, each with its bytes
	// (a failed move may have put none on either).
	hbmBytes = min(hbmBytes, bytes)
	switch {
	case m.From == shard.HBM && m.To == shard.NVMe:
		one(shard.HBMToHost, hbmBytes, "hbm->host->nvme")
		one(shard.HostToNVMe, bytes-hbmBytes, "hbm->host->nvme")
	case m.From == shard.NVMe && m.To == shard.HBM:
		one(shard.NVMeToHost, bytes-hbmBytes, "nvme->host->hbm")
		one(shard.HostToHBM, hbmBytes, "nvme->host->hbm")
	}
}

func traceLinkTid(l shard.Link, lane int) int { return 100*(int(l)+1) + min(lane, traceLaneCount-1) }

// Dropped is the number of events not kept because MaxEvents was reached.
func (t *Tracer) Dropped() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropped
}

// Events returns what is recorded so far, sorted by start: the spans and
// a "step N" span (and an instant at its start) per step, moves placed in
// lanes. Spans still on a stream not yet completed are not in it (see
// Engine.WriteTrace).
func (t *Tracer) Events() []TraceEvent {
	t.mu.Lock()
	evs := slices.Clone(t.events)
	steps := make([]int64, 0, len(t.steps))
	for s := range t.steps {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	for _, s := range steps {
		st := t.steps[s]
		name := fmt.Sprintf("step %d", s)
		evs = append(evs, TraceEvent{Name: name, Cat: TraceStep, Phase: 'i', Pid: tracePidEngine, Tid: traceTidSteps, Start: st.begin, Rank: -1, Step: s})
		if st.ended {
			evs = append(evs, TraceEvent{Name: name, Cat: TraceStep, Phase: 'X', Pid: tracePidEngine, Tid: traceTidSteps,
				Start: st.begin, Dur: max(st.end-st.begin, 0), Rank: -1, Step: s})
		}
	}
	t.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b TraceEvent) int { return cmp.Compare(a.Start, b.Start) })
	assignLanes(evs)
	return evs
}

// assignLanes puts each move in the first lane of its link (per pid) free
// at its start; evs is sorted by start.
func assignLanes(evs []TraceEvent) {
	type track struct{ pid, link int }
	lanes := map[track][]time.Duration{} // the end of each lane's last span
	for i := range evs {
		ev := &evs[i]
		if ev.Cat != TraceMove {
			continue
		}
		k := track{ev.Pid, int(ev.Link)}
		ends := lanes[k]
		lane := slices.IndexFunc(ends, func(end time.Duration) bool { return end <= ev.Start })
		if lane < 0 {
			lane = len(ends)
			ends = append(ends, 0)
		}
		ends[lane] = ev.End()
		lanes[k] = ends
		ev.Tid = traceLinkTid(ev.Link, lane)
	}
}

// WriteJSON writes the recorded events as a Chrome trace-event JSON
// object ({"traceEvents": [...]}) with the process and thread names.
func (t *Tracer) WriteJSON(w io.Writer) error {
	evs := t.Events()
	t.mu.Lock()
	names := slices.Clone(t.devNames)
	dropped, maxEvents := t.dropped, t.opts.MaxEvents
	t.mu.Unlock()

	type jsonEvent struct {
		Name  string         `json:"name"`
		Cat   string         `json:"cat,omitempty"`
		Ph    string         `json:"ph"`
		Ts    float64        `json:"ts"`
		Dur   *float64       `json:"dur,omitempty"`
		Pid   int            `json:"pid"`
		Tid   int            `json:"tid"`
		Scope string         `json:"s,omitempty"`
		Args  map[string]any `json:"args,omitempty"`
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	out := make([]jsonEvent, 0, len(evs)+64)
	type tk struct{ pid, tid int }
	seen := map[tk]bool{{tracePidEngine, traceTidSteps}: true}
	pids := map[int]bool{tracePidEngine: true}
	for _, ev := range evs {
		seen[tk{ev.Pid, ev.Tid}] = true
		pids[ev.Pid] = true
		je := jsonEvent{Name: ev.Name, Cat: ev.Cat, Ph: string(ev.Phase), Ts: us(ev.Start), Pid: ev.Pid, Tid: ev.Tid, Args: ev.Args}
		if ev.Phase == 'X' {
			d := us(ev.Dur)
			je.Dur = &d
		} else {
			je.Scope = "g"
		}
		if ev.Cat == TraceStep {
			je.Args = map[string]any{"step": ev.Step}
		}
		out = append(out, je)
	}
	if dropped > 0 {
		out = append(out, jsonEvent{Name: fmt.Sprintf("trace truncated: %d events dropped after the first %d (TraceOptions.MaxEvents)", dropped, maxEvents),
			Ph: "i", Ts: 0, Pid: tracePidEngine, Tid: traceTidSteps, Scope: "g"})
	}
	meta := func(name string, pid, tid int, args map[string]any) {
		out = append(out, jsonEvent{Name: name, Ph: "M", Pid: pid, Tid: tid, Args: args})
	}
	for _, pid := range slices.Sorted(mapKeys(pids)) {
		meta("process_name", pid, 0, map[string]any{"name": tracePidName(pid, names)})
		meta("process_sort_index", pid, 0, map[string]any{"sort_index": pid})
	}
	for _, k := range slices.SortedFunc(mapKeys(seen), func(a, b tk) int {
		return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.tid, b.tid))
	}) {
		meta("thread_name", k.pid, k.tid, map[string]any{"name": traceTidName(k.pid, k.tid)})
		meta("thread_sort_index", k.pid, k.tid, map[string]any{"sort_index": k.tid})
	}
	bw := bufio.NewWriter(w)
	doc := struct {
		TraceEvents     []jsonEvent    `json:"traceEvents"`
		DisplayTimeUnit string         `json:"displayTimeUnit"`
		OtherData       map[string]any `json:"otherData"`
	}{out, "ms", map[string]any{"producer": "strata", "dropped_events": dropped, "max_events": maxEvents}}
	if err := json.NewEncoder(bw).Encode(doc); err != nil {
		return fmt.Errorf("engine: write trace: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("engine: write trace: %w", err)
	}
	return nil
}

func mapKeys[K comparable](m map[K]bool) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func tracePidName(pid int, devNames []string) string {
	switch {
	case pid == tracePidEngine:
		return "engine"
	case pid == tracePidNVMe:
		return "nvme"
	case pid-1 < len(devNames) && devNames[pid-1] != "":
		return fmt.Sprintf("device %d (%s)", pid-1, devNames[pid-1])
	}
	return fmt.Sprintf("device %d", pid-1)
}

// traceTidName names a known track, or returns "".
func traceTidName(pid, tid int) string {
	if pid == tracePidEngine {
		if tid == traceTidSteps {
			return "steps"
		}
		return ""
	}
	if tid >= 100 {
		l, lane := shard.Link(tid/100-1), tid%100
		if int(l) >= shard.LinkCount {
			return ""
		}
		nvmeLink := l == shard.NVMeToHost || l == shard.HostToNVMe
		if nvmeLink != (pid == tracePidNVMe) {
			return ""
		}
		return fmt.Sprintf("%s #%d", l, lane)
	}
	if pid == tracePidNVMe {
		return ""
	}
	switch tid {
	case traceTidCompute:
		return "compute stream"
	case traceTidComm:
		return "comm stream"
	case traceTidStall:
		return "shard waits"
	case traceTidOptimizer:
		return "optimizer"
	case traceTidAdam:
		return "cpu adam"
	case traceTidCopy:
		return "copy streams"
	}
	return ""
}

// WriteTrace waits for every rank's streams, lets the moves in flight
// complete (as Params does), and writes the timeline recorded so far
// (Tracer.WriteJSON), also after a failed step; it fails when the engine
// runs without Options.Trace. Call it between steps (or after Close), from
// the goroutine that calls Step.
func (e *Engine) WriteTrace(w io.Writer) error {
	t := e.opts.Trace
	if t == nil {
		return errors.New("engine: write trace: the engine runs without Options.Trace")
	}
	e.flushTrace()
	return t.WriteJSON(w)
}

// flushTrace brings every span that has happened into the tracer. It
// ignores the streams' and the runners' errors: a failed step has
// returned them already, and its timeline is worth writing.
func (e *Engine) flushTrace() {
	if e.closed || e.opts.Trace == nil {
		return
	}
	e.settle() // the pending host updates' cpuadam spans belong in it
	e.parallel(func(r *rank) error { return r.sync() })
	for _, r := range e.ranks {
		r.tr.flush()
	}
	e.tiers.cycle()
}
