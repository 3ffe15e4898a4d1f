package engine

import (
	"fmt"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// DeviceSummary is one device's memory over the run so far.
type DeviceSummary struct {
	Device string
	// ModelStatePeakBytes is the measured peak of the device's allocations
	// tagged gpu.ModelState (MemStats.PeakByKind).
	ModelStatePeakBytes int64
	// FormulaBytes is the reference text's formula for this device's model
	// state (Formula: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N, or the device
	// share with the optimizer or params offloaded), evaluated for the
	// model; 0 in fp32 mode, which has no such formula.
	FormulaBytes int64
	Formula      string // "2Ψ + 14Ψ/N"
	// PaddingBytes is what the layout adds to the formula by aligning every
	// rank's slice of a chunk (ShardElems), and PersistentBytes what the
	// stage-3 chunks below the persistence threshold add by staying
	// gathered on every device.
	PaddingBytes, PersistentBytes int64
	// EstimateBytes is what the layout should hold: FormulaBytes +
	// PaddingBytes + PersistentBytes, estimate.Memory's DeviceBytes (the
	// arithmetic of `strata estimate`); in fp32 mode the same elements with
	// 4-byte params and grads and no separate master copy.
	EstimateBytes int64
	// EstimateRatio is ModelStatePeakBytes / (EstimateBytes + TierHBMBytes), FormulaRatio
	// ModelStatePeakBytes / FormulaBytes (0 without a formula).
	EstimateRatio, FormulaRatio float64
	// TierHBMBytes is the tier store's peak of copies staged on this
	// device: param shards (ZeRO-Infinity: a working set; the formula keeps
	// offloaded params off the device) and, with cpu_checkpointing, the
	// saved block inputs brought back.
	TierHBMBytes int64
	// TierSlotBytes is the device memory that holds those copies: the
	// store's HBM slots, taken at New (tier.Store.ReserveHBM); the param
	// shards' tagged gpu.ModelState and so counted in ModelStatePeakBytes,
	// the saved inputs' gpu.Activation and so in ActivationPeakBytes.
	TierSlotBytes int64

	// The working set, named: the engine's own transient buffers and the
	// model's activations.
	GatheredPeakBytes int64 // stage 3: gathered chunks in flight (at most MaxLiveChunks)
	BucketPeakBytes   int64 // stages 2-3: full gradient buckets and reduce shards in flight
	// WorkspaceRingBytes is the rings the two above (and the gradient
	// shards bound for the tier store) come from, taken at New.
	WorkspaceRingBytes int64
	WorkspacePeakBytes int64 // every allocation tagged gpu.Workspace (the rings and the norms)
	// ActivationPeakBytes is the measured peak of the device's allocations
	// tagged gpu.Activation: the model's activations and, with
	// cpu_checkpointing, the tier store's HBM slots of the saved inputs
	// brought back; ActivationEstimateBytes is estimate.Activations'
	// DeviceBytes (what `strata estimate` prints) and ActivationRatio the
	// first over the second.
	ActivationPeakBytes     int64
	ActivationEstimateBytes int64
	ActivationRatio         float64
	PeakBytes               int64 // everything on the device
	Moved                   gpu.LinkCounters
	// Driver is the device's driver allocations and frees since it was
	// made (gpu.DriverCounters), DeviceAllocsAfterStep1 those after the
	// first step completed (0 before it): every buffer a step uses is
	// taken at New or in the first step, so it stays 0.
	Driver                 gpu.DriverCounters
	DeviceAllocsAfterStep1 int64
}

// Outcomes of registering pinned host memory with the devices
// (HostRegistration.Outcome).
const (
	RegistrationOK     = "ok"     // registered: copies from and to it are page-locked DMA
	RegistrationFailed = "failed" // the registrar refused it (Error says why): pageable copies
	RegistrationNone   = "none"   // no Options.HostRegistrar: pageable copies on a GPU
)

// HostRegistration is the outcome of registering one pinned pool of the
// engine with the devices (Options.HostRegistrar).
type HostRegistration struct {
	Pool            string // "tier host copies", "param upload staging and grad norms"
	Bytes           int64  // the pool's mapped bytes
	Outcome         string // RegistrationOK, RegistrationFailed, RegistrationNone
	RegisteredBytes int64  // Bytes when ok, else 0
	Error           string // why it failed
}

// Summary describes a run: its layout and each device's measured memory
// next to the formula.
type Summary struct {
	Model   string
	Params  int64 // Ψ
	Devices int   // N: every process's (Options.Procs)
	// Processes is the job's processes (1 alone). Per device, host and
	// tier figures are this process's: its ranks', its pool, its store.
	Processes int
	Stage     int
	Precision gpu.DType
	Optimizer string // "device" or "host (cpuadam, T threads)", with narrow moments ", int8 moments)"
	Overlap   string // strata.overlap: "exact", "serial" or "dpu"
	Micro     int
	Accum     int
	Seq       int
	Steps     int64
	// SkippedSteps and LossScale are fp16's: the steps an overflow skipped
	// and the scale the next step runs with.
	SkippedSteps int64
	LossScale    float64
	// ShardAlignElems is the alignment of every rank's slice of a chunk.
	ShardAlignElems int64
	PerDevice       []DeviceSummary
	HostBytes       int64 // measured model state in host memory, all ranks (host optimizer: the tier store's host homes)
	HostFormula     int64 // estimate.Memory's HostBytes (with the gradient shard's dtype)
	// HostStagingBytes is the pinned parameter upload staging of the host
	// optimizer, all ranks: working set, not model state.
	HostStagingBytes int64
	// HostUndoBytes is, with strata.update_in_backward, the copy of the
	// optimizer state kept to undo a non-finite step, all ranks (Go heap,
	// taken at the first use): working set, not model state.
	HostUndoBytes int64
	// HostOpt is the host optimizer's figures summed over the runs taken
	// so far (a run pending under exact overlap counts once it completes).
	HostOpt HostOptStats
	// Tier is the tier store's layout and figures; nil without it.
	Tier *TierSummary
	// HostRegistration is the outcome of registering each pinned pool
	// with the devices; empty without pinned memory (optimizer on the
	// device, no cpu_checkpointing).
	HostRegistration []HostRegistration
	// Activations says how the model keeps its activations (dtype,
	// checkpointing, cpu_checkpointing), and ActivationHostBytes is the
	// saved inputs' pinned host memory with cpu_checkpointing, all ranks.
	Activations         string
	ActivationHostBytes int64
	// The frozen chunks (strata.freeze) by name, their parameters, and
	// the model state they do not keep: FrozenSavedBytes[state][tier] is
	// their gradients and master, m, v, all ranks, in the tier they would
	// have been in (device rows are N times one device's). Empty and zero
	// with nothing frozen.
	FrozenChunks     []string
	FrozenDescribed  string // FrozenChunks with consecutive blocks as ranges (DescribeChunks)
	FrozenParams     int64
	FrozenSavedBytes [shard.StateCount][shard.TierCount]int64
	// Collectives is what ran the collectives (Options.Collectives).
	Collectives string
	Notes       []string
}

// FrozenOptimizerSavedBytes is the optimizer state (master, m, v) the
// frozen chunks do not keep, all ranks and tiers.
func (s Summary) FrozenOptimizerSavedBytes() int64 {
	var b int64
	for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
		for t := range shard.TierCount {
			b += s.FrozenSavedBytes[st][t]
		}
	}
	return b
}

