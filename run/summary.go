package run

import (
	"fmt"
	"strings"
	"time"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// FormatSummary is the run's summary: a few lines of text with a table
// per device. A formula of 0 bytes (every model state offloaded, or the
// fp32 layout, which has no reference formula) has no ratio: "-".
func FormatSummary(s report.Summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "model %s (%s params), stage %d on %d device(s), %s, optimizer on the %s, overlap %s\n",
		s.Model, units.FormatSize(s.Params), s.Stage, s.Devices, precisionName(s.Precision), s.Optimizer, s.Overlap)
	fmt.Fprintf(&b, "%-8s %12s  %-12s %12s %10s %10s %8s %8s | %10s %10s %10s %10s %11s\n", "device", "model state",
		"formula", "bytes", "padding", "persistent", "/formula", "/+pad", "tier hbm", "gathered", "buckets", "workspace", "activations")
	for _, d := range s.PerDevice {
		fmt.Fprintf(&b, "%-8s %12s  %-12s %12s %10s %10s %8s %8s | %10s %10s %10s %10s %11s\n", d.Device,
			units.FormatBytes(d.ModelStatePeakBytes), d.Formula, units.FormatBytes(d.FormulaBytes),
			units.FormatBytes(d.PaddingBytes), units.FormatBytes(d.PersistentBytes), ratio(d.FormulaRatio, d.FormulaBytes), ratio(d.EstimateRatio, d.EstimateBytes+d.TierHBMBytes),
			units.FormatBytes(d.TierHBMBytes), units.FormatBytes(d.GatheredPeakBytes), units.FormatBytes(d.BucketPeakBytes),
			units.FormatBytes(d.WorkspacePeakBytes), units.FormatBytes(d.ActivationPeakBytes))
	}
	fmt.Fprintf(&b, "model state: measured peak of gpu.ModelState allocations; formula: the reference text's, for this model;\n"+
		"padding: shard alignment (%d elements); persistent: stage-3 chunks kept gathered; /formula: measured / formula;\n"+
		"/+pad: measured / (formula + padding + persistent + tier hbm), the first three estimate.Memory's, as `strata estimate` prints it;\n"+
		"working set (not in the formula): tier hbm = param copies the tier store staged on the device (in model state),\n"+
		"gathered = stage-3 chunks in flight, buckets = gradient buckets and reduce shards in flight\n", s.ShardAlignElems)
	if len(s.PerDevice) > 0 {
		fmt.Fprintf(&b, "activations: %s; measured peak / estimate per device:", s.Activations)
		for _, d := range s.PerDevice {
			fmt.Fprintf(&b, " %s %s / %s (%.4f)", d.Device, units.FormatBytes(d.ActivationPeakBytes), units.FormatBytes(d.ActivationEstimateBytes), d.ActivationRatio)
		}
		if s.ActivationHostBytes > 0 {
			fmt.Fprintf(&b, "; saved block inputs in host memory %s, all ranks", units.FormatBytes(s.ActivationHostBytes))
		}
		b.WriteString("\n")
	}
	if s.HostFormula > 0 || s.HostBytes > 0 {
		fmt.Fprintf(&b, "host: model state %s (formula %s), pinned upload staging %s",
			units.FormatBytes(s.HostBytes), units.FormatBytes(s.HostFormula), units.FormatBytes(s.HostStagingBytes))
		if s.HostUndoBytes > 0 {
			fmt.Fprintf(&b, ", undo copy of the optimizer state %s (update_in_backward: steps begun in the backward %d, of them clipped, undone and updated again %d)",
				units.FormatBytes(s.HostUndoBytes), s.BackwardUpdates, s.BackwardRedos)
		}
		b.WriteString("\n")
	}
	b.WriteString("device allocations and frees after step 1:")
	for _, d := range s.PerDevice {
		fmt.Fprintf(&b, " %s %d", d.Device, d.DeviceAllocsAfterStep1)
	}
	b.WriteString("\n")
	for _, h := range s.HostRegistration {
		fmt.Fprintf(&b, "pinned %s (%s) registered with the devices: %s", h.Pool, units.FormatBytes(h.Bytes), h.Outcome)
		if h.Error != "" {
			fmt.Fprintf(&b, " (%s)", h.Error)
		}
		b.WriteString("\n")
	}
	if s.FrozenParams > 0 {
		fmt.Fprintf(&b, "frozen: %s (%s of %s params); not kept: optimizer state (master, m, v) %s, gradients %s, all ranks (device %s per device, host %s, nvme %s)\n",
			s.FrozenDescribed, units.FormatSize(s.FrozenParams), units.FormatSize(s.Params),
			units.FormatBytes(s.FrozenOptimizerSavedBytes()), units.FormatBytes(s.FrozenGradSavedBytes()),
			units.FormatBytes(s.FrozenSavedTierBytes(shard.HBM)/int64(max(s.Devices, 1))), units.FormatBytes(s.FrozenSavedTierBytes(shard.Host)),
			units.FormatBytes(s.FrozenSavedTierBytes(shard.NVMe)))
	}
	if h := s.HostOpt; h.Adam > 0 {
		fmt.Fprintf(&b, "host optimizer: cpu adam %.3fs, exposed %.3fs (%.3f); optimizer-state waits %.3fs, exposed %.3fs\n",
			h.Adam.Seconds(), h.AdamExposed.Seconds(), h.AdamExposedFraction(), h.IOWait.Seconds(), h.IOExposed.Seconds())
	}
	if s.Tier != nil {
		b.WriteString(formatTiers(*s.Tier))
		b.WriteString("\n")
	}
	return b.String()
}

