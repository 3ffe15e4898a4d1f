package engine

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
)

// pendingUpdate is one rank's host update of step t while it is pending:
// the rank's goroutine declares each chunk's state to the tier store (in
// forward order, a window inside Step and the rest at points of the next
// pass: leaseAhead) and hands it to the update's goroutine, which waits
// for it, runs cpuadam chunk by chunk and closes chunks[c].ready when chunk c's
// new params are in their staging (or host copy). The device side of
// chunk c (upload, the AllGather at stages 1-2 and for persistent chunks,
// paramReady[c]) is enqueued by the rank's goroutine when the next step
// first needs chunk c (flushChunk) or at the drain (finishRun): at points
// fixed by Model.AccessOrder, so every rank issues its collectives in one
// order.
//
// Its life is a small state machine, kept by the rank's goroutine (state;
// to checks each transition):
//
//	startRun (update during the backward)   startRun (Step's update: updateExact)
//	         |                                         |
//	         v                                         |
//	    runHanding --commitNext--> runLeasing <--------+
//	         |                         |
//	     abortNext          leaseAhead hands the last chunk
//	         v                         v
//	    runAborted                 runLeased
//	                                   |
//	                         wait: cpuadam has run    pendingFromMaster (a restore)
//	                                   v                        |
//	                              runComputed <-----------------+
//	                               |        |
//	      finishRun: every device side      restorePending
//	                               v        v
//	                      runFinished      runDropped
//
// The three final states are reached in one place (retire), which takes
// the update off the rank. The schedule (exactSchedule, or dpu's
// delayedSchedule: hostSchedule) says how the next pass meets the update;
// it is chosen when the update starts, never re-tested.
type pendingUpdate struct {
	step   int64
	state  runState
	sched  hostSchedule
	jobs   chan hostJob
	done   chan struct{} // the goroutine has run every job
	chunks []chunkUpdate // per chunk
	// The rank's goroutine only (leaseAhead): the position in e.fwdOrder
	// of the next chunk to consider, the chunks it leased in that order,
	// and whether jobs is closed (or there are none: an update rebuilt
	// from a checkpoint).
	nextPos int
	lent    []int
	closed  bool
	// start holds the update's cpuadam back until begin (closed at once
	// under exactSchedule): a delayed (dpu) update waits for the next
	// step's forward to have begun; started at the step's end, it would
	// run while the devices are idle between the steps.
	start     chan struct{}
	startOnce sync.Once
	// startEv (set with start's close): cpuadam waits for it too, a mark
	// on the compute stream behind the first chunks of the next forward,
	// so that it starts once the devices' compute is under way (nil: at
	// once).
	startEv gpu.Event
	// flushes counts flushChunk's calls on a delayed update (the rank
	// goroutine only): beginDelayed records startEv at the
	// dpuStartFlush-th.
	flushes int
}

// chunkUpdate is one chunk's part of a pendingUpdate.
type chunkUpdate struct {
	// Written by the update's goroutine before ready is closed: the
	// chunk's failure, and, for a chunk updated during the backward, its
	// leases, kept until the step is known finite.
	ready chan struct{}
	err   error
	held  hostLeases
	// The rank's goroutine only: the device side is enqueued (flushed);
	// the chunk is leased and handed to the goroutine (handed); its index
	// among the chunks leaseAhead leased (lentAt; -1: not leased there:
	// handed in the backward, frozen, or an update rebuilt from a
	// checkpoint); its failure was returned already, by the Step that
	// leased it or by settle, and finishRun does not return it again
	// (reported).
	flushed, handed, reported bool
	lentAt                    int
}

// runState is where a pendingUpdate is in its life (see pendingUpdate).
type runState uint8

