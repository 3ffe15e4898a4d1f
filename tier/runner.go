package tier

import (
	"fmt"
	"sync"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Planner is what a Runner needs of a planner (prefetch.Planner is one): it
// is told of accesses, releases and completions and answers with moves. A
// Runner calls it under its lock, from one goroutine at a time.
type Planner interface {
	// BeginStep marks the start of a training step.
	BeginStep(now time.Duration)
	// Access begins a; moves are to be submitted in order.
	Access(a shard.Access, now time.Duration) (hit bool, moves []shard.Move, err error)
	// Ready reports whether a can run: its shard is ready in a.Tier.
	Ready(a shard.Access) bool
	// Release ends the oldest unreleased access of key.
	Release(key shard.Key, now time.Duration)
	// Completed reports a transfer the planner issued as done.
	Completed(m shard.Move, now time.Duration)
	// Next returns the moves due at now, in order.
	Next(now time.Duration) []shard.Move
	// WakeAt is when Next would issue a move not due yet; false: none waits on time.
	WakeAt() (time.Duration, bool)
	// Resumed says that Next was not called for a while (Pause).
	Resumed()
	// Awaited says that access a, declared ahead of its use (a.Ahead), is
	// needed now: the planner judges it then (hit, late, miss).
	Awaited(a shard.Access, now time.Duration)
	// Confirm says that conditional access a (shard.Access.Conditional)
	// will come in this step; moves are to be submitted in order.
	Confirm(a shard.Access, now time.Duration) (moves []shard.Move)
	// Skip says that conditional access a, next in the rank's order, does
	// not happen in this step.
	Skip(a shard.Access, now time.Duration) (moves []shard.Move, err error)
}

// MoveSpan is one move a Runner reaped that put bytes on a link or failed,
// for a timeline.
type MoveSpan struct {
	Move shard.Move
	// Start is when the move was submitted, or, when it copies a copy that
	// was still arriving then, when that copy arrived (the store starts it
	// then); Duration runs from Start to completion.
	Start    time.Time
	Duration time.Duration
	Bytes    int64 // put on links (both hops of a two-hop move)
	Err      error
}

// RunnerOptions configure a Runner.
type RunnerOptions struct {
	// Rank is the rank whose shards the planner plans: the store wakes the
	// runner when a move of one of them completes. One runner per rank.
	Rank int32
	// Clock is the planner's clock; default: the time since NewRunner.
	Clock func() time.Duration
	// OnMove, when set, is called (under the runner's lock: it must not call
	// the runner) for every reaped move that used a link or failed.
	OnMove func(MoveSpan)
	// OnStall, when set, is called (the same way) when Use waited for
	// access a's shard, from start for waited.
	OnStall func(a shard.Access, start time.Time, waited time.Duration)
}

// Runner executes one rank's planner against a Store: the rank tells it of
// accesses (Use) and of the end of their compute (Done); it submits the
// moves the planner asks for, reaps their completions, issues moves when
// they fall due (Planner.WakeAt) from a goroutine of its own, and releases
// leases as the events behind them complete from another. The first
// failure (a move that failed, one the store refused, an access the
// planner cannot serve) stops the rank: every later Use and BeginStep
// returns it. Its methods are safe for concurrent use.
type Runner struct {
	s    *Store
	p    Planner
	opts RunnerOptions
	t0   time.Time

	mu     sync.Mutex
	cond   *sync.Cond
	flying []flight // submitted moves not yet reaped
	held   []held   // leases whose compute is enqueued but may still run
	err    error    // the first failure
	paused bool
	closed bool
	stall  [shard.TierCount]time.Duration // Use's wait for shards, by access tier
	// using counts the leases Use and Await gave out that Done has not
	// taken back.
	using int

	kick    chan struct{}
	quit    chan struct{}
	stopped chan struct{}
	timer   *time.Timer
	// evq hands the events behind held leases to the waiter, which wakes
	// the loop as each completes (in order; full: the lease waits for the
	// rank's next Use or Done).
	evq    chan gpu.Event
	waited chan struct{} // closed when the waiter has returned
}

type flight struct {
	m  shard.Move
	op *Op
	// With OnMove only: when the move was submitted, and the move filling
	// the copy it copies (submitted at afterAt), if any.
	at, afterAt time.Time
	after       *Op
}

type held struct {
	l  *Lease
	ev gpu.Event // nil: done now
}

// NewRunner starts the runner of rank o.Rank's planner p on store s. Close
// it before the store.
func NewRunner(s *Store, p Planner, o RunnerOptions) (*Runner, error) {
	r := &Runner{s: s, p: p, opts: o, t0: time.Now(), kick: make(chan struct{}, 1), quit: make(chan struct{}),
		stopped: make(chan struct{}), evq: make(chan gpu.Event, 64), waited: make(chan struct{})}
	if r.opts.Clock == nil {
		r.opts.Clock = func() time.Duration { return time.Since(r.t0) }
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, fmt.Errorf("tier: runner of rank %d: %w", o.Rank, ErrClosed)
	case s.runners[o.Rank] != nil:
		s.mu.Unlock()
		return nil, fmt.Errorf("tier: rank %d has a runner already", o.Rank)
	}
	s.runners[o.Rank] = r
	s.mu.Unlock()
	r.cond = sync.NewCond(&r.mu)
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	go r.loop()
	go r.waiter()
	return r, nil
}

func (r *Runner) now() time.Duration { return r.opts.Clock() }

// wake makes the loop reap and plan (it never blocks).
func (r *Runner) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// waiter wakes the loop as soon as the compute behind a held lease has
// completed, so that the lease is released then and not at the rank's next
// Use: the planner may be waiting for that copy's room to stage the next
// shard (Belady's victim is often the shard just used). It takes the
// events in the order the leases were handed over.
func (r *Runner) waiter() {
	defer close(r.waited)
	for {
		select {
		case <-r.quit:
			return
		case ev := <-r.evq:
			ev.Synchronize()
			r.wake()
		}
	}
}

func (r *Runner) loop() {
	defer close(r.stopped)
	for {
		select {
		case <-r.quit:
			return
		case <-r.kick:
		case <-r.timer.C:
		}
		r.mu.Lock()
		r.releaseLocked(false)
		r.pumpLocked()
		r.mu.Unlock()
	}
}

// Close stops the runner's goroutines; it waits for the event the waiter
// is on, if any (synchronize the rank's streams first). A Use still waiting
// returns ErrClosed, as do later ones; leases still held stay held. A
// second Close does nothing.
func (r *Runner) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.failLocked(fmt.Errorf("tier: runner of rank %d: %w", r.opts.Rank, ErrClosed))
	r.cond.Broadcast()
	r.mu.Unlock()
	close(r.quit)
	<-r.stopped
	<-r.waited
	r.timer.Stop()
	r.s.mu.Lock()
	if r.s.runners[r.opts.Rank] == r {
		delete(r.s.runners, r.opts.Rank)
	}
	r.s.mu.Unlock()
}