// FrozenGradSavedBytes is the gradient memory (device buffers and shards,
// host copies) the frozen chunks do not keep, all ranks and tiers.
func (s Summary) FrozenGradSavedBytes() int64 {
	var b int64
	for t := range shard.TierCount {
		b += s.FrozenSavedBytes[shard.Grad][t]
	}
	return b
}

// FrozenSavedTierBytes is what the frozen chunks do not keep in tier t,
// all ranks.
func (s Summary) FrozenSavedTierBytes(t shard.Tier) int64 {
	var b int64
	for st := range shard.StateCount {
		b += s.FrozenSavedBytes[st][t]
	}
	return b
}

// TierSummary is the tier store of a run: where the shard states live
// (homes, all ranks, next to the estimate's arithmetic), the budgets, and
// the figures summed over the run.
type TierSummary struct {
	ParamTier, OptimizerTier string   // "hbm", "host", "nvme"
	NVMePaths                []string // the swap files' directories (striped)
	SwapBytes                int64
	// Homes of the param shards, the optimizer state and (optimizer on
	// NVMe) the gradient shards, all ranks.
	HostHomeBytes, NVMeHomeBytes         int64
	EstimateHostBytes, EstimateNVMeBytes int64 // estimate.Memory's, the same states
	BudgetBytes                          [shard.TierCount]int64
	PeakBytes                            [shard.TierCount]int64 // since New (HBM: the largest device's)
	PinnedPoolBytes, PinnedPeakBytes     int64                  // the pinned pool (the host budget when given)
	LinkBytes                            [shard.LinkCount]int64
	PrefetchCounts                       // since New
	Rerecords                            int64
	// OptimizerStateBytes is the homes of master, m and v per tier, all
	// ranks; Moments their precision (strata.optimizer_state.moments).
	OptimizerStateBytes [shard.TierCount]int64
	Moments             string
}

func (e *Engine) tierSummary() *TierSummary {
	t := e.tiers
	ts := &TierSummary{ParamTier: t.paramTier.String(), OptimizerTier: t.optTier.String(), NVMePaths: t.nvmePaths, SwapBytes: t.swapBytes,
		Moments: estimate.MomentsName(e.estimate.Options.StateDType(shard.AdamM))}
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
	for l := range ts.LinkBytes {
		ts.LinkBytes[l] = ss.Links[l].Bytes
	}
	for _, d := range t.runners {
		p, _ := d.stats()
		ts.Add(countsOf(p), nil)
		ts.Rerecords += p.Rerecords
	}
	return ts
}

// Summary reports the layout and the measured peaks so far.
func (e *Engine) Summary() Summary {
	s := Summary{
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
		s.Optimizer = fmt.Sprintf("host (cpuadam, %d threads%s)", e.opt.Options().Threads, e.estimate.Options.MomentsNote())
		s.HostFormula = e.hostWant
	}
	if e.tiers != nil {
		s.Tier = e.tierSummary()
		s.HostBytes = s.Tier.HostHomeBytes
		s.HostStagingBytes = e.tiers.stagingBytes
		s.HostUndoBytes = int64(e.nLocal) * e.undoBytes()
		s.HostRegistration = append([]HostRegistration(nil), e.registration...)
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
		d := DeviceSummary{
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
