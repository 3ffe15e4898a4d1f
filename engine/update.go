package engine

import (
	"fmt"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/timeline"
)

// updater is the step's optimizer strategy, chosen once in New from where
// the optimizer state lives and strata.overlap (chooseUpdater): Step calls
// it at fixed points and tests no configuration itself.
type updater interface {
	// beforePass starts on rank r what the coming backward feeds (the
	// update during the backward); the others do nothing.
	beforePass(r *rank, step int64) error
	// update applies Adam with ap to the rank's shards once the step is
	// known finite (the pipelined ones issue it and return).
	update(r *rank, ap gpu.AdamParams) error
	// reduced takes chunk c's reduced gradient shard g once its norm is
	// enqueued (during the backward, at a point the access order fixes).
	reduced(r *rank, c int, g gpu.Buffer) error
	// abort drops what beforePass started, after a failed or non-finite
	// step: nothing of it reaches the params.
	abort(r *rank)
	// restored rebuilds, after a restore to step, what the update of step
	// still owes the devices (dpu past its warm-up: the upload).
	restored(r *rank, step int64) error
}

// chooseUpdater is the engine's updater: on the device, or on the host
// serially, pipelined under the next pass (exact; dpu, whose updates past
// the warm-up are delayed: delayedUpdate), or during the backward.
func chooseUpdater(e *Engine) updater {
	switch {
	case !e.offload:
		return deviceUpdate{}
	case e.overlap == OverlapSerial:
		return serialUpdate{}
	case e.bwdEnabled():
		return backwardUpdate{}
	case e.overlap == OverlapDPU:
		return delayedUpdate{warmup: int64(e.cfg.Strata.DPUWarmupSteps)}
	default:
		return pipelinedUpdate{}
	}
}

// bwdEnabled says whether the engine updates chunks during the backward.
func (e *Engine) bwdEnabled() bool {
	return e.cfg.Strata.UpdateInBackward && e.offload && e.overlap == OverlapExact && e.tiers != nil && e.tiers.swap == nil
}

// deviceUpdate runs Adam on the device, chunk by chunk on the compute
// stream, and publishes each new param shard (paramPath.publishDevice).
type deviceUpdate struct{}

func (deviceUpdate) beforePass(*rank, int64) error        { return nil }
func (deviceUpdate) reduced(*rank, int, gpu.Buffer) error { return nil }
func (deviceUpdate) abort(*rank)                          {}
func (deviceUpdate) restored(*rank, int64) error          { return nil }

func (deviceUpdate) update(r *rank, ap gpu.AdamParams) error {
	e, st := r.e, r.st
	defer r.tr.Optimizer(fmt.Sprintf("optimizer step %d", ap.Step), ap.Step, r.tr.Now())
	for c, p := range e.chunks {
		if p.frozen {
			continue // no update: the params stay as they are, paramReady[c] too
		}
		pm, m, v, out := st.deviceOpt(c)
		from := r.tr.Mark(r.s)
		r.ops.AdamStep(r.s, pm, st.gradShard(c), m, v, out, e.chunkAdam(c, ap))
		r.tr.Compute(from, r.tr.Mark(r.s), timeline.Label{Op: "adam", Chunk: e.layout.Chunks[c].Name, Note: "device", Index: c})
		p.path.publishDevice(r, c)
	}
	return nil
}

// serialUpdate runs cpuadam inside Step, after the whole backward, chunk
// by chunk, and publishes each new param shard (paramPath.publishHost):
// the schedule before the pipelined one, and the reference it is measured
// against.
type serialUpdate struct{}

func (serialUpdate) beforePass(*rank, int64) error { return nil }
func (serialUpdate) abort(*rank)                   {}
func (serialUpdate) restored(*rank, int64) error   { return nil }

func (serialUpdate) reduced(r *rank, c int, g gpu.Buffer) error {
	_, err := r.gradToHost(c, g)
	return err
}

