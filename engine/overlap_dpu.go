package engine

import (
	"fmt"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// The delayed parameter update (strata.overlap "dpu"): its rules, its
// checkpoints and why resume stays bit-identical are in docs/DESIGN.md
// ("The host optimizer's schedules").

// dpuStartFlush is the flushChunk call of the next pass at which a delayed
// update's cpuadam is let go: the third, which comes once the pass has
// enqueued its first chunk's compute (at stages 0-2 the first two; at
// stage 3 the Acquire of the second chunk gathers the third ahead).
// Started at the first, cpuadam took the cores before the pass had
// enqueued anything, and its first pieces ran with the devices idle.
const dpuStartFlush = 3

// delayedSchedule is dpu's pending update (past the warm-up): the next
// pass reads the params of the step before while cpuadam runs (held back
// until that pass's dpuStartFlush-th flush), and the whole update is
// published at the pass's end.
type delayedSchedule struct{}

func (delayedSchedule) holdsStart() bool               { return true }
func (delayedSchedule) leasesParam() bool              { return false } // the staging: storeDelayed
func (delayedSchedule) ready(*pendingUpdate, int) bool { return true }  // the pass reads the old params

// order: the backward's, in which the next pass writes the gradients'
// host copies (beforeGrad). The pass reads the params before the update
// and the update is published at its end, so the order of the chunks
// changes nothing of the bits; in forward order, the backward's first
// gradient (the last layer's) would wait for the whole update.
func (delayedSchedule) order(e *Engine) []int { return e.gradOrder }

// beforeGrad, delayed: chunk c's update only. The rank leases up to
// chunk c (cpuadam follows the backward chunk by chunk, a window ahead),
// then waits for it; the rest runs on under the backward, at the points
// of its gradient writes, which the access order fixes.
func (delayedSchedule) beforeGrad(r *rank, u *pendingUpdate, c int) {
	u.begin(nil) // a pass of fewer flushes than dpuStartFlush has not let it go
	r.leaseUntil(u, c)
	if i := u.leasedAt(c); i >= 0 {
		r.leaseAhead(u, i+1+r.hostWindow()) // the next chunks' state: read while chunk c updates
	}
	<-u.chunks[c].ready
}

func (delayedSchedule) settle(r *rank) (report.HostOptStats, error) {
	return report.HostOptStats{}, r.settleDelayed()
}

// flush counts the pass's flushes (beginDelayed) and, once cpuadam runs,
// leases one more chunk at every second one (dpuFlushLease): the pass
// reads the params before the update; finish uploads it. The rest is
// leased at the backward's gradient writes (beforeGrad).
func (delayedSchedule) flush(r *rank, u *pendingUpdate, _ int) {
	r.beginDelayed(u)
	if u.flushes >= dpuStartFlush && (u.flushes-dpuStartFlush)%dpuFlushLease == 0 {
		// A point the access order fixes, as under exact; the lease may
		// wait for the update of the chunk a window back.
		r.leaseAhead(u, len(u.lent)+1) // a failure is u.chunks[c].err's
	}
}

// dpuFlushLease: a delayed update leases one chunk at every
// dpuFlushLease-th flush of the next forward, so that about half of it
// is read, updated and written back under the forward and the rest
// under the backward, chunk by chunk ahead of the gradient writes. At
// every flush (as before the backward took its part) a forward whose
// compute is a third of the backward's waited for nearly the whole
// update's I/O with the NVMe drive the busiest resource, and the
// backward's compute ran with the drive idle.
const dpuFlushLease = 2

// finish publishes the update at the end of the pass that read the old
// params, and stores the new params of the tier store's chunks.
func (delayedSchedule) finish(r *rank, u *pendingUpdate) error {
	// The pass just enqueued may still read the params the uploads and
	// gathers overwrite (replicated chunks are read in place).
	ev := r.dev.NewEvent()
	r.s.Record(ev)
	r.up.Wait(ev)
	r.cs.Wait(ev)
	r.publishAll(u)
	r.retire(u, runFinished)
	stored := r.storeDelayed(u) // every chunk that was updated, also when another failed
	if err := r.unreported(u); err != nil {
		return err
	}
	return stored
}

// beginDelayed counts the next pass's flushChunk calls on the delayed run
// and, at the dpuStartFlush-th, lets its cpuadam start after a mark on the
// compute stream: once the compute enqueued so far has run, i.e. while
// the devices work on the chunk the pass enqueues next. A model with
// fewer chunks starts it at the pass's end (finishRun's wait).
func (r *rank) beginDelayed(run *pendingUpdate) {
	run.flushes++
	if run.flushes != dpuStartFlush {
		return
	}
	ev := r.dev.NewEvent()
	r.s.Record(ev)
	run.begin(ev)
}

// storeDelayed copies a delayed update's new param shards of the chunks
// whose param the tier store holds from their staging into the store (a
// write access each, in forward order): at the end of the pass that read
// the old ones, after the update. The store lets the write in once no
// move reads the old copy, and drops the copies staged in HBM. It goes
// on past a failure (the other chunks' master moved on) and returns the
// first.
func (r *rank) storeDelayed(run *pendingUpdate) error {
	var first error
	for _, c := range r.e.fwdOrder {
		if !r.e.paramTiered(c) || r.e.chunks[c].frozen || run.chunks[c].err != nil {
			continue
		}
		l, err := r.runner().Use(shard.Access{Key: tkey(c, r.loc, shard.Param), Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Write})
		if err != nil {
			if first == nil {
				first = fmt.Errorf("optimizer step %d: %w", run.step, err)
			}
			continue
		}
		copy(l.Bytes(), r.e.tiers.uploadBytes(r.loc, c))
		r.runner().Done(l, nil)
	}
	return first
}

// settleDelayed waits for a delayed update's cpuadam and leaves its upload
// pending; it returns the update's first error.
func (r *rank) settleDelayed() error {
	run := r.run
	r.leaseAll(run)
	run.wait()
	return r.unreported(run) // once: the run stays pending, and finishRun does not repeat it
}

// pendingFromMaster makes the upload a restored dpu engine owes its
// devices: every chunk's new params are master rounded to the params'
// dtype, in the upload staging, as cpuadam would have left them.
func (r *rank) pendingFromMaster(step int64) error {
	e := r.e
	n := len(e.chunks)
	u := newPending(step, delayedSchedule{}, runComputed, n)
	u.closed = true
	for c := range u.chunks {
		close(u.chunks[c].ready)
		if e.chunks[c].frozen {
			u.chunks[c].flushed = true // no update, nothing to upload
			continue
		}
		master := make([]byte, 4*e.chunks[c].shard)
		if err := r.saveShard(c, shard.Master, master); err != nil {
			return err
		}
		copy(e.tiers.uploadBytes(r.loc, c), encode(decode(master, gpu.F32), e.precision))
		u.chunks[c].handed = true
	}
	close(u.done)
	r.run = u
	return nil
}

// restorePending drops every rank's pending update after a restore and,
// for a dpu engine past its warm-up, rebuilds the upload it owes. After a
// step skipped for an fp16 overflow it owes none (the skipped step's pass
// uploaded the update before it), and the upload rebuilt holds the
// params the devices already have: the same bits (TestFP16Resume).
func (e *Engine) restorePending(step int64) error {
	for _, r := range e.ranks {
		if r.run != nil {
			r.retire(r.run, runDropped)
		}
	}
	return e.parallel(func(r *rank) error { return e.upd.restored(r, step) })
}
