package engine

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// Overlap modes of the host optimizer (strata.overlap).
const (
	// OverlapExact (the default) runs the host optimizer of step t under
	// the devices' work of step t+1: Step returns once the updates are
	// issued, each chunk's new params go to the device when the next
	// forward first needs them. Bit-identical to OverlapSerial.
	OverlapExact = "exact"
	// OverlapSerial runs the host optimizer inside Step, after the whole
	// backward, and returns when it is done: the schedule before exact, a
	// reference for measurements.
	OverlapSerial = "serial"
	// OverlapDPU is the delayed parameter update (ZeRO-Offload): after
	// strata.dpu_warmup_steps exact steps, step t's forward and backward
	// use the params of step t-1 while the host updates them with step
	// t-1's gradient (overlap_dpu.go).
	OverlapDPU = "dpu"
)

// takeHostOpt is the rank's figures since the last take; its compute
// stream has completed what the figures need (the caller synchronized).
func (r *rank) takeHostOpt() report.HostOptStats {
	if !r.e.offload {
		return report.HostOptStats{}
	}
	return report.HostOptStats(r.tr.Take())
}

// forwardOrder is the chunks in the order of their first Acquire in a
// micro-batch's access order: the order the next forward reads them,
// which the host optimizer follows.
func forwardOrder(order []model.Access, chunks int) []int {
	seen := make([]bool, chunks)
	var out []int
	for _, a := range order {
		if a.Kind == model.AccessAcquire && !seen[a.Chunk] {
			seen[a.Chunk] = true
			out = append(out, a.Chunk)
		}
	}
	for c := range chunks {
		if !seen[c] {
			out = append(out, c)
		}
	}
	return out
}