// ratio prints a measured / formula ratio, "-" when the formula is 0 bytes.
func ratio(r float64, formulaBytes int64) string {
	if formulaBytes <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.4f", r)
}

// formatTiers is the tier store's lines of the summary. An HBM budget of
// at most 1 byte is the store's placeholder when params stay on the
// devices (the store holds no param shards there): "none".
func formatTiers(t report.TierSummary) string {
	var b strings.Builder
	params := "params in " + t.ParamTier
	if t.ParamTier != shard.HBM.String() && t.BudgetBytes[shard.HBM] <= 1 {
		// offload_param, but every chunk below the persistence threshold
		params = "params on the devices (offload_param " + t.ParamTier + ": every chunk stays gathered, below stage3_param_persistence_threshold)"
	}
	fmt.Fprintf(&b, "tiers: %s, optimizer state in %s", params, t.OptimizerTier)
	if len(t.NVMePaths) > 0 {
		fmt.Fprintf(&b, ", swap %s over %v", units.FormatBytes(t.SwapBytes), t.NVMePaths)
	}
	fmt.Fprintf(&b, "\nhomes: host %s (estimate %s), nvme %s (estimate %s)\n", units.FormatBytes(t.HostHomeBytes), units.FormatBytes(t.EstimateHostBytes),
		units.FormatBytes(t.NVMeHomeBytes), units.FormatBytes(t.EstimateNVMeBytes))
	hbm := "none (params stay on the devices)"
	if t.BudgetBytes[shard.HBM] > 1 {
		hbm = units.FormatBytes(t.PeakBytes[shard.HBM]) + "/" + units.FormatBytes(t.BudgetBytes[shard.HBM]) + " per device"
	}
	nvme := "none"
	if len(t.NVMePaths) > 0 {
		nvme = units.FormatBytes(t.PeakBytes[shard.NVMe]) + "/" + units.FormatBytes(t.BudgetBytes[shard.NVMe])
	}
	moved := ""
	if t.PinnedRelocations > 0 {
		moved = fmt.Sprintf("; %d idle copies, %s, moved to unfragment it", t.PinnedRelocations, units.FormatBytes(t.PinnedRelocatedBytes))
	}
	fmt.Fprintf(&b, "peak/budget: hbm %s, host %s/%s (pinned pool %s/%s%s), nvme %s\n", hbm,
		units.FormatBytes(t.PeakBytes[shard.Host]), units.FormatBytes(t.BudgetBytes[shard.Host]),
		units.FormatBytes(t.PinnedPeakBytes), units.FormatBytes(t.PinnedPoolBytes), moved, nvme)
	b.WriteString("moved (the whole run, placement and checkpoints included):")
	for l, n := range t.LinkBytes {
		fmt.Fprintf(&b, " %s %s", shard.Link(l), units.FormatBytes(n))
	}
	fmt.Fprintf(&b, "\nprefetch (the steps'): %d accesses, hit rate %.4f (%d late, %d missed, %d of them writes that found no room; %d waited for data written just before), %d divergences",
		t.Accesses, t.HitRate, t.Late, t.Misses, t.RoomWaits, t.Dependent, t.Divergences)
	if t.Skipped > 0 {
		fmt.Fprintf(&b, "; %d expert accesses skipped (no token reached the expert)", t.Skipped)
	}
	return b.String()
}