func (r *Runner) failLocked(err error) {
	if r.err == nil {
		r.err = err
	}
}

// Err is the runner's first failure, nil while there is none.
func (r *Runner) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// pumpLocked reaps completed moves, tells the planner, submits what it asks
// next, and wakes Use.
func (r *Runner) pumpLocked() {
	for round := 0; ; round++ {
		progress := false
		now := r.now()
		for i := 0; i < len(r.flying); {
			f := r.flying[i]
			if !f.op.Done() {
				i++
				continue
			}
			r.flying[i] = r.flying[len(r.flying)-1]
			r.flying = r.flying[:len(r.flying)-1]
			progress = true
			if r.opts.OnMove != nil {
				r.traceMove(f)
			}
			if err := f.op.Err(); err != nil {
				r.failLocked(err) // a *MoveError: names the shard, the move and the file
				continue
			}
			if !f.m.Instant() {
				r.p.Completed(f.m, now)
			}
		}
		if r.err == nil && !r.paused {
			if ms := r.p.Next(now); len(ms) > 0 {
				r.submitLocked(ms)
				progress = true
			}
		}
		if !progress || round > 64 {
			break
		}
	}
	if w, ok := r.p.WakeAt(); ok && r.err == nil && !r.paused {
		r.timer.Reset(max(w-r.now(), 0))
	}
	r.cond.Broadcast()
}