// hostRun is one rank's pending host update (exact overlap): the rank's
// goroutine declares each chunk's state to the tier store (in forward
// order, a window inside Step and the rest at points of the next pass:
// leaseAhead) and hands it to the run's goroutine, which waits for it,
// runs cpuadam chunk by chunk and closes ready[c] when chunk c's new params are in
// their staging (or host copy). The device side of chunk c (upload, the
// AllGather at stages 1-2 and for persistent chunks, paramReady[c]) is
// enqueued by the rank's goroutine when the next step first needs chunk c
// (flushChunk) or at the drain (finishRun): at points fixed by
// Model.AccessOrder, so every rank issues its collectives in one order.
type hostRun struct {
	step    int64
	jobs    chan hostJob
	ready   []chan struct{} // per chunk
	errs    []error         // per chunk, written before ready[c] is closed
	done    chan struct{}   // the goroutine has run every job
	flushed []bool          // per chunk: the device side is enqueued (the rank's goroutine only)
	handed  []bool          // per chunk: leased and handed to the goroutine (the rank's goroutine only)
	// The rank's goroutine only (leaseAhead): the position in e.fwdOrder
	// of the next chunk to consider, the chunks it leased in that order,
	// each chunk's index among them (-1: not leased there), and whether
	// jobs is closed (or there are none: a run rebuilt from a checkpoint).
	nextPos int
	lent    []int
	lentAt  []int
	closed  bool
	delayed bool // dpu: the next pass reads the params before this update; its end uploads it
	// reported, per chunk: its failure was returned already (by the Step
	// that leased it, or by settle); finishRun does not return it again
	// (the rank goroutine only; nil: none).
	reported []bool
	// start, for a delayed (dpu) update, holds its cpuadam back until the
	// next step's forward has begun (begin): started at the step's end, it
	// would run while the devices are idle between the steps.
	start     chan struct{}
	startOnce sync.Once
	// startEv (set with start's close): cpuadam waits for it too, a mark
	// on the compute stream behind the first chunks of the next forward,
	// so that it starts once the devices' compute is under way (nil: at
	// once).
	startEv gpu.Event
	// flushes counts flushChunk's calls on a delayed run (the rank
	// goroutine only): begin records startEv at the dpuStartFlush-th.
	flushes int
	// held is, per chunk updated during the backward, its leases, kept
	// until the step is known finite (written before ready[c] closes).
	held []hostLeases
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

// hostWindow is how many chunks' state the rank leases ahead of cpuadam
// (tiers.window): chunk c+w's state is on its way while chunk c updates.
func (r *rank) hostWindow() int { return r.e.tiers.window }

// updateExact starts the host update of ap.Step (the run is pending,
// r.run): it leases the first hostWindow chunks' state in forward order
// and hands them to a goroutine that runs cpuadam, and returns with the
// first error of the tier store's leases (the chunks that failed are not
// updated). The rest are leased at the next pass's points that
// flushChunk marks, window by window, and at its end (waitHost,
// finishRun): points Model.AccessOrder fixes, so the rank's accesses to
// the store still come in one order step after step. Every chunk at once
// when nothing can leave host RAM.
func (r *rank) updateExact(ap gpu.AdamParams, delayed bool) error {
	run, err := r.startRun(ap, delayed)
	if err != nil {
		return err
	}
	defer r.tr.Optimizer(fmt.Sprintf("optimizer step %d (issue)", run.step), run.step, r.tr.Now())
	r.run = run
	// A delayed run's cpuadam waits for the next pass: the window's
	// chunks now, one more at each of that pass's flushes once it runs.
	return run.report(r.leaseAhead(run, r.hostWindow()))
}

// startRun starts a host update of step ap.Step (delayed: dpu's): its
// goroutine, waiting for jobs.
func (r *rank) startRun(ap gpu.AdamParams, delayed bool) (*hostRun, error) {
	cp := cpuadam.Params(ap) // one type (internal/adam)
	if err := cp.Validate(); err != nil {
		return nil, err
	}
	n := len(r.e.chunks)
	run := &hostRun{step: ap.Step, jobs: make(chan hostJob, n+1), ready: make([]chan struct{}, n), errs: make([]error, n),
		done: make(chan struct{}), flushed: make([]bool, n), handed: make([]bool, n), held: make([]hostLeases, n),
		delayed: delayed, lentAt: make([]int, n), reported: make([]bool, n)}
	for c := range run.lentAt {
		run.lentAt[c] = -1
	}
	if run.delayed {
		run.start = make(chan struct{})
	}
	for c := range run.ready {
		run.ready[c] = make(chan struct{})
		if r.e.chunks[c].frozen { // no update: nothing to wait for, nothing to upload
			close(run.ready[c])
			run.flushed[c] = true
		}
	}
	go r.hostLoop(run, cp)
	return run, nil
}

// leaseRest leases, in forward order, every chunk not yet handed to run
// and hands it over, then closes the run's jobs: the run is r.run, pending.
// Its error is the first lease failure (those chunks are not updated),
// which the caller's Step returns.
func (r *rank) leaseRest(run *hostRun) error {
	defer r.tr.Optimizer(fmt.Sprintf("optimizer step %d (issue)", run.step), run.step, r.tr.Now())
	r.run = run
	return run.report(r.leaseAhead(run, len(r.e.chunks)))
}

// report marks chunk c's failure err as returned (the caller returns
// it) and passes it on; c < 0: none.
func (run *hostRun) report(c int, err error) error {
	if c >= 0 {
		run.reported[c] = true
	}
	return err
}

// unreported is the first failure of run, in forward order, not returned
// yet, naming the optimizer step; it marks it returned.
func (r *rank) unreported(run *hostRun) error {
	for _, c := range r.e.fwdOrder {
		if err := run.errs[c]; err != nil && (run.reported == nil || !run.reported[c]) {
			if run.reported != nil {
				run.reported[c] = true
			}
			return fmt.Errorf("optimizer step %d: %w", run.step, err)
		}
	}
	return nil
}

// leasedAt is chunk c's index among the chunks leaseAhead leased, -1 when
// it did not lease c (handed in the backward, frozen, or a run rebuilt
// from a checkpoint).
func (run *hostRun) leasedAt(c int) int {
	if run.lentAt == nil {
		return -1
	}
	return run.lentAt[c]
}

// leaseAhead leases chunks in forward order, those not yet handed to run,
// and hands them over until run has lent k of them here, at most
// hostWindow ahead of cpuadam (before the i-th it waits for the update of
// the (i-w)-th: its leases are given back); after the last chunk it closes
// the run's jobs. A chunk whose lease fails is handed over with the error
// (not updated; finishRun or the caller reports it) and the rest go on:
// the run must close every chunk's ready. It returns the first failure
// and its chunk (-1, nil: none).
func (r *rank) leaseAhead(run *hostRun, k int) (int, error) {
	e := r.e
	if run.closed {
		return -1, nil
	}
	w := r.hostWindow()
	firstC, first := -1, error(nil)
	for ; run.nextPos < len(e.fwdOrder) && len(run.lent) < k; run.nextPos++ {
		c := e.fwdOrder[run.nextPos]
		if run.handed[c] || e.chunks[c].frozen {
			continue
		}
		if i := len(run.lent); i >= w {
			<-run.ready[run.lent[i-w]]
		}
		ls, err := r.leaseHost(c, run.delayed)
		if err != nil && first == nil {
			firstC, first = c, err
		}
		run.handed[c] = true
		run.lentAt[c] = len(run.lent)
		run.lent = append(run.lent, c)
		run.jobs <- hostJob{c: c, ls: ls, err: err}
	}
	if run.nextPos == len(e.fwdOrder) {
		close(run.jobs)
		run.closed = true
	}
	return firstC, first
}

// hostLoop runs the pending update's cpuadam chunk by chunk.
func (r *rank) hostLoop(run *hostRun, cp cpuadam.Params) {
	defer close(run.done)
	if run.start != nil {
		<-run.start
		if run.startEv != nil {
			run.startEv.Synchronize() // the next forward's compute is under way
		}
	}
	for j := range run.jobs {
		if j.release {
			for c, ls := range run.held {
				r.doneLeases(ls)
				run.held[c] = hostLeases{}
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
			run.held[j.c] = j.ls
		} else {
			r.doneLeases(j.ls)
		}
		run.errs[j.c] = j.err
		close(run.ready[j.c])
		// Let the rank's goroutine, woken by ready, enqueue the chunk's
		// upload and the forward behind it now: cpuadam's next chunk
		// would hold every P (its kernels are not preemptible) and the
		// devices would wait for the whole update.
		runtime.Gosched()
	}
}

// begin lets a delayed update's cpuadam start (once), after ev when ev
// is not nil.
func (run *hostRun) begin(ev gpu.Event) {
	if run.start != nil {
		run.startOnce.Do(func() {
			run.startEv = ev
			close(run.start)
		})
	}
}

// wait waits for the update's goroutine to have run every job (letting a
// delayed one start first).
func (run *hostRun) wait() {
	run.begin(nil)
	<-run.done
}

// flushChunk enqueues the device side of chunk c's pending update, after
// its cpuadam: the upload of the new param shard, the AllGather (stages
// 1-2, persistent chunks) and paramReady[c]. Called before anything of
// the next step reads chunk c's params, at points Model.AccessOrder fixes.
func (r *rank) flushChunk(c int) {
	if run := r.run; run != nil && run.delayed {
		r.beginDelayed(run)
		if run.flushes >= dpuStartFlush {
			// Its cpuadam runs: one more chunk at each flush (a point
			// the access order fixes, as under exact; the first may wait
			// for the update of the chunk a window back).
			r.leaseAhead(run, len(run.lent)+1) // a failure is run.errs[c]'s
		}
		return // dpu: the pass reads the params before the update; finishRun uploads it
	}
	r.flushNow(c)
}

// flushNow is flushChunk, also for a delayed update.
func (r *rank) flushNow(c int) {
	run := r.run
	if run == nil || run.flushed[c] {
		return
	}
	run.flushed[c] = true
	for !run.handed[c] && !run.closed {
		r.leaseAhead(run, len(run.lent)+1) // a failure is run.errs[c]'s
	}
	<-run.ready[c]
	r.e.chunks[c].path.publishHost(r, c, run.errs[c] == nil) // not updated: keep the old params
	if i := run.leasedAt(c); i >= 0 {
		// The next chunk's state: its reads overlap this chunk's
		// forward, its update the next ones'.
		r.leaseAhead(run, i+1+r.hostWindow())
	}
}

// updateReady says whether chunk c's params can be read without waiting
// for cpuadam: no pending update, or chunk c's part of it has run.
func (r *rank) updateReady(c int) bool {
	run := r.run
	if run == nil || run.flushed[c] || run.delayed {
		return true
	}
	select {
	case <-run.ready[c]:
		return true
	default:
		return false
	}
}

// waitHost waits until the pending update's goroutine has run every chunk
// (its leases are given back): before the rank's next access to the tier
// store outside the forward (the gradient's host copy).
func (r *rank) waitHost() {
	if r.run != nil {
		r.leaseAll(r.run) // a failure is run.errs[c]'s: finishRun reports it
		r.run.wait()
	}
}

// leaseAll leases every chunk of run not yet leased, letting a delayed
// run's cpuadam start first (the window waits for it).
func (r *rank) leaseAll(run *hostRun) {
	run.begin(nil)
	r.leaseAhead(run, len(r.e.chunks))
}

// finishRun completes the pending update: the device side of every chunk
// not yet flushed, in forward order (the same on every rank), then the
// goroutine's end. It returns the first chunk's failure, naming the
// optimizer step.
func (r *rank) finishRun() error {
	run := r.run
	if run == nil {
		return nil
	}
	if run.delayed {
		// dpu: the pass just enqueued may still read the params the
		// uploads and gathers overwrite (replicated chunks are read in
		// place).
		ev := r.dev.NewEvent()
		r.s.Record(ev)
		r.up.Wait(ev)
		r.cs.Wait(ev)
	}
	r.leaseAll(run) // a failure is run.errs[c]'s
	for _, c := range r.e.fwdOrder {
		r.flushNow(c)
	}
	run.wait()
	r.run = nil
	var stored error
	if run.delayed {
		stored = r.storeDelayed(run) // every chunk that was updated, also when another failed
	}
	if err := r.unreported(run); err != nil {
		return err
	}
	return stored
}

// settle finishes every rank's pending host update (exact overlap) and
// waits for the devices: called before anything reads or writes the
// params or the optimizer state outside a step (Params, Master,
// checkpoints, exports, the timeline, Close). Its error is the pending
// update's failure; the figures of the runs go to the engine's totals.
func (e *Engine) settle() error {
	if e.closed {
		return nil
	}
	pending := false
	for _, r := range e.ranks {
		pending = pending || r.run != nil
	}
	if !pending {
		return nil
	}
	figs := make([]report.HostOptStats, e.nLocal)
	err := e.parallel(func(r *rank) error {
		if run := r.run; run != nil && run.delayed {
			return r.settleDelayed() // dpu: the devices keep the params the next pass reads
		}
		err := r.finishRun()
		if err2 := r.sync(); err == nil {
			err = err2
		}
		figs[r.loc] = r.takeHostOpt()
		return err
	})
	for _, f := range figs {
		e.hostOpt.Add(f)
	}
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// leaseHost declares cpuadam's accesses of chunk c to the tier store,
// without waiting for them (await leases them): master, m, v (update), the
// gradient (read) and, with offload_param, the new param's host copy
// (write; not for a delayed update, which writes the staging:
// storeDelayed). On an error the accesses declared are abandoned.
func (r *rank) leaseHost(c int, delayed bool) (ls hostLeases, err error) {
	d := r.runner()
	// SizeBytes 0: the planner takes the placement's (the store's charge).
	acc := func(state shard.State, kind shard.Kind) shard.Access {
		return shard.Access{Key: tkey(c, r.loc, state), Phase: shard.Optimizer, Tier: shard.Host, Kind: kind}
	}
	defer func() {
		if err != nil {
			r.doneLeases(ls)
			ls = hostLeases{}
		}
	}()
	begin := func(i int, a shard.Access) error {
		ls.pend[i], err = d.Begin(a)
		return err
	}
	if begin(leaseMaster, acc(shard.Master, shard.Update)) != nil || begin(leaseM, acc(shard.AdamM, shard.Update)) != nil ||
		begin(leaseV, acc(shard.AdamV, shard.Update)) != nil || begin(leaseGrad, acc(shard.Grad, shard.Read)) != nil {
		return ls, err
	}
	if r.e.paramTiered(c) && !delayed {
		a := shard.Write
		if r.e.remainder() && r.masterParams(c) == nil { // in the tier store
			a = shard.Update // the old params are the masters' high halves (remainder.go)
		}
		if begin(leaseParam, acc(shard.Param, a)) != nil {
			return ls, err
		}
	}
	return ls, nil
}

// The leases of hostLeases, in the order leaseHost declares them.
const (
	leaseMaster = iota
	leaseM
	leaseV
	leaseGrad
	leaseParam
	leaseCount
)

// hostLeases are cpuadam's leases of one chunk's state in host memory:
// declared to the tier store by the rank's goroutine (leaseHost: their
// place in the access order), leased by the goroutine that runs cpuadam
// (await), so that the rank goes on with the forward while the state is
// read from NVMe.
type hostLeases struct {
	master, m, v *tier.Lease // Update
	grad         *tier.Lease // Read: the reduced gradient
	param        *tier.Lease // Write (Update: a remainder master's params): the new param's host copy (offload_param, not delayed); nil: the upload staging
	// pend are the accesses declared and not leased yet, in lease order
	// (nil: none, or leased).
	pend [leaseCount]*tier.Pending
}

// await leases every access of ls still pending, in order; on a failure
// it gives back what it leased and abandons the rest, and returns it.
func (r *rank) await(ls *hostLeases) error {
	d := r.runner()
	dst := [leaseCount]**tier.Lease{&ls.master, &ls.m, &ls.v, &ls.grad, &ls.param}
	var err error
	for i, p := range ls.pend {
		if p == nil {
			continue
		}
		ls.pend[i] = nil
		if err != nil {
			d.Abandon(p)
			continue
		}
		*dst[i], err = d.Await(p)
	}
	if err != nil {
		r.doneLeases(*ls)
		*ls = hostLeases{}
	}
	return err
}

// optState is master, m and v's leases, in that order.
func (ls hostLeases) optState() [3]*tier.Lease { return [3]*tier.Lease{ls.master, ls.m, ls.v} }

// doneLeases ends the leases of ls and abandons its pending accesses (nil
// entries: none).
func (r *rank) doneLeases(ls hostLeases) {
	for _, l := range [...]*tier.Lease{ls.master, ls.m, ls.v, ls.param, ls.grad} {
		if l != nil {
			r.runner().Done(l, nil)
		}
	}
	for _, p := range ls.pend {
		if p != nil {
			r.runner().Abandon(p)
		}
	}
}

// adamHost runs cpuadam on chunk c's leased state, writing the new params
// into their host copy in the store (offload_param) or into the chunk's
// pinned upload staging.
func (r *rank) adamHost(c int, cp cpuadam.Params, ls hostLeases) {
	e := r.e
	var out []byte
	if ls.param != nil {
		out = ls.param.Bytes()
	} else {
		out = e.tiers.uploadBytes(r.loc, c)
	}
	cp = cpuadam.Params(e.chunkAdam(c, gpu.AdamParams(cp)))
	mo, _ := cpuadam.MomentsOf(e.estimate.Options.StateDType(shard.AdamM))
	n := e.optElems(c)
	s := cpuadam.Shard{M: mo.View(n, ls.m.Bytes(), false), V: mo.View(n, ls.v.Bytes(), true)}
	var keep []byte // a remainder master's params when out is not them (remainder.go)
	if e.remainder() {
		s.Rem = cpuadam.RemainderView(n, ls.master.Bytes()) // completed by the params in out
		if p := r.masterParams(c); p != nil && ls.param != nil {
			keep = p
			copy(out, keep) // dpu's warm-up: the update writes the tier store's copy
		}
	} else {
		s.Param = f32s(ls.master.Bytes())
	}
	if e.precision.Half() {
		s.Grad16, s.Out, s.F16 = u16s(ls.grad.Bytes()), u16s(out), e.precision == gpu.F16
	} else {
		s.Grad = f32s(ls.grad.Bytes())
	}
	t0 := r.tr.Now()
	for lo := 0; lo < n; lo += adamPieceElems {
		e.opt.Step(cp, s.Slice(lo, min(lo+adamPieceElems, n)))
		runtime.Gosched()
	}
	if !e.precision.Half() {
		copy(f32s(out), s.Param)
	}
	copy(keep, out)
	r.tr.Adam(r.e.layout.Chunks[c].Name, c, r.e.chunks[c].shard, t0)
}

// adamPieceElems is the piece of a chunk cpuadam updates at a time (a
// multiple of cpuadam.QuantBlock; Adam is elementwise). Between pieces,
// runtime.Gosched lets the goroutines cpuadam's pool kept off the cores
// run (the rank's, which enqueues the devices' work): its kernels are not
// preemptible, so otherwise a whole update could run before anything else.
const adamPieceElems = 1 << 16