func precisionName(dt gpu.DType) string {
	switch dt {
	case gpu.BF16:
		return "bf16 mixed precision"
	case gpu.F16:
		return "fp16 mixed precision (loss scaling)"
	}
	return "fp32"
}

// Summary is summary.json: the engine's summary of a run (report.Summary)
// in snake_case, with the run's time, its last evaluation and its step
// time beside strata plan's prediction: measured_step_s (the median past
// the first two steps), predicted_step_s and predicted_by (the profile),
// step_time_error (predicted/measured − 1), or without a prediction
// prediction_note, the reason train printed (the profile's path and what
// it lacks). The fields are in the order of their keys.
type Summary struct {
	ActivationHostBytes int64              `json:"activation_host_bytes"`
	Activations         string             `json:"activations"`
	Collectives         string             `json:"collectives"`
	Devices             int                `json:"devices"`
	ElapsedSeconds      float64            `json:"elapsed_s"`
	EvalLoss            *float64           `json:"eval_loss,omitempty"`
	EvalTokens          *int64             `json:"eval_tokens,omitempty"`
	Frozen              *FrozenSummary     `json:"frozen,omitempty"`
	HostFormulaBytes    int64              `json:"host_formula_bytes"`
	HostModelStateBytes int64              `json:"host_model_state_bytes"`
	HostOptimizer       HostOptSummary     `json:"host_optimizer"`
	HostRegistration    []RegistrationLine `json:"host_registration"`
	HostStagingBytes    int64              `json:"host_staging_bytes"`
	HostUndoBytes       int64              `json:"host_undo_bytes"`
	BackwardUpdates     int64              `json:"backward_updates,omitempty"` // update_in_backward: steps whose update began in the backward
	BackwardRedos       int64              `json:"backward_redos,omitempty"`   // of them, clipped: undone and updated again after it
	LossScale           *float64           `json:"loss_scale,omitempty"`       // fp16: the scale the next step would run with
	MeasuredStepSeconds float64            `json:"measured_step_s,omitempty"`  // the median past the first two steps
	Model               string             `json:"model"`
	Notes               []string           `json:"notes"`
	Optimizer           string             `json:"optimizer"`
	Overlap             string             `json:"overlap"`
	Params              int64              `json:"params"`
	PerDevice           []DeviceLine       `json:"per_device"`
	Precision           string             `json:"precision"` // bf16, fp16 or fp32
	PredictedBy         string             `json:"predicted_by,omitempty"`
	PredictedStepSecs   float64            `json:"predicted_step_s,omitempty"`
	PredictionNote      string             `json:"prediction_note,omitempty"` // why there is no prediction (the line train prints)
	Processes           int                `json:"processes"`
	SkippedSteps        *int64             `json:"skipped_steps,omitempty"` // fp16
	Stage               int                `json:"stage"`
	StepTimeError       *float64           `json:"step_time_error,omitempty"` // predicted_step_s / measured_step_s − 1
	Steps               int64              `json:"steps"`
	Tier                *TierSummary       `json:"tier"`
}