// submitLocked hands the planner's moves to the store, in order. A refusal
// (its error names the move, or the budget and its users) stops the rank.
func (r *Runner) submitLocked(ms []shard.Move) {
	for _, m := range ms {
		if r.err != nil {
			return
		}
		if m.Key.Rank != r.opts.Rank {
			r.failLocked(fmt.Errorf("tier: the planner of rank %d asked for %s, a shard of another rank: %w", r.opts.Rank, m, ErrBadMove))
			return
		}
		var at time.Time
		if r.opts.OnMove != nil {
			at = time.Now()
		}
		op, err := r.s.Submit(m)
		if err != nil {
			r.failLocked(err)
			return
		}
		f := flight{m: m, op: op}
		if r.opts.OnMove != nil {
			f.at = at
			for _, g := range r.flying {
				if g.m.Key == m.Key && g.m.To == m.From && !g.m.Instant() {
					f.after, f.afterAt = g.op, g.at
				}
			}
		}
		r.flying = append(r.flying, f)
	}
}

// traceMove reports a reaped move that put bytes on a link: from its
// submit, or from the arrival of the copy it copies when that came later,
// to its completion.
func (r *Runner) traceMove(f flight) {
	n := f.op.Bytes()
	if n == 0 && f.op.Err() == nil {
		return // instant, a no-op, or a blank read: no link was used
	}
	start, end := f.at, f.at.Add(f.op.Duration())
	if f.after != nil && f.after.Done() {
		if a := f.afterAt.Add(f.after.Duration()); a.After(start) {
			start = a
			if start.After(end) {
				start = end
			}
		}
	}
	r.opts.OnMove(MoveSpan{Move: f.m, Start: start, Duration: end.Sub(start), Bytes: n, Err: f.op.Err()})
}

// releaseLocked ends the held leases whose compute has completed (all of
// them, waiting, when wait is set). It may run on the rank's goroutine and
// on the loop at once: it waits with mu unlocked, so it scans r.held again
// under the lock after every wait.
func (r *Runner) releaseLocked(wait bool) {
	for {
		j := 0
		for _, h := range r.held {
			if h.ev != nil && !h.ev.Done() {
				r.held[j] = h
				j++
				continue
			}
			k := h.l.Key()
			h.l.Release()
			r.p.Release(k, r.now())
		}
		clear(r.held[j:])
		r.held = r.held[:j]
		if !wait || len(r.held) == 0 {
			return
		}
		ev := r.held[0].ev
		r.mu.Unlock()
		ev.Synchronize()
		r.mu.Lock()
	}
}

// Use begins access a: it tells the planner, waits until the shard is
// ready in a.Tier, and leases it there for a.Kind. The wait counts as the
// rank's stall on a.Tier. End the lease with Done, not Lease.Release.
func (r *Runner) Use(a shard.Access) (*Lease, error) {
	p, err := r.begin(a)
	if err != nil {
		return nil, err
	}
	return r.Await(p)
}

// Pending is an access Begin declared and Await has not leased yet.
type Pending struct {
	a    shard.Access
	done bool // awaited or abandoned
}

// Begin declares access a to the planner, which issues its moves, and
// returns without waiting for the shard: the access takes its place in the
// rank's order now (the order the planner's trace records), and another
// goroutine may wait for it (Await) while the rank goes on. Every Pending
// must be awaited or abandoned. The planner judges the access (hit, late,
// miss) when it is awaited (shard.Access.Ahead).
func (r *Runner) Begin(a shard.Access) (*Pending, error) {
	a.Ahead = true
	return r.begin(a)
}

func (r *Runner) begin(a shard.Access) (*Pending, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	r.releaseLocked(false)
	r.pumpLocked()
	_, ms, err := r.p.Access(a, r.now())
	if err != nil {
		r.failLocked(fmt.Errorf("tier: plan %s: %w", a, err))
		return nil, r.err
	}
	r.submitLocked(ms)
	return &Pending{a: a}, nil
}

// Confirm tells the planner that conditional access a
// (shard.Access.Conditional) comes later in this step, so that it moves
// the shard ahead of it as it does any access's; the rank makes the
// access itself (Use) in its place.
func (r *Runner) Confirm(a shard.Access) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return
	}
	r.releaseLocked(false)
	r.pumpLocked()
	r.submitLocked(r.p.Confirm(a, r.now()))
}

// Skip tells the planner that conditional access a, which the rank's order
// has next, does not happen in this step: nothing is leased or moved.
func (r *Runner) Skip(a shard.Access) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.releaseLocked(false)
	r.pumpLocked()
	ms, err := r.p.Skip(a, r.now())
	if err != nil {
		r.failLocked(fmt.Errorf("tier: plan the skip of %s: %w", a, err))
		return r.err
	}
	r.submitLocked(ms)
	return nil
}

