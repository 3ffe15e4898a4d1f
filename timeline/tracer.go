package timeline

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

// Trace categories (Event.Cat).
const (
	CatStep      = "step"
	CatCompute   = "compute"
	CatComm      = "comm"
	CatStall     = "stall"
	CatMove      = "move"
	CatOptimizer = "optimizer"
	CatAdam      = "adam"
	// CatOptWait is cpuadam's wait for a chunk's optimizer state (master,
	// m, v, the gradient, the new param's host copy) to reach host memory:
	// the rank declared the accesses and went on (tier.Runner.Begin), so
	// it is not the devices' stall.
	CatOptWait = "optwait"
)

// Track ids.
const (
	PidEngine    = 0
	PidNVMe      = 1000
	TidSteps     = 0
	TidCompute   = 1
	TidComm      = 2
	TidStall     = 3
	TidOptimizer = 4
	TidAdam      = 5
	TidCopy      = 6
	TidOptWait   = 7
	laneCount    = 100 // lanes per link; more in flight share the last
)

// DefaultMaxEvents is Options.MaxEvents when unset: about 60 MB
// of events at most.
const DefaultMaxEvents = 1 << 18

// Options configure a Tracer.
type Options struct {
	// MaxEvents bounds the events kept (step spans aside); 0 =
	// DefaultMaxEvents.
	MaxEvents int
}

// Validate says what is wrong with o.
func (o Options) Validate() error {
	if o.MaxEvents < 0 {
		return fmt.Errorf("engine: trace max events %d must be >= 0", o.MaxEvents)
	}
	return nil
}

// Event is one recorded span ("X") or instant ("i"). Start and Dur
// are since the Tracer was made.
type Event struct {
	Name     string
	Cat      string // CatStep, CatCompute, ...
	Phase    byte   // 'X' or 'i'
	Pid, Tid int
	Start    time.Duration
	Dur      time.Duration
	Rank     int        // the device; -1 for the engine and NVMe tracks
	Step     int64      // CatStep events
	Link     shard.Link // CatMove events
	Bytes    int64      // CatMove events: bytes put on Link
	Args     map[string]any
}

// End is Start + Dur.
func (ev Event) End() time.Duration { return ev.Start + ev.Dur }

// Tracer records one Engine's timeline (Options.Trace). Its methods are
// safe for concurrent use: the ranks' goroutines, their stream watchers,
// the runners and the host optimizer record into it.
type Tracer struct {
	opts Options
	t0   time.Time

	mu       sync.Mutex
	owner    any // the engine recording into it
	devNames []string
	events   []Event
	dropped  int64
	steps    map[int64]*traceStep
}

type traceStep struct {
	begin, end time.Duration
	ended      bool
}

// NewTracer returns a Tracer whose clock starts now; hand it to one Engine
// through Options.Trace.
func NewTracer(o Options) (*Tracer, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.MaxEvents == 0 {
		o.MaxEvents = DefaultMaxEvents
	}
	return &Tracer{opts: o, t0: time.Now(), steps: map[int64]*traceStep{}}, nil
}

// since is t on the tracer's clock.
func (t *Tracer) since(at time.Time) time.Duration { return at.Sub(t.t0) }

// attach binds the tracer to owner's rank idx on dev (NewRecorder).
func (t *Tracer) attach(owner any, idx int, dev gpu.Device) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.owner != nil && t.owner != owner {
		return errors.New("engine: Options.Trace: the Tracer records another engine (make one per engine)")
	}
	t.owner = owner
	for len(t.devNames) <= idx {
		t.devNames = append(t.devNames, "")
	}
	t.devNames[idx] = dev.Name()
	return nil
}

