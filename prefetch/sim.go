package prefetch

import (
	"container/heap"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/strata-ai/strata/shard"
)

//go:generate go tool stringer -type=Outcome -linecomment -output=outcome_string.go

// Outcome is how an access found its shard.
type Outcome uint8

const (
	// Hit: ready when the access began
	Hit Outcome = iota // hit
	// Late: a prefetch was under way
	Late // late
	// Miss: fetched on demand
	Miss // miss
	// Dependent: its prefetch started as soon as its data existed (Stats.Dependent)
	Dependent // dependent
)

// ScheduledMove is a move of the simulated timeline. Seq numbers order all
// events of a Schedule (moves and accesses) as the simulation applied them.
type ScheduledMove struct {
	shard.Move
	Step               int
	Issue, Start, Done time.Duration // Start waits for the link; instant moves have all three equal
	IssueSeq, DoneSeq  int
}

// ScheduledAccess is an access of the simulated timeline.
type ScheduledAccess struct {
	shard.Access
	Step, Index int
	// Deadline is when the access would begin with no stall at all: the sum
	// of the compute of every access before it.
	Deadline           time.Duration
	Start, Ready, End  time.Duration // Ready-Start is the stall; End is its Release
	StartSeq, ReadySeq int
	EndSeq             int
	Outcome            Outcome
}

// Schedule is the simulated timeline of a run of the planner.
type Schedule struct {
	Options  Options
	Moves    []ScheduledMove
	Accesses []ScheduledAccess
	Stats    Stats
	// Stall is the predicted total time the compute waited.
	Stall time.Duration
	// StepEnd[i] is when step i ended.
	StepEnd []time.Duration
	stepSeq []int
	// PeakBytes and BudgetBytes per pool name ("hbm of rank 0", "host", "nvme").
	PeakBytes   map[string]int64
	BudgetBytes map[string]int64
	// Rerecorded lists the steps after which the trace was replaced because the step diverged.
	Rerecorded []int
}

// Plan simulates stepCount steps of tr from the residency res: the planner
// knows the trace from the start (the first, recording step is over) and
// knows that nothing follows the last step. The engine is modeled as one
// compute stream that runs the accesses in order and waits for a shard that
// is not ready, and each link as a queue that serves one transfer at a time
// at its bandwidth.
func Plan(tr Trace, res Residency, opts Options, stepCount int) (*Schedule, error) {
	if stepCount < 1 {
		return nil, fmt.Errorf("prefetch: plan of %d steps", stepCount)
	}
	steps := make([]Trace, stepCount)
	for i := range steps {
		steps[i] = tr
	}
	return Simulate(tr, steps, res, opts)
}

// Simulate runs the planner against the modeled engine (see Plan) where step
// i executes steps[i] and the planner starts knowing the trace known (empty:
// the first step is recorded). Steps that differ from the trace exercise
// divergence. It fails when the trace cannot fit the budgets or when the
// compute would wait forever.
func Simulate(known Trace, steps []Trace, res Residency, opts Options) (*Schedule, error) {
	p, err := New(res, opts)
	if err != nil {
		return nil, err
	}
	if len(known.Accesses) > 0 {
		if err := p.SetTrace(known); err != nil {
			return nil, err
		}
	}
	total := int64(0)
	for i, st := range steps {
		if err := p.checkTrace(st); err != nil {
			return nil, fmt.Errorf("%w (step %d)", err, i)
		}
		total += int64(len(st.Accesses))
	}
	p.limit = total
	sm := newSim(p, res, true)
	for _, st := range steps {
		if err := sm.runStep(st); err != nil {
			return nil, err
		}
	}
	sm.sched.Stats = p.Stats()
	return sm.sched, nil
}