// Await waits until p's shard is ready in its tier and leases it there
// (Use's second half). The wait counts as the rank's stall on the tier.
// End the lease with Done.
func (r *Runner) Await(p *Pending) (*Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endPendingLocked(p)
	a := p.a
	if a.Ahead && r.err == nil {
		r.p.Awaited(a, r.now())
	}
	if waited, t0 := r.awaitLocked(a); waited > 0 {
		r.stall[a.Tier] += waited
		if r.opts.OnStall != nil {
			r.opts.OnStall(a, t0, waited)
		}
	}
	if r.err != nil {
		return nil, r.err // the rank has stopped: its planner is not told more
	}
	l, err := r.s.Acquire(a.Key, a.Tier, a.Kind)
	if err != nil {
		r.failLocked(err)
		r.p.Release(a.Key, r.now())
		return nil, r.err
	}
	r.using++
	return l, nil
}

// Abandon ends a declared access that will not be leased (an earlier
// access of the same work failed): the planner releases it.
func (r *Runner) Abandon(p *Pending) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endPendingLocked(p)
	r.p.Release(p.a.Key, r.now())
	r.pumpLocked()
}

func (r *Runner) endPendingLocked(p *Pending) {
	if p.done {
		panic(fmt.Sprintf("tier: %s awaited or abandoned twice", p.a))
	}
	p.done = true
}

// awaitLocked waits until the planner says a is ready or the rank fails,
// and returns how long it waited, from when.
func (r *Runner) awaitLocked(a shard.Access) (time.Duration, time.Time) {
	var t0 time.Time
	for r.err == nil && !r.p.Ready(a) {
		if t0.IsZero() {
			t0 = time.Now()
		}
		r.pumpLocked()
		if r.err != nil || r.p.Ready(a) {
			break
		}
		switch {
		case len(r.held) > 0:
			// The planner may wait for room that a held lease gives back.
			r.releaseLocked(true)
			r.pumpLocked()
		case len(r.flying) == 0:
			// Nothing in flight and nothing planned for later: only a
			// lease another goroutine of the rank holds (Await's, in
			// use until its Done) can let the planner go on.
			if _, ok := r.p.WakeAt(); !ok && r.using <= 0 {
				r.failLocked(fmt.Errorf("tier: planner stalled: %s is not ready and nothing is in flight", a))
			} else {
				r.cond.Wait()
			}
		default:
			r.cond.Wait()
		}
	}
	if t0.IsZero() {
		return 0, t0
	}
	return time.Since(t0), t0
}

// Done ends a lease from Use once ev (recorded after the compute that uses
// the lease) has completed; nil: now.
func (r *Runner) Done(l *Lease, ev gpu.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.using--
	r.held = append(r.held, held{l, ev})
	if ev == nil || ev.Done() {
		r.releaseLocked(false)
		r.pumpLocked()
		return
	}
	select {
	case r.evq <- ev: // released when it completes (waiter)
	default:
	}
}

// Settle releases every held lease, waiting for their events (the rank has
// synchronized its streams, or is about to).
func (r *Runner) Settle() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseLocked(true)
	r.pumpLocked()
}

// BeginStep settles the held leases and marks the start of a training step
// for the planner. It returns the rank's failure, if any.
func (r *Runner) BeginStep() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.releaseLocked(true)
	r.p.BeginStep(r.now())
	r.pumpLocked()
	return r.err
}

// Pause settles the held leases, stops issuing moves and waits for those
// in flight: afterwards the store is quiet for this rank until Resume. It
// returns the rank's failure, if any.
func (r *Runner) Pause() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused = true
	r.releaseLocked(true)
	for {
		r.pumpLocked()
		if len(r.flying) == 0 {
			break
		}
		if r.closed {
			// Nothing wakes a closed runner (its loop has stopped and
			// the store no longer knows it): wait for the move itself.
			op := r.flying[0].op
			r.mu.Unlock()
			<-op.Ready()
			r.mu.Lock()
			continue
		}
		r.cond.Wait()
	}
	return r.err
}

// Resume undoes Pause.
func (r *Runner) Resume() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused = false
	r.p.Resumed()
	r.pumpLocked()
}

// Do runs f while no planner call is in progress: the caller reads its
// planner's counters or changes its settings through it. f must not call
// the runner.
func (r *Runner) Do(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
}

// Stall is the time Use waited for shards since NewRunner, by access tier.
func (r *Runner) Stall() [shard.TierCount]time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stall
}
