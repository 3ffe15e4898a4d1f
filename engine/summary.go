package engine

import (
	"fmt"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

func (e *Engine) tierSummary() *report.TierSummary {
	t := e.tiers
	ts := &report.TierSummary{ParamTier: t.paramTier.String(), OptimizerTier: t.optTier.String(), NVMePaths: t.nvmePaths, SwapBytes: t.swapBytes,
		Moments: estimate.MomentsName(e.estimate.Options.StateDType(shard.AdamM)), Master: estimate.MasterName(e.estimate.Options.StateDType(shard.Master))}
	for st := range shard.StateCount {
		if shard.State(st) == shard.Activation {
			continue // not model state: Summary.ActivationHostBytes
		}
		ts.HostHomeBytes += t.homes[st][shard.Host]
		ts.NVMeHomeBytes += t.homes[st][shard.NVMe]
		if s := shard.State(st); s == shard.Master || s == shard.AdamM || s == shard.AdamV {
			for tier := range shard.TierCount {
				ts.OptimizerStateBytes[tier] += t.homes[st][tier]
			}
		}
		scale := int64(1)
		if shard.State(st) == shard.Grad && e.precision == gpu.F32 {
			scale = 2 // the estimate's host gradient is bf16, the store's as the device holds it
		}
		ts.EstimateHostBytes += scale * int64(e.nLocal) * e.estimate.PerRank[st][shard.Host] // this process's: the store's
		ts.EstimateNVMeBytes += scale * int64(e.nLocal) * e.estimate.PerRank[st][shard.NVMe]
	}
	ss := t.store.Stats()
	for _, u := range ss.HBM {
		ts.PeakBytes[shard.HBM] = max(ts.PeakBytes[shard.HBM], t.peakHBM)
		ts.BudgetBytes[shard.HBM] = u.BudgetBytes
	}
	ts.PeakBytes[shard.Host], ts.BudgetBytes[shard.Host] = t.peakHost, ss.Host.BudgetBytes
	ts.PeakBytes[shard.NVMe], ts.BudgetBytes[shard.NVMe] = ss.NVMe.PeakBytes, ss.NVMe.BudgetBytes
	ps := t.pool.Stats()
	ts.PinnedPoolBytes, ts.PinnedPeakBytes = ps.BudgetBytes, ps.PeakBytes
	ts.PinnedRelocations, ts.PinnedRelocatedBytes = ps.Relocations, ps.RelocatedBytes
	for l := range ts.LinkBytes {
		ts.LinkBytes[l] = ss.Links[l].Bytes
	}
	for _, d := range t.runners {
		p, _ := d.stats()
		ts.Add(report.CountsOf(p), nil)
		ts.Rerecords += p.Rerecords
	}
	return ts
}

// Summary reports the layout and the measured peaks so far.
func (e *Engine) Summary() report.Summary {
	s := report.Summary{
		Model: e.layout.Name, Params: e.layout.ParamCount(), Devices: e.n, Processes: e.n / e.nLocal, Stage: e.stage, Precision: e.precision,
		ShardAlignElems: e.estimate.Options.ShardAlignElems,
		Optimizer:       "device", Overlap: e.overlap, HostOpt: e.hostOpt, Micro: e.micro, Accum: e.accum, Seq: e.seq, Steps: e.step, SkippedSteps: e.skipped, LossScale: e.LossScale(),
		Notes: e.Notes(), Collectives: e.opts.Collectives, Activations: estimate.DescribeActivations(e.act, e.layout.Shape.Layers),
	}
	var actEstimate int64 // a library model's activations are its own: no estimate
	if !e.layout.Custom() {
		actEstimate = estimate.Activations(e.layout.Shape, e.micro, e.seq, e.act).DeviceBytes()
	}
	if e.offload {
		s.Optimizer = fmt.Sprintf("host (cpuadam, %d threads%s)", e.opt.Options().Threads, e.estimate.Options.StateNote())
		s.HostFormula = e.hostWant
	}
	if e.tiers != nil {
		s.Tier = e.tierSummary()
		s.HostBytes = s.Tier.HostHomeBytes
		s.HostStagingBytes = e.tiers.stagingBytes
		s.HostUndoBytes = int64(e.nLocal) * e.undoBytes()
		s.BackwardUpdates, s.BackwardRedos = e.ranks[0].bwdSteps, e.ranks[0].bwdRedos // every rank takes the same verdicts
		s.HostRegistration = append([]report.HostRegistration(nil), e.registration...)
		s.ActivationHostBytes = e.tiers.homes[shard.Activation][shard.Host]
	}
	fr := e.estimate.Options.Frozen
	s.FrozenChunks, s.FrozenDescribed, s.FrozenParams, s.FrozenSavedBytes = frozenNames(e.layout, fr), estimate.DescribeChunks(e.layout, fr), e.estimate.FrozenParams, e.frozenSaved()
	formula, formulaBytes := e.estimate.TierFormula(shard.HBM).String(), e.estimate.FormulaDeviceBytes()
	padding, persistent := e.estimate.PaddingBytes(), e.estimate.PersistentBytes
	if e.precision == gpu.F32 {
		formula, formulaBytes, padding, persistent = "fp32 layout", 0, 0, 0
	}
	var tierHBM, tierSlots []int64
	if e.tiers != nil {
		tierHBM, tierSlots = e.tiers.peakHBMByDevice, e.tiers.store.SlotBytes()
	}
	for i, r := range e.ranks {
		ms := r.dev.MemStats()
		d := report.DeviceSummary{
			Device:                  r.dev.Name(),
			ModelStatePeakBytes:     ms.PeakByKind[gpu.ModelState],
			FormulaBytes:            formulaBytes,
			Formula:                 formula,
			PaddingBytes:            padding,
			PersistentBytes:         persistent,
			EstimateBytes:           e.expected,
			GatheredPeakBytes:       r.ws.gatheredPeakBytes,
			BucketPeakBytes:         r.ws.bucketPeakBytes,
			WorkspaceRingBytes:      r.ringBytes(),
			WorkspacePeakBytes:      ms.PeakByKind[gpu.Workspace],
			ActivationPeakBytes:     ms.PeakByKind[gpu.Activation],
			ActivationEstimateBytes: actEstimate,
			PeakBytes:               ms.PeakBytes,
			Moved:                   r.dev.Counters(),
			Driver:                  r.dev.DriverCounters(),
		}
		if i < len(e.driverAt1) {
			d.DeviceAllocsAfterStep1 = d.Driver.Total() - e.driverAt1[i].Total()
		}
		if d.ActivationEstimateBytes > 0 {
			d.ActivationRatio = float64(d.ActivationPeakBytes) / float64(d.ActivationEstimateBytes)
		}
		if i < len(tierHBM) {
			d.TierHBMBytes = tierHBM[i]
		}
		if i < len(tierSlots) {
			d.TierSlotBytes = tierSlots[i]
		}
		if d.EstimateBytes+d.TierHBMBytes > 0 {
			d.EstimateRatio = float64(d.ModelStatePeakBytes) / float64(d.EstimateBytes+d.TierHBMBytes) // the tier store's param copies are model state
		}
		if d.FormulaBytes > 0 {
			d.FormulaRatio = float64(d.ModelStatePeakBytes) / float64(d.FormulaBytes)
		}
		s.PerDevice = append(s.PerDevice, d)
	}
	return s
}

// frozenSaved is the model state the frozen chunks do not keep, all ranks,
// by state and tier: the estimate's (bf16 arithmetic), in fp32 mode with
// 4-byte gradients and no master on the device (the params are the master
// weights; the host optimizer keeps one).
func (e *Engine) frozenSaved() [shard.StateCount][shard.TierCount]int64 {
	var out [shard.StateCount][shard.TierCount]int64
	for st := range shard.StateCount {
		for t := range shard.TierCount {
			v := int64(e.n) * e.estimate.FrozenSavedPerRank[st][t]
			if e.precision == gpu.F32 {
				switch {
				case shard.State(st) == shard.Grad:
					v *= 2
				case shard.State(st) == shard.Master && shard.Tier(t) == shard.HBM:
					v = 0
				}
			}
			out[st][t] = v
		}
	}
	return out
}

// workspaceNeedBytes is the most transient device memory a rank takes in a
// step: MaxLiveChunks gathered chunks (stage 3), each the largest chunk,
// three gradient buckets with their reduce shards (stages 2-3), each the
// largest trainable chunk, and the gradient shards bound for the tier
// store (workingSet). (The frozen chunks' gradient scratch is allocated at
// New, the tier store's HBM room is added by allocate.)
func (e *Engine) workspaceNeedBytes() int64 {
	w := e.workingSet()
	return w.GatheredBytes + w.BucketBytes + w.GradShardBytes
}

// workingSet is the working set of each rank (estimate.WorkingSetFor).
func (e *Engine) workingSet() estimate.WorkingSet {
	o := e.estimate.Options
	return estimate.WorkingSetFor(o.ChunkParams, e.estimate.ShardElems, o.Frozen, e.n, e.stage, e.opts.MaxLiveChunks, e.accum, o, int64(e.precision.Size()))
}