type event struct {
	at   time.Duration
	seq  int
	move int // the move's index (see sim.keep); -1 for a wake-up
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// sim is the modeled engine of Plan and Simulate, and the harness the
// benchmarks time: one compute stream that runs the accesses in order and
// waits for a shard that is not ready, and one queue per link instance that
// serves one transfer at a time at its bandwidth. A ledger of bytes per
// pool, kept from the moves alone (independent of the planner's counters),
// checks every budget after every move.
type sim struct {
	p     *Planner
	res   Residency
	sched *Schedule
	// record keeps the timeline (sched.Moves and sched.Accesses); without
	// it the moves in flight live in flying, their slots reused once they
	// land, and no access is kept.
	record   bool
	flying   []ScheduledMove
	free     []int // slots of flying not in use
	now      time.Duration
	deadline time.Duration // when the next access would begin with no stall at all
	step     int
	seq      int
	q        events
	linkFree map[int]time.Duration
	wakes    map[time.Duration]bool
	// ledger: bytes per pool from the moves alone, independent of the planner's counters
	used map[string]int64
}

// newSim returns the modeled engine driving p, whose shards start as res
// places them; record keeps the timeline in the Schedule.
func newSim(p *Planner, res Residency, record bool) *sim {
	s := &sim{p: p, res: res, record: record, linkFree: map[int]time.Duration{},
		sched: &Schedule{Options: p.opts, PeakBytes: map[string]int64{}, BudgetBytes: map[string]int64{}}}
	for i, name := range p.names {
		s.sched.BudgetBytes[name] = p.budget[i]
	}
	s.ledgerInit()
	return s
}

// runStep runs one training step of the accesses of st.
func (s *sim) runStep(st Trace) error {
	p := s.p
	before := p.stats.Rerecords
	p.BeginStep(s.now)
	s.sched.stepSeq = append(s.sched.stepSeq, s.seqNext())
	if p.stats.Rerecords > before {
		s.sched.Rerecorded = append(s.sched.Rerecorded, s.step-1)
	}
	if err := s.dispatch(p.Next(s.now)); err != nil {
		return err
	}
	for ai, a := range st.Accesses {
		if err := s.access(ai, a); err != nil {
			return err
		}
	}
	s.sched.StepEnd = append(s.sched.StepEnd, s.now)
	s.step++
	return nil
}

// access runs access a, the ai-th of the step: it begins, waits until its
// shard is ready, computes and is released.
func (s *sim) access(ai int, a shard.Access) error {
	p := s.p
	a.Ahead = false // the model runs each access at its use: declared, awaited and judged at once
	sa := ScheduledAccess{Access: a, Step: s.step, Index: ai, Deadline: s.deadline, Start: s.now, StartSeq: s.seqNext()}
	s.deadline += a.Compute
	late, dep := p.stats.Late, p.stats.Dependent
	hit, moves, err := p.Access(a, s.now)
	if err != nil {
		return err
	}
	switch {
	case hit:
		sa.Outcome = Hit
	case p.stats.Late > late:
		sa.Outcome = Late
	case p.stats.Dependent > dep:
		sa.Outcome = Dependent
	default:
		sa.Outcome = Miss
	}
	if err := s.dispatch(moves); err != nil {
		return err
	}
	for !p.Ready(a) {
		ok, err := s.advance(-1)
		if err != nil {
			return err
		}
		if !ok {
			return s.deadlock(a)
		}
	}
	sa.Ready, sa.ReadySeq = s.now, s.seqNext()
	if _, err := s.advance(s.now + a.Compute); err != nil {
		return err
	}
	p.Release(a.Key, s.now)
	sa.End, sa.EndSeq = s.now, s.seqNext()
	s.sched.Stall += sa.Ready - sa.Start
	if s.record {
		s.sched.Accesses = append(s.sched.Accesses, sa)
	}
	return s.dispatch(p.Next(s.now))
}

func (s *sim) seqNext() int { s.seq++; return s.seq }

// size is key k's size in tier t (Placement.TierBytes).
func (s *sim) size(k shard.Key, t shard.Tier) int64 {
	pl := s.res[k]
	if b := pl.TierBytes[t]; b > 0 {
		return b
	}
	return pl.SizeBytes
}

func (s *sim) poolName(k shard.Key, t shard.Tier) string {
	return s.p.names[s.p.pool(t, k.Rank)]
}

func (s *sim) ledgerInit() {
	s.used = map[string]int64{}
	s.wakes = map[time.Duration]bool{}
	for k, pl := range s.res {
		for t := shard.Tier(0); int(t) < shard.TierCount; t++ {
			if t == pl.Home || pl.Cached.Has(t) {
				s.add(s.poolName(k, t), s.size(k, t))
			}
		}
	}
}

func (s *sim) add(pool string, n int64) {
	s.used[pool] += n
	if s.used[pool] > s.sched.PeakBytes[pool] {
		s.sched.PeakBytes[pool] = s.used[pool]
	}
}

func (s *sim) home(k shard.Key) shard.Tier { return s.res[k].Home }

// dispatch applies moves the planner issued at s.now.
func (s *sim) dispatch(moves []shard.Move) error {
	for _, m := range moves {
		sm := ScheduledMove{Move: m, Step: s.step, Issue: s.now, Start: s.now, Done: s.now, IssueSeq: s.seqNext()}
		switch m.Reason {
		case shard.Evict:
			s.add(s.poolName(m.Key, m.From), -s.size(m.Key, m.From))
			sm.DoneSeq = sm.IssueSeq
		case shard.Alloc:
			s.add(s.poolName(m.Key, m.To), s.size(m.Key, m.To))
			sm.DoneSeq = sm.IssueSeq
		default:
			if err := s.transfer(&sm); err != nil {
				return err
			}
		}
		i := s.keep(sm)
		if !m.Instant() {
			heap.Push(&s.q, event{at: sm.Done, seq: s.seqNext(), move: i})
		}
		for pool, u := range s.used {
			if b := s.sched.BudgetBytes[pool]; b > 0 && u > b {
				return fmt.Errorf("prefetch: internal: %s uses %d B over its budget %d B after %s", pool, u, b, m)
			}
		}
	}
	if w, ok := s.p.WakeAt(); ok && w > s.now && !s.wakes[w] {
		s.wakes[w] = true
		heap.Push(&s.q, event{at: w, seq: s.seqNext(), move: -1})
	}
	return nil
}

// transfer models the transfer sm on its link instance: it starts when the
// link is free and takes the link's transfer time. Its room in the
// destination counts from now (a home copy has its room).
func (s *sim) transfer(sm *ScheduledMove) error {
	m := sm.Move
	if m.To != s.home(m.Key) {
		s.add(s.poolName(m.Key, m.To), s.size(m.Key, m.To))
	}
	l, ok := m.Link()
	if !ok {
		return fmt.Errorf("prefetch: internal: move %s has no link", m)
	}
	inst := int(l)
	if m.From == shard.HBM || m.To == shard.HBM {
		inst = shard.LinkCount*(1+s.p.pool(shard.HBM, m.Key.Rank)) + int(l)
	}
	start := s.now
	if f := s.linkFree[inst]; f > start {
		start = f
	}
	sm.Start = start
	sm.Done = start + s.p.opts.TransferTime(l, m.SizeBytes)
	s.linkFree[inst] = sm.Done
	return nil
}

// keep stores sm and returns its index for moveAt: in the timeline when it
// is recorded, else, for a transfer, in a slot of flying until it lands
// (-1 for an instant move, which is not kept).
func (s *sim) keep(sm ScheduledMove) int {
	if s.record {
		s.sched.Moves = append(s.sched.Moves, sm)
		return len(s.sched.Moves) - 1
	}
	if sm.Instant() {
		return -1
	}
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		s.flying[i] = sm
		return i
	}
	s.flying = append(s.flying, sm)
	return len(s.flying) - 1
}