const (
	// runHanding: started before the step's pass (backwardUpdate, the
	// rank's next); the backward hands it chunks whose gradient is
	// reduced, and their leases are kept until the step's verdict.
	runHanding runState = iota
	// runLeasing: pending (the rank's run); the rank leases the chunks not
	// handed yet in forward order, window by window, at points of the next
	// pass, and cpuadam follows.
	runLeasing
	// runLeased: every chunk is handed over (jobs closed); cpuadam may
	// still run, each chunk's device side waits for the next pass's first
	// use of it.
	runLeased
	// runComputed: cpuadam has run every chunk (its goroutine ended); what
	// is left is the device side of the chunks not flushed yet (a settled
	// dpu update, one rebuilt after a restore).
	runComputed
	// runFinished (final): every chunk's device side is enqueued (dpu:
	// the new params stored), the failures returned (finishRun).
	runFinished
	// runAborted (final): the step was not finite or failed; the updates
	// of the backward are undone (abortNext).
	runAborted
	// runDropped (final): a restore dropped it and rebuilt what the
	// devices are owed (restorePending).
	runDropped
)

var runStateNames = [...]string{"handing", "leasing", "leased", "computed", "finished", "aborted", "dropped"}

func (s runState) String() string { return runStateNames[s] }

// runMoves are the transitions pendingUpdate.to allows.
var runMoves = map[[2]runState]bool{
	{runHanding, runLeasing}:   true,
	{runHanding, runAborted}:   true,
	{runLeasing, runLeased}:    true,
	{runLeased, runComputed}:   true,
	{runComputed, runFinished}: true,
	{runComputed, runDropped}:  true,
}

// to moves u to state s; a move the machine does not have is a broken
// contract.
func (u *pendingUpdate) to(s runState) {
	if !runMoves[[2]runState{u.state, s}] {
		panic(fmt.Sprintf("engine: optimizer step %d's host update moved from %s to %s", u.step, u.state, s))
	}
	u.state = s
}

type hostJob struct {
	c   int
	ls  hostLeases
	err error // leasing failed: nothing to compute
	// During the backward (overlap_bwd.go): ev is the gradient's copy to
	// host memory, which cpuadam waits for; keep saves what undoes the
	// update and keeps the leases (held) until the step's verdict.
	ev   gpu.Event
	keep bool
	// release (no chunk): give back every held lease, the step is finite.
	release bool
}

// startRun starts a host update of step ap.Step in state first (runHanding
// or runLeasing) under schedule sched: its goroutine, waiting for jobs.
func (r *rank) startRun(ap gpu.AdamParams, sched hostSchedule, first runState) (*pendingUpdate, error) {
	cp := cpuadam.Params(ap) // one type (package adam)
	if err := cp.Validate(); err != nil {
		return nil, err
	}
	u := newPending(ap.Step, sched, first, len(r.e.chunks))
	u.jobs = make(chan hostJob, len(u.chunks)+1)
	for c := range u.chunks {
		if r.e.chunks[c].frozen { // no update: nothing to wait for, nothing to upload
			close(u.chunks[c].ready)
			u.chunks[c].flushed = true
		}
	}
	go r.hostLoop(u, cp)
	return u, nil
}

// newPending is an update of step over n chunks in state first, none of
// them ready; under exactSchedule its cpuadam starts at once.
func newPending(step int64, sched hostSchedule, first runState, n int) *pendingUpdate {
	u := &pendingUpdate{step: step, state: first, sched: sched, done: make(chan struct{}), chunks: make([]chunkUpdate, n), start: make(chan struct{})}
	for c := range u.chunks {
		u.chunks[c].ready, u.chunks[c].lentAt = make(chan struct{}), -1
	}
	if !sched.holdsStart() {
		u.begin(nil)
	}
	return u
}

// retire takes u off the rank in final state s: the one place an update
// ends.
func (r *rank) retire(u *pendingUpdate, s runState) {
	u.to(s)
	switch u {
	case r.run:
		r.run = nil
	case r.next:
		r.next = nil
	}
}

// report marks chunk c's failure err as returned (the caller returns
// it) and passes it on; c < 0: none.
func (u *pendingUpdate) report(c int, err error) error {
	if c >= 0 {
		u.chunks[c].reported = true
	}
	return err
}