// HostOptSummary is summary.json's "host_optimizer".
type HostOptSummary struct {
	AdamExposedFraction float64 `json:"adam_exposed_fraction"`
	AdamExposedSeconds  float64 `json:"adam_exposed_s"`
	AdamSeconds         float64 `json:"adam_s"`
	IOExposedSeconds    float64 `json:"opt_io_exposed_s"`
	IOSeconds           float64 `json:"opt_io_s"`
}

// NewSummary is summary.json of the run s summarizes, elapsed long.
func NewSummary(s report.Summary, elapsed time.Duration) Summary {
	var devs []DeviceLine
	for _, d := range s.PerDevice {
		devs = append(devs, DeviceLine{d.Device, d.ModelStatePeakBytes, d.Formula, d.FormulaBytes, d.PaddingBytes, d.PersistentBytes,
			d.EstimateBytes, d.FormulaRatio, d.EstimateRatio, d.TierHBMBytes,
			d.GatheredPeakBytes, d.BucketPeakBytes, d.WorkspacePeakBytes, d.ActivationPeakBytes, d.ActivationEstimateBytes, d.ActivationRatio, d.PeakBytes,
			d.WorkspaceRingBytes, d.TierSlotBytes, d.Driver.Allocs, d.Driver.Frees, d.DeviceAllocsAfterStep1,
			d.Moved.HostToDevicePageable, d.Moved.DeviceToHostPageable})
	}
	regs := []RegistrationLine{}
	for _, h := range s.HostRegistration {
		regs = append(regs, RegistrationLine{h.Pool, h.Bytes, h.Outcome, h.RegisteredBytes, h.Error})
	}
	prec := "bf16"
	switch s.Precision {
	case gpu.F32:
		prec = "fp32"
	case gpu.F16:
		prec = "fp16"
	}
	out := Summary{
		Model: s.Model, Params: s.Params, Devices: s.Devices, Processes: s.Processes, Stage: s.Stage, Precision: prec,
		Optimizer: s.Optimizer, Overlap: s.Overlap, Steps: s.Steps, ElapsedSeconds: elapsed.Seconds(),
		PerDevice: devs, HostModelStateBytes: s.HostBytes, HostFormulaBytes: s.HostFormula,
		HostStagingBytes: s.HostStagingBytes, HostUndoBytes: s.HostUndoBytes, BackwardUpdates: s.BackwardUpdates, BackwardRedos: s.BackwardRedos, Notes: s.Notes, Tier: newTierSummary(s.Tier),
		HostRegistration: regs,
		Activations:      s.Activations, ActivationHostBytes: s.ActivationHostBytes,
		Collectives: s.Collectives,
		HostOptimizer: HostOptSummary{AdamSeconds: s.HostOpt.Adam.Seconds(), AdamExposedSeconds: s.HostOpt.AdamExposed.Seconds(),
			AdamExposedFraction: s.HostOpt.AdamExposedFraction(), IOSeconds: s.HostOpt.IOWait.Seconds(), IOExposedSeconds: s.HostOpt.IOExposed.Seconds()},
	}
	if s.FrozenParams > 0 {
		out.Frozen = newFrozenSummary(s)
	}
	if s.Precision == gpu.F16 {
		skipped, scale := s.SkippedSteps, s.LossScale // the scale the next step would run with
		out.SkippedSteps, out.LossScale = &skipped, &scale
	}
	return out
}