// moveAt is the move kept at index i (see keep).
func (s *sim) moveAt(i int) *ScheduledMove {
	if s.record {
		return &s.sched.Moves[i]
	}
	return &s.flying[i]
}

// landed lets the slot of the move at index i be reused (without record).
func (s *sim) landed(i int) {
	if !s.record {
		s.flying[i] = ScheduledMove{}
		s.free = append(s.free, i)
	}
}

// advance processes events: up to and including time until (then sets now
// to until), or, for until < 0, exactly one event. It reports false when
// there was no event to process.
func (s *sim) advance(until time.Duration) (bool, error) {
	for {
		if s.q.Len() == 0 || (until >= 0 && s.q[0].at > until) {
			if until >= 0 {
				s.now = until
				return true, nil
			}
			return false, nil
		}
		e := heap.Pop(&s.q).(event)
		s.now = e.at
		if e.move >= 0 {
			sm := s.moveAt(e.move)
			sm.DoneSeq = s.seqNext()
			if sm.Reason == shard.WriteBack {
				s.add(s.poolName(sm.Key, sm.From), -s.size(sm.Key, sm.From))
			}
			s.p.Completed(sm.Move, s.now)
			s.landed(e.move)
		} else {
			delete(s.wakes, e.at)
		}
		if err := s.dispatch(s.p.Next(s.now)); err != nil {
			return false, err
		}
		if until < 0 {
			return true, nil
		}
	}
}