// unreported is the first failure of u, in forward order, not returned
// yet, naming the optimizer step; it marks it returned.
func (r *rank) unreported(u *pendingUpdate) error {
	for _, c := range r.e.fwdOrder {
		if err := u.chunks[c].err; err != nil && !u.chunks[c].reported {
			u.chunks[c].reported = true
			return fmt.Errorf("optimizer step %d: %w", u.step, err)
		}
	}
	return nil
}

// leasedAt is chunk c's index among the chunks leaseAhead leased, -1 when
// it did not lease c (handed in the backward, frozen, or an update rebuilt
// from a checkpoint).
func (u *pendingUpdate) leasedAt(c int) int { return u.chunks[c].lentAt }

// hostLoop runs the pending update's cpuadam chunk by chunk.
func (r *rank) hostLoop(u *pendingUpdate, cp cpuadam.Params) {
	defer close(u.done)
	<-u.start
	if u.startEv != nil {
		u.startEv.Synchronize() // the next forward's compute is under way
	}
	for j := range u.jobs {
		if j.release {
			for c := range u.chunks {
				r.doneLeases(u.chunks[c].held)
				u.chunks[c].held = hostLeases{}
			}
			continue
		}
		if j.err == nil {
			j.err = r.await(&j.ls) // the state's reads, while the rank goes on
		}
		if j.err == nil {
			if j.ev != nil {
				j.ev.Synchronize() // the gradient has reached its host copy
			}
			if j.keep {
				r.saveUndo(j.c, j.ls)
			}
			r.adamHost(j.c, cp, j.ls)
		}
		if j.keep {
			u.chunks[j.c].held = j.ls
		} else {
			r.doneLeases(j.ls)
		}
		u.chunks[j.c].err = j.err
		close(u.chunks[j.c].ready)
		// Let the rank's goroutine, woken by ready, enqueue the chunk's
		// upload and the forward behind it now: cpuadam's next chunk
		// would hold every P (its kernels are not preemptible) and the
		// devices would wait for the whole update.
		runtime.Gosched()
	}
}

// closeJobs closes u's jobs: nothing more is handed over.
func (u *pendingUpdate) closeJobs() {
	close(u.jobs)
	u.closed = true
	if u.state == runLeasing {
		u.to(runLeased)
	}
}

// begin lets the update's cpuadam start (once), after ev when ev is not
// nil.
func (u *pendingUpdate) begin(ev gpu.Event) {
	u.startOnce.Do(func() {
		u.startEv = ev
		close(u.start)
	})
}

// wait waits for the update's goroutine to have run every job (letting a
// delayed one start first).
func (u *pendingUpdate) wait() {
	u.begin(nil)
	<-u.done
	if u.state == runLeased {
		u.to(runComputed)
	}
}

// hostSchedule is how the next pass meets a pending update, chosen when
// the update starts: exactSchedule (the next pass reads the new params,
// each chunk's published at its first use) or delayedSchedule (dpu: the
// pass reads the old ones while cpuadam runs; the update is published at
// its end).
type hostSchedule interface {
	// holdsStart says whether cpuadam waits for begin (the next pass).
	holdsStart() bool
	// leasesParam says whether cpuadam writes a tier-store param's new
	// value into its host copy (else into the upload staging).
	leasesParam() bool
	// flush: the next pass is about to read chunk c (flushChunk).
	flush(r *rank, u *pendingUpdate, c int)
	// ready says whether chunk c's params can be read without waiting for
	// cpuadam.
	ready(u *pendingUpdate, c int) bool
	// finish enqueues the device side of every chunk not yet flushed and
	// retires u (runFinished), returning its first failure not returned.
	finish(r *rank, u *pendingUpdate) error
	// settle completes what must be complete outside a step (settle) and
	// returns the rank's figures taken.
	settle(r *rank) (report.HostOptStats, error)
	// order is the chunks in the order the rank leases their state and
	// cpuadam updates them (leaseAhead).
	order(e *Engine) []int
	// beforeGrad waits until u no longer reads chunk c's gradient in its
	// host copy, which the backward is about to write (waitGrad).
	beforeGrad(r *rank, u *pendingUpdate, c int)
}