func (serialUpdate) update(r *rank, ap gpu.AdamParams) error {
	defer func() { r.hostFig.Add(r.takeHostOpt()) }()
	cp := cpuadam.Params(ap) // one type (package adam)
	if err := cp.Validate(); err != nil {
		return err
	}
	var first error
	defer r.tr.Optimizer(fmt.Sprintf("optimizer step %d", ap.Step), ap.Step, r.tr.Now())
	for c, p := range r.e.chunks {
		if p.frozen {
			continue // no update: the params stay as they are, paramReady[c] too
		}
		err := r.stepHost(c, cp)
		if err != nil && first == nil {
			first = err // go on: every rank must issue the same collectives
		}
		p.path.publishHost(r, c, err == nil) // not updated: the staging holds no new params, keep the old ones
	}
	return first
}

// pipelinedUpdate issues the host update (exact overlap): cpuadam runs
// under the next pass, each chunk published when that pass first needs
// it (updateExact and exactSchedule, overlap.go).
type pipelinedUpdate struct{}

func (pipelinedUpdate) beforePass(*rank, int64) error { return nil }
func (pipelinedUpdate) abort(*rank)                   {}
func (pipelinedUpdate) restored(*rank, int64) error   { return nil }

func (pipelinedUpdate) reduced(r *rank, c int, g gpu.Buffer) error {
	_, err := r.gradToHost(c, g)
	return err
}

func (pipelinedUpdate) update(r *rank, ap gpu.AdamParams) error {
	return r.updateExact(ap, exactSchedule{})
}

// delayedUpdate is the delayed parameter update (strata.overlap "dpu"):
// pipelined as pipelinedUpdate for the warm-up steps, then under
// delayedSchedule, the next pass reading the params before the update
// (overlap_dpu.go).
type delayedUpdate struct {
	pipelinedUpdate
	warmup int64 // the steps updated exactly first (strata.dpu_warmup_steps)
}

// schedule is the update of step's: exact during the warm-up, delayed
// after it.
func (u delayedUpdate) schedule(step int64) hostSchedule {
	if step > u.warmup {
		return delayedSchedule{}
	}
	return exactSchedule{}
}

func (u delayedUpdate) update(r *rank, ap gpu.AdamParams) error {
	return r.updateExact(ap, u.schedule(ap.Step))
}

// restored rebuilds the upload a delayed update of step owes the devices.
func (u delayedUpdate) restored(r *rank, step int64) error {
	if step <= u.warmup {
		return nil
	}
	return r.pendingFromMaster(step)
}

// backwardUpdate starts the host update during the backward
// (overlap_bwd.go) as if the step were not clipped (speculation), commits
// it once the step is finite and not clipped (validation), and undoes it
// when not; a clipped step is then updated after the backward, as
// pipelinedUpdate does, and so is the step after it.
type backwardUpdate struct{}

func (backwardUpdate) beforePass(r *rank, step int64) (err error) {
	if r.clipped {
		return nil // clipped last step: likely again; no run to hand chunks to
	}
	r.next, err = r.startRun(r.e.nextAdam(1), exactSchedule{}, runHanding) // GradScale 1 (over the fp16 loss scale): not clipped
	if err == nil {
		r.bwdSteps++
	}
	return err
}

// reduced hands chunk c to cpuadam once its gradient's copy to host
// memory is enqueued.
func (backwardUpdate) reduced(r *rank, c int, g gpu.Buffer) error {
	ev, err := r.gradToHost(c, g)
	if err != nil {
		return err
	}
	return r.handBackward(c, ev)
}

func (backwardUpdate) restored(*rank, int64) error { return nil }

// update commits the updates of the backward when the step's Adam
// parameters are those they ran with (not clipped: the same bits); else it
// undoes them and runs the step's update as pipelinedUpdate does.
func (backwardUpdate) update(r *rank, ap gpu.AdamParams) error {
	r.clipped = ap != r.e.nextAdam(1)
	if r.next != nil && r.clipped {
		r.abortNext()
		r.bwdRedos++
	}
	if r.next == nil {
		return r.updateExact(ap, exactSchedule{})
	}
	return r.commitNext()
}

func (backwardUpdate) abort(r *rank) { r.abortNext() }