// DeviceLine is a device of summary.json's "per_device".
type DeviceLine struct {
	Device              string  `json:"device"`
	ModelStatePeakBytes int64   `json:"model_state_peak_bytes"`
	Formula             string  `json:"formula"`
	FormulaBytes        int64   `json:"formula_bytes"`
	PaddingBytes        int64   `json:"padding_bytes"`
	PersistentBytes     int64   `json:"persistent_bytes"`
	EstimateBytes       int64   `json:"estimate_bytes"`
	FormulaRatio        float64 `json:"ratio_formula"`
	EstimateRatio       float64 `json:"ratio_estimate"`
	TierHBMBytes        int64   `json:"tier_hbm_peak_bytes"`
	GatheredPeakBytes   int64   `json:"gathered_chunks_peak_bytes"`
	BucketPeakBytes     int64   `json:"grad_buckets_peak_bytes"`
	WorkspacePeakBytes  int64   `json:"workspace_peak_bytes"`
	ActivationPeakBytes int64   `json:"activation_peak_bytes"`
	ActivationEstimate  int64   `json:"activation_estimate_bytes"`
	ActivationRatio     float64 `json:"ratio_activation_estimate"`
	PeakBytes           int64   `json:"peak_bytes"`
	// The device memory a step does not take: the rings and slots New
	// took, the driver's allocations and frees in all and after step 1
	// (0: every step's memory came from them).
	WorkspaceRingBytes     int64 `json:"workspace_ring_bytes"`
	TierSlotBytes          int64 `json:"tier_hbm_slot_bytes"`
	DriverAllocs           int64 `json:"driver_allocs"`
	DriverFrees            int64 `json:"driver_frees"`
	DeviceAllocsAfterStep1 int64 `json:"device_allocs_after_step1"`
	// Host copies of memory not registered with the device (pageable).
	PageableH2DBytes int64 `json:"pageable_host_to_device_bytes"`
	PageableD2HBytes int64 `json:"pageable_device_to_host_bytes"`
}

// RegistrationLine is a pool of summary.json's "host_registration": each
// pinned pool's registration with the devices.
type RegistrationLine struct {
	Pool            string `json:"pool"`
	Bytes           int64  `json:"bytes"`
	Outcome         string `json:"outcome"`
	RegisteredBytes int64  `json:"registered_bytes"`
	Error           string `json:"error,omitempty"`
}

// FrozenSummary is summary.json's "frozen": the chunks strata.freeze
// froze, their parameters, and the model state they do not keep (all
// ranks; the device figure per device, as model_state_peak_bytes is).
type FrozenSummary struct {
	Chunks                   []string `json:"chunks"`
	GradSavedBytes           int64    `json:"grad_saved_bytes"`
	OptimizerStateSavedBytes int64    `json:"optimizer_state_saved_bytes"`
	Params                   int64    `json:"params"`
	SavedDeviceBytes         int64    `json:"saved_device_bytes"`
	SavedHostBytes           int64    `json:"saved_host_bytes"`
	SavedNVMeBytes           int64    `json:"saved_nvme_bytes"`
}

func newFrozenSummary(s report.Summary) *FrozenSummary {
	return &FrozenSummary{
		Chunks:                   s.FrozenChunks,
		Params:                   s.FrozenParams,
		OptimizerStateSavedBytes: s.FrozenOptimizerSavedBytes(),
		GradSavedBytes:           s.FrozenGradSavedBytes(),
		SavedDeviceBytes:         s.FrozenSavedTierBytes(shard.HBM) / int64(max(s.Devices, 1)),
		SavedHostBytes:           s.FrozenSavedTierBytes(shard.Host),
		SavedNVMeBytes:           s.FrozenSavedTierBytes(shard.NVMe),
	}
}