func (s *sim) deadlock(a shard.Access) error {
	var holders []string
	for _, u := range s.p.inUse {
		ks := &s.p.keys[u.slot]
		holders = append(holders, fmt.Sprintf("%s in %s", ks.key, u.tier))
	}
	pi := s.p.pool(a.Tier, a.Key.Rank)
	return fmt.Errorf("prefetch: %s cannot become ready in %s: %d of %d B are held and nothing can be evicted (in use: %s)",
		a.Key, s.p.names[pi], s.p.used[pi], s.p.budget[pi], strings.Join(holders, ", "))
}

// Format writes the timeline, one event a line, then the totals.
func (s *Schedule) Format(w io.Writer) {
	type line struct {
		seq  int
		text string
	}
	var lines []line
	for _, m := range s.Moves {
		var t string
		switch m.Reason {
		case shard.Evict:
			t = fmt.Sprintf("%-8v evict     %s from %s", m.Issue, keyName(m.Key), m.From)
		case shard.Alloc:
			t = fmt.Sprintf("%-8v alloc     %s in %s", m.Issue, keyName(m.Key), m.To)
		default:
			wait := ""
			if m.Start > m.Issue {
				wait = fmt.Sprintf(" start %v", m.Start)
			}
			name := m.Reason.String()
			if m.WriteBehind {
				name = "writebehind"
			}
			t = fmt.Sprintf("%-8v %-9s %s %s->%s%s done %v", m.Issue, name, keyName(m.Key), m.From, m.To, wait, m.Done)
		}
		lines = append(lines, line{m.IssueSeq, t})
	}
	for _, a := range s.Accesses {
		t := fmt.Sprintf("%-8v access    #%d %s %s %s@%s %s", a.Start, a.Index, a.Phase, a.Kind, keyName(a.Key), a.Tier, a.Outcome)
		if a.Ready > a.Start {
			t += fmt.Sprintf(" stall %v", a.Ready-a.Start)
		}
		lines = append(lines, line{a.StartSeq, t})
	}
	for i, seq := range s.stepSeq {
		lines = append(lines, line{seq, fmt.Sprintf("step %d", i)})
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].seq < lines[j].seq })
	for _, l := range lines {
		fmt.Fprintln(w, l.text)
	}
	st := s.Stats
	fmt.Fprintf(w, "accesses %d: hits %d, late %d, misses %d", st.Accesses, st.Hits, st.Late, st.Misses)
	if st.Dependent > 0 {
		fmt.Fprintf(w, ", dependent %d", st.Dependent)
	}
	fmt.Fprintf(w, "; stall %v", s.Stall)
	if st.WriteBehinds > 0 {
		fmt.Fprintf(w, "; write-behinds %d", st.WriteBehinds)
	}
	if len(s.StepEnd) > 0 {
		fmt.Fprintf(w, "; end %v", s.StepEnd[len(s.StepEnd)-1])
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "bytes")
	for l := shard.Link(0); int(l) < shard.LinkCount; l++ {
		fmt.Fprintf(w, " %s=%d", l, st.Bytes[l])
	}
	fmt.Fprintln(w)
	var pools []string
	for name := range s.PeakBytes {
		pools = append(pools, name)
	}
	sort.Strings(pools)
	fmt.Fprint(w, "peak")
	for _, name := range pools {
		if b := s.BudgetBytes[name]; b > 0 {
			fmt.Fprintf(w, " %s=%d/%d", strings.ReplaceAll(name, " ", "_"), s.PeakBytes[name], b)
		} else {
			fmt.Fprintf(w, " %s=%d", strings.ReplaceAll(name, " ", "_"), s.PeakBytes[name])
		}
	}
	fmt.Fprintln(w)
	if st.Divergences > 0 || st.Rerecords > 0 {
		fmt.Fprintf(w, "divergences %d, re-recorded after steps %v\n", st.Divergences, s.Rerecorded)
	}
}

func (s *Schedule) String() string {
	var b strings.Builder
	s.Format(&b)
	return b.String()
}

// keyName is the short form the test files use: c3.param, c3.r1.param.
func keyName(k shard.Key) string {
	if k.Rank == 0 {
		return fmt.Sprintf("c%d.%s", k.Chunk, k.State)
	}
	return fmt.Sprintf("c%d.r%d.%s", k.Chunk, k.Rank, k.State)
}