func (t *Tracer) add(ev Event) {
	if t == nil {
		return // measuring without a timeline (Recorder's busy log only)
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
	t.add(Event{Name: name, Cat: cat, Phase: 'X', Pid: 1 + r, Tid: tid, Start: t.since(from), Dur: dur, Rank: r, Args: args})
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
	tid, cat := TidStall, CatStall
	if a.Phase == shard.Optimizer {
		tid, cat = TidOptWait, CatOptWait
	}
	t.span(r, tid, cat, fmt.Sprintf("wait %s in %s", a.Key, a.Tier), from, dur,
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
			pid = PidNVMe
		}
		args := map[string]any{"key": m.Key.String(), "bytes": b, "reason": reason, "from": m.From.String(), "to": m.To.String()}
		if hops != "" {
			args["hops"] = hops
		}
		if err != nil {
			args["error"] = err.Error()
		}
		t.add(Event{Name: fmt.Sprintf("%s %s", reason, m.Key), Cat: CatMove, Phase: 'X', Pid: pid, Tid: linkTid(l, 0),
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

func linkTid(l shard.Link, lane int) int { return 100*(int(l)+1) + min(lane, laneCount-1) }

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
func (t *Tracer) Events() []Event {
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
		evs = append(evs, Event{Name: name, Cat: CatStep, Phase: 'i', Pid: PidEngine, Tid: TidSteps, Start: st.begin, Rank: -1, Step: s})
		if st.ended {
			evs = append(evs, Event{Name: name, Cat: CatStep, Phase: 'X', Pid: PidEngine, Tid: TidSteps,
				Start: st.begin, Dur: max(st.end-st.begin, 0), Rank: -1, Step: s})
		}
	}
	t.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b Event) int { return cmp.Compare(a.Start, b.Start) })
	assignLanes(evs)
	return evs
}

// assignLanes puts each move in the first lane of its link (per pid) free
// at its start; evs is sorted by start.
func assignLanes(evs []Event) {
	type track struct{ pid, link int }
	lanes := map[track][]time.Duration{} // the end of each lane's last span
	for i := range evs {
		ev := &evs[i]
		if ev.Cat != CatMove {
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
		ev.Tid = linkTid(ev.Link, lane)
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
	seen := map[tk]bool{{PidEngine, TidSteps}: true}
	pids := map[int]bool{PidEngine: true}
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
		if ev.Cat == CatStep {
			je.Args = map[string]any{"step": ev.Step}
		}
		out = append(out, je)
	}
	if dropped > 0 {
		out = append(out, jsonEvent{Name: fmt.Sprintf("trace truncated: %d events dropped after the first %d (Options.MaxEvents)", dropped, maxEvents),
			Ph: "i", Ts: 0, Pid: PidEngine, Tid: TidSteps, Scope: "g"})
	}
	meta := func(name string, pid, tid int, args map[string]any) {
		out = append(out, jsonEvent{Name: name, Ph: "M", Pid: pid, Tid: tid, Args: args})
	}
	for _, pid := range slices.Sorted(mapKeys(pids)) {
		meta("process_name", pid, 0, map[string]any{"name": processName(pid, names)})
		meta("process_sort_index", pid, 0, map[string]any{"sort_index": pid})
	}
	for _, k := range slices.SortedFunc(mapKeys(seen), func(a, b tk) int {
		return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.tid, b.tid))
	}) {
		meta("thread_name", k.pid, k.tid, map[string]any{"name": TrackName(k.pid, k.tid)})
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

func processName(pid int, devNames []string) string {
	switch {
	case pid == PidEngine:
		return "engine"
	case pid == PidNVMe:
		return "nvme"
	case pid-1 < len(devNames) && devNames[pid-1] != "":
		return fmt.Sprintf("device %d (%s)", pid-1, devNames[pid-1])
	}
	return fmt.Sprintf("device %d", pid-1)
}

// TrackName names a known track, or returns "".
func TrackName(pid, tid int) string {
	if pid == PidEngine {
		if tid == TidSteps {
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
		if nvmeLink != (pid == PidNVMe) {
			return ""
		}
		return fmt.Sprintf("%s #%d", l, lane)
	}
	if pid == PidNVMe {
		return ""
	}
	switch tid {
	case TidCompute:
		return "compute stream"
	case TidComm:
		return "comm stream"
	case TidStall:
		return "shard waits"
	case TidOptimizer:
		return "optimizer"
	case TidAdam:
		return "cpu adam"
	case TidCopy:
		return "copy streams"
	case TidOptWait:
		return "optimizer-state waits"
	}
	return ""
}