// TierSummary is summary.json's "tier": the tier store's figures in
// snake_case, bytes per tier and per link by name (shard.Tier, shard.Link).
type TierSummary struct {
	BudgetBytes           map[string]int64 `json:"budget_bytes"`
	EstimateHostBytes     int64            `json:"estimate_host_bytes"`
	EstimateNVMeBytes     int64            `json:"estimate_nvme_bytes"`
	HostHomeBytes         int64            `json:"host_home_bytes"`
	LinkBytes             map[string]int64 `json:"link_bytes"`
	NVMeHomeBytes         int64            `json:"nvme_home_bytes"`
	NVMePaths             []string         `json:"nvme_paths"`
	OptimizerStateBytes   map[string]int64 `json:"optimizer_state_bytes"`
	OptimizerStateMaster  string           `json:"optimizer_state_master"`
	OptimizerStateMoments string           `json:"optimizer_state_moments"`
	OptimizerTier         string           `json:"optimizer_tier"`
	ParamTier             string           `json:"param_tier"`
	PeakBytes             map[string]int64 `json:"peak_bytes"`
	PinnedPeakBytes       int64            `json:"pinned_peak_bytes"`
	PinnedPoolBytes       int64            `json:"pinned_pool_bytes"`
	PinnedRelocatedBytes  int64            `json:"pinned_relocated_bytes"`
	PinnedRelocations     int64            `json:"pinned_relocations"`
	PrefetchAccesses      int64            `json:"prefetch_accesses"`
	PrefetchDependent     int64            `json:"prefetch_dependent"`
	PrefetchDivergences   int64            `json:"prefetch_divergences"`
	PrefetchHitRate       float64          `json:"prefetch_hit_rate"`
	PrefetchHits          int64            `json:"prefetch_hits"`
	PrefetchLate          int64            `json:"prefetch_late"`
	PrefetchMisses        int64            `json:"prefetch_misses"`
	PrefetchRoomWaits     int64            `json:"prefetch_room_waits"` // of the misses, writes that found no room
	PrefetchSkipped       int64            `json:"prefetch_skipped"`
	Rerecords             int64            `json:"rerecords"`
	SwapBytes             int64            `json:"swap_bytes"`
}

func newTierSummary(t *report.TierSummary) *TierSummary {
	if t == nil {
		return nil
	}
	perTier := func(v [shard.TierCount]int64) map[string]int64 {
		out := map[string]int64{}
		for i, n := range v {
			out[shard.Tier(i).String()] = n
		}
		return out
	}
	budget := t.BudgetBytes
	if budget[shard.HBM] <= 1 { // the store's placeholder: params stay on the devices
		budget[shard.HBM] = 0
	}
	links := map[string]int64{}
	for i, n := range t.LinkBytes {
		links[strings.ReplaceAll(shard.Link(i).String(), "->", "_to_")] = n // nvme_to_host
	}
	return &TierSummary{
		ParamTier: t.ParamTier, OptimizerTier: t.OptimizerTier, NVMePaths: t.NVMePaths, SwapBytes: t.SwapBytes,
		HostHomeBytes: t.HostHomeBytes, NVMeHomeBytes: t.NVMeHomeBytes,
		EstimateHostBytes: t.EstimateHostBytes, EstimateNVMeBytes: t.EstimateNVMeBytes,
		BudgetBytes: perTier(budget), PeakBytes: perTier(t.PeakBytes),
		PinnedPoolBytes: t.PinnedPoolBytes, PinnedPeakBytes: t.PinnedPeakBytes, PinnedRelocations: t.PinnedRelocations, PinnedRelocatedBytes: t.PinnedRelocatedBytes, LinkBytes: links,
		PrefetchAccesses: t.Accesses, PrefetchHits: t.Hits, PrefetchLate: t.Late, PrefetchMisses: t.Misses, PrefetchRoomWaits: t.RoomWaits,
		PrefetchDependent: t.Dependent, PrefetchHitRate: t.HitRate, PrefetchDivergences: t.Divergences,
		PrefetchSkipped: t.Skipped, Rerecords: t.Rerecords, OptimizerStateBytes: perTier(t.OptimizerStateBytes), OptimizerStateMoments: t.Moments, OptimizerStateMaster: t.Master,
	}
}
