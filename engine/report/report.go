// Package report holds the figures an engine reports, as plain values.
//
// They are each step's (StepStats, with the tier store's TierStats and the
// planners' PrefetchCounts), an evaluation's (EvalStats), the host
// optimizer's (HostOptStats), and the run's summary (Summary,
// DeviceSummary, TierSummary, HostRegistration). Package engine fills them
// and returns them under these names; cmd and bench print them. Nothing
// here touches a step.
package report

import (
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
)

// StepStats describe one optimizer step.
type StepStats struct {
	Step int64   // 1 for the first
	Loss float64 // mean over the global batch's micro-batches of their mean loss
	// RouterLoss is a mixture of experts' load-balancing loss
	// (load_balancing_loss_func, before router_aux_loss_coef), the mean
	// over the micro-batches; 0 for a dense model. Loss includes it times
	// the coefficient when the shape's output_router_logits is set.
	RouterLoss float64
	LR         float64
	GradNorm   float64 // global L2 norm of the gradient before clipping
	ClipCoef   float64 // factor applied to the gradient (1 when not clipped)
	// LossScale is the loss scale the step ran with (fp16; 1 otherwise);
	// Skipped says the step overflowed and updated nothing (engine's fp16.go).
	LossScale float64
	Skipped   bool
	Duration  time.Duration
	// ComputeBusy is the time the compute stream ran work since the last
	// step ended, its waits for shards and collectives excluded (the
	// longest of the ranks): the compute a step needs. 0 where the backend
	// does not count it (gpu.BusyStream: the CPU backend does).
	ComputeBusy time.Duration
	Tokens      int     // tokens of the global batch
	TokensPer   float64 // tokens per second of this step
	// Moved is the bytes moved on each link by all devices together since
	// the previous step's backward pass ended (so the previous step's
	// parameter updates and gathers count in this step).
	Moved gpu.LinkCounters
	// OptimizerTime is the wall time of the optimizer phase (all ranks).
	OptimizerTime time.Duration
	// Tier is the tier store's figures (hit rate, stalls, bytes per link,
	// peak bytes per tier); nil with the optimizer on the device (no store).
	Tier *TierStats
	// HostOpt is the host optimizer's time (cpuadam, its state's waits)
	// and how much of it the devices did not hide, of the optimizer runs
	// that completed in this Step: with overlap exact the previous step's
	// (it runs under this step's forward), with serial this step's own.
	// Zero with the optimizer on the device.
	HostOpt HostOptStats
}

// EvalStats are the figures of a validation pass (engine.Eval).
type EvalStats struct {
	// Loss is the mean next-token loss (nats) over the target tokens of
	// every row: each micro-batch's mean times its target count, summed in
	// round and rank order, over Tokens.
	Loss float64
	// Tokens is the number of target tokens (targets not
	// model.IgnoreTarget).
	Tokens int64
	// Rows is the number of rows evaluated (the set's Len).
	Rows     int64
	Duration time.Duration
}

// HostOptStats is the host optimizer's time (cpuadam and the waits for
// its state), measured on each rank and summed over the ranks.
type HostOptStats struct {
	// Adam is cpuadam's busy time: the sum over the ranks and chunks of
	// its runs.
	Adam time.Duration
	// AdamExposed is the time in which a rank's cpuadam ran and that rank's
	// compute stream was idle (summed over the ranks): what the devices
	// did not hide.
	AdamExposed time.Duration
	// IOWait is the time the ranks waited for master, m, v and the
	// gradient to reach host memory for the optimizer (the tier store's
	// optimizer-phase stalls); IOExposed the part of it with the rank's
	// compute stream idle.
	IOWait, IOExposed time.Duration
}

// AdamExposedFraction is AdamExposed / Adam (0 without cpuadam time).
func (h HostOptStats) AdamExposedFraction() float64 {
	if h.Adam <= 0 {
		return 0
	}
	return float64(h.AdamExposed) / float64(h.Adam)
}

// IOExposedFraction is IOExposed / IOWait (0 without waits).
func (h HostOptStats) IOExposedFraction() float64 {
	if h.IOWait <= 0 {
		return 0
	}
	return float64(h.IOExposed) / float64(h.IOWait)
}

// Add adds o's figures to h.
func (h *HostOptStats) Add(o HostOptStats) {
	h.Adam += o.Adam
	h.AdamExposed += o.AdamExposed
	h.IOWait += o.IOWait
	h.IOExposed += o.IOExposed
}

