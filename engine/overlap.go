package engine

import (
	"fmt"
	"runtime"

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
	return chunkOrder(order, chunks, model.AccessAcquire)
}

// gradientOrder is the chunks in the order the backward makes their
// gradients ready (their first AccessGradReady): the order it writes
// their host copies (gradToHost), which a delayed update follows
// (delayedSchedule.order).
func gradientOrder(order []model.Access, chunks int) []int {
	return chunkOrder(order, chunks, model.AccessGradReady)
}

// chunkOrder is the chunks in the order of their first access of kind in
// order, then those it never names.
func chunkOrder(order []model.Access, chunks int, kind model.AccessKind) []int {
	seen := make([]bool, chunks)
	var out []int
	for _, a := range order {
		if a.Kind == kind && !seen[a.Chunk] {
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

// hostWindow is how many chunks' state the rank leases ahead of cpuadam
// (tiers.window): chunk c+w's state is on its way while chunk c updates.
func (r *rank) hostWindow() int { return r.e.tiers.window }

// updateExact starts the host update of ap.Step under sched (the update
// is pending, r.run): it leases the first hostWindow chunks' state in its
// schedule's order (forward order; dpu: the backward's) and hands them to
// a goroutine that runs cpuadam, and returns with the first error of the
// tier store's leases (the chunks that failed are not updated). The rest
// are leased at the next pass's points that flushChunk marks, window by
// window, and at its gradient writes (waitGrad) and end (finishRun):
// points Model.AccessOrder fixes, so the rank's accesses to the store
// still come in one order step after step. Every chunk at once when
// nothing can leave host RAM.
func (r *rank) updateExact(ap gpu.AdamParams, sched hostSchedule) error {
	u, err := r.startRun(ap, sched, runLeasing)
	if err != nil {
		return err
	}
	defer r.tr.Optimizer(fmt.Sprintf("optimizer step %d (issue)", u.step), u.step, r.tr.Now())
	r.run = u
	// A delayed update's cpuadam waits for the next pass: the window's
	// chunks now, one more at each of that pass's flushes once it runs.
	return u.report(r.leaseAhead(u, r.hostWindow()))
}

// leaseRest leases, in forward order, every chunk not yet handed to u
// and hands it over, then closes u's jobs: u is r.run, pending.
// Its error is the first lease failure (those chunks are not updated),
// which the caller's Step returns.
func (r *rank) leaseRest(u *pendingUpdate) error {
	defer r.tr.Optimizer(fmt.Sprintf("optimizer step %d (issue)", u.step), u.step, r.tr.Now())
	u.to(runLeasing)
	r.run = u
	return u.report(r.leaseAhead(u, len(r.e.chunks)))
}

// leaseAhead leases chunks in u's order (its schedule's: forward order,
// or under dpu the backward's), those not yet handed to u,
// and hands them over until u has lent k of them here, at most
// hostWindow ahead of cpuadam (before the i-th it waits for the update of
// the (i-w)-th: its leases are given back); after the last chunk it closes
// u's jobs. A chunk whose lease fails is handed over with the error
// (not updated; finishRun or the caller reports it) and the rest go on:
// the update must close every chunk's ready. It returns the first failure
// and its chunk (-1, nil: none).
func (r *rank) leaseAhead(u *pendingUpdate, k int) (int, error) {
	e := r.e
	if u.closed {
		return -1, nil
	}
	w := r.hostWindow()
	order := u.sched.order(e)
	firstC, first := -1, error(nil)
	for ; u.nextPos < len(order) && len(u.lent) < k; u.nextPos++ {
		c := order[u.nextPos]
		if u.chunks[c].handed || e.chunks[c].frozen {
			continue
		}
		if i := len(u.lent); i >= w {
			<-u.chunks[u.lent[i-w]].ready
		}
		ls, err := r.leaseHost(c, u.sched.leasesParam())
		if err != nil && first == nil {
			firstC, first = c, err
		}
		u.chunks[c].handed = true
		u.chunks[c].lentAt = len(u.lent)
		u.lent = append(u.lent, c)
		u.jobs <- hostJob{c: c, ls: ls, err: err}
	}
	if u.nextPos == len(order) {
		u.closeJobs()
	}
	return firstC, first
}

// flushChunk enqueues the device side of chunk c's pending update, after
// its cpuadam: the upload of the new param shard, the AllGather (stages
// 1-2, persistent chunks) and paramReady[c]. Called before anything of
// the next step reads chunk c's params, at points Model.AccessOrder fixes
// (a delayed update's schedule defers it to finishRun).
func (r *rank) flushChunk(c int) {
	if u := r.run; u != nil {
		u.sched.flush(r, u, c)
	}
}

// exactSchedule is the pending update the next pass reads: each chunk's
// new params are published at the pass's first use of the chunk.
type exactSchedule struct{}

func (exactSchedule) holdsStart() bool                       { return false }
func (exactSchedule) leasesParam() bool                      { return true }
func (exactSchedule) order(e *Engine) []int                  { return e.fwdOrder }
func (exactSchedule) flush(r *rank, _ *pendingUpdate, c int) { r.flushNow(c) }
func (exactSchedule) ready(u *pendingUpdate, c int) bool {
	return u.chunks[c].flushed || isClosed(u.chunks[c].ready)
}
func (exactSchedule) finish(r *rank, u *pendingUpdate) error {
	r.publishAll(u)
	r.retire(u, runFinished)
	return r.unreported(u)
}

// settle finishes the update (there may be none), waits for the devices
// and takes the rank's figures.
func (exactSchedule) settle(r *rank) (report.HostOptStats, error) {
	err := r.finishRun()
	if err2 := r.sync(); err == nil {
		err = err2
	}
	return r.takeHostOpt(), err
}

// isClosed says whether ch is closed, without waiting.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// flushNow is flushChunk, also for a delayed update.
func (r *rank) flushNow(c int) {
	u := r.run
	if u == nil || u.chunks[c].flushed {
		return
	}
	u.chunks[c].flushed = true
	r.leaseUntil(u, c)
	<-u.chunks[c].ready
	r.e.chunks[c].path.publishHost(r, c, u.chunks[c].err == nil) // not updated: keep the old params
	if i := u.leasedAt(c); i >= 0 {
		// The next chunk's state: its reads overlap this chunk's
		// forward, its update the next ones'.
		r.leaseAhead(u, i+1+r.hostWindow())
	}
}

// leaseUntil leases u's chunks in its order until chunk c is handed over
// (or none is left to lease). A failure is u.chunks[c].err's.
func (r *rank) leaseUntil(u *pendingUpdate, c int) {
	for !u.chunks[c].handed && !u.closed {
		r.leaseAhead(u, len(u.lent)+1)
	}
}

// publishAll enqueues the device side of every chunk of u not yet
// flushed, in forward order (the same on every rank), then waits for the
// goroutine's end (u is computed).
func (r *rank) publishAll(u *pendingUpdate) {
	r.leaseAll(u) // a failure is u.chunks[c].err's
	for _, c := range r.e.fwdOrder {
		r.flushNow(c)
	}
	u.wait()
}

// updateReady says whether chunk c's params can be read without waiting
// for cpuadam: no pending update, or chunk c's part of it has run (or the
// pass reads the old params: dpu).
func (r *rank) updateReady(c int) bool {
	u := r.run
	return u == nil || u.sched.ready(u, c)
}

// waitGrad waits until the pending update no longer needs chunk c's
// gradient in its host copy: before the backward writes it again
// (gradToHost). Its schedule says how much of the update that is.
func (r *rank) waitGrad(c int) {
	if r.run != nil {
		r.run.sched.beforeGrad(r, r.run, c) // a failure is u.chunks[c].err's: finishRun reports it
	}
}

// beforeGrad, exact: the whole update (it has run under the forward; what
// is left runs now).
func (exactSchedule) beforeGrad(r *rank, u *pendingUpdate, _ int) {
	r.leaseAll(u)
	u.wait()
}

// leaseAll leases every chunk of u not yet leased, letting a delayed
// update's cpuadam start first (the window waits for it).
func (r *rank) leaseAll(u *pendingUpdate) {
	u.begin(nil)
	r.leaseAhead(u, len(r.e.chunks))
}

// finishRun completes the pending update (its schedule's finish): the
// device side of every chunk not yet flushed, in forward order (the same
// on every rank), then the goroutine's end. It returns the first chunk's
// failure, naming the optimizer step.
func (r *rank) finishRun() error {
	u := r.run
	if u == nil {
		return nil
	}
	return u.sched.finish(r, u)
}

// settle finishes every rank's pending host update (exact overlap; dpu's
// is computed and its upload left to the next pass) and waits for the
// devices: called before anything reads or writes the params or the
// optimizer state outside a step (Params, Master, checkpoints, exports,
// the timeline, Close). Its error is the pending update's failure; the
// figures of the updates go to the engine's totals.
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
	err := e.parallel(func(r *rank) (err error) {
		var sched hostSchedule = exactSchedule{} // none pending: the devices and the figures still
		if u := r.run; u != nil {
			sched = u.sched
		}
		figs[r.loc], err = sched.settle(r)
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
// gradient (read) and, with offload_param and param, the new param's host
// copy (the master format's access: masterFormat.paramKind; a delayed
// update, param false, writes the staging: storeDelayed). On an error the
// accesses declared are abandoned.
func (r *rank) leaseHost(c int, param bool) (ls hostLeases, err error) {
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
	if r.e.paramTiered(c) && param {
		if begin(leaseParam, acc(shard.Param, r.e.masters.paramKind(r, c))) != nil {
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
	n := e.optElems(c)
	s := cpuadam.Shard{M: e.moments.View(n, ls.m.Bytes(), false), V: e.moments.View(n, ls.v.Bytes(), true)}
	keep := e.masters.bind(r, c, &s, ls, out) // a remainder master's params when out is not them (remainder.go)
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