// PrefetchCounts are the planners' access counts (prefetch.Stats), all
// ranks: Hits found the shard ready in the access tier, Late found its
// prefetch under way, Misses fetched it on demand, Dependent waited for a
// prefetch issued as soon as its data existed (cpuadam's new param read by
// the next forward right after the update wrote it:
// prefetch.Stats.Dependent).
type PrefetchCounts struct {
	Accesses, Hits, Late, Misses, Dependent int64
	RoomWaits                               int64   // of the Misses, writes that found no room (prefetch.Stats.RoomWaits)
	HitRate                                 float64 // prefetch.HitRate: Hits / (Accesses - Dependent), 1 with none
	// Divergences counts the ranks whose accesses differed from their
	// planner's trace (it plans without knowing the future until the
	// step it records ends). The first step records; with the host
	// optimizer pipelined into the next forward (overlap exact, state
	// that can leave host RAM) the second differs from it too; after
	// that every step repeats the one before.
	Divergences int64
	// Skipped counts the conditional accesses the steps passed over: a
	// mixture of experts' experts no token of a micro-batch reached, on
	// any rank (prefetch.Stats.Skipped).
	Skipped int64
}

// Add adds o's counts to c (o minus sub when sub is not nil: the counts
// between two snapshots) and sets c's HitRate from the sums.
func (c *PrefetchCounts) Add(o PrefetchCounts, sub *PrefetchCounts) {
	if sub != nil {
		o.Accesses -= sub.Accesses
		o.Hits -= sub.Hits
		o.Late -= sub.Late
		o.Misses -= sub.Misses
		o.RoomWaits -= sub.RoomWaits
		o.Dependent -= sub.Dependent
		o.Divergences -= sub.Divergences
		o.Skipped -= sub.Skipped
	}
	c.Accesses += o.Accesses
	c.Hits += o.Hits
	c.Late += o.Late
	c.RoomWaits += o.RoomWaits
	c.Misses += o.Misses
	c.Dependent += o.Dependent
	c.Divergences += o.Divergences
	c.Skipped += o.Skipped
	c.HitRate = prefetch.HitRate(c.Hits, c.Accesses, c.Dependent)
}

// TierStats are one step's figures of the tier store and the planners.
type TierStats struct {
	PrefetchCounts // this step's accesses
	// Stall is the time the rank waited for shards to reach each access
	// tier (HBM: param shards before their gather, the devices waiting;
	// host: optimizer state before cpuadam, which waits for it while the
	// rank goes on under overlap exact and dpu), the longest of the ranks.
	Stall [shard.TierCount]time.Duration
	// LinkBytes is the bytes moved on each link (shard.Link order:
	// nvme->host, host->hbm, hbm->host, host->nvme).
	LinkBytes [shard.LinkCount]int64
	// LinkActive is the time each link had a move on it (the union of the
	// moves' spans, not their sum: tier.LinkStats.Active).
	LinkActive [shard.LinkCount]time.Duration
	// PeakBytes is the store's peak use of each tier during the step (HBM:
	// the largest of the devices), next to its BudgetBytes.
	PeakBytes, BudgetBytes [shard.TierCount]int64
}

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
	RegistrationNone   = "none"   // no engine.Options.HostRegistrar: pageable copies on a GPU
)

// HostRegistration is the outcome of registering one pinned pool of the
// engine with the devices (engine.Options.HostRegistrar).
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
	Devices int   // N: every process's (engine.Options.Procs)
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
	// optimizer state kept to undo a non-finite or clipped step, all ranks (Go heap,
	// taken at the first use): working set, not model state.
	HostUndoBytes int64
	// BackwardUpdates are, with strata.update_in_backward, the steps whose
	// host update began during the backward (every step but those after a
	// clipped one), and BackwardRedos those of them that were clipped: the
	// update was undone and run again after the backward.
	BackwardUpdates, BackwardRedos int64
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
	// Collectives is what ran the collectives (engine.Options.Collectives).
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
	// PinnedRelocations and PinnedRelocatedBytes count the idle host
	// copies the store moved to make a free run in a fragmented pool
	// (pinned.Pool.GetRelocating), since New.
	PinnedRelocations, PinnedRelocatedBytes int64
	LinkBytes                               [shard.LinkCount]int64
	PrefetchCounts                          // since New
	Rerecords                               int64
	// OptimizerStateBytes is the homes of master, m and v per tier, all
	// ranks; Moments their precision (strata.optimizer_state.moments),
	// Master the master's (strata.optimizer_state.master: with
	// "bf16+remainder" the master's bytes are the remainder's, beside the
	// params).
	OptimizerStateBytes [shard.TierCount]int64
	Moments             string
	Master              string
}

// CountsOf is one planner's counts.
func CountsOf(p prefetch.Stats) PrefetchCounts {
	return PrefetchCounts{Accesses: p.Accesses, Hits: p.Hits, Late: p.Late, Misses: p.Misses, RoomWaits: p.RoomWaits, Dependent: p.Dependent,
		Divergences: p.Divergences, Skipped: p.Skipped, HitRate: p.HitRate()}
}
