package cmd

import (
	"fmt"
	"strings"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// formatSummary is the run's summary: a few lines of text with a table
// per device. A formula of 0 bytes (every model state offloaded, or the
// fp32 layout, which has no reference formula) has no ratio: "-".
func formatSummary(s report.Summary) string {
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
			fmt.Fprintf(&b, ", undo copy of the optimizer state %s (update_in_backward)", units.FormatBytes(s.HostUndoBytes))
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
	fmt.Fprintf(&b, "peak/budget: hbm %s, host %s/%s (pinned pool %s/%s), nvme %s\n", hbm,
		units.FormatBytes(t.PeakBytes[shard.Host]), units.FormatBytes(t.BudgetBytes[shard.Host]),
		units.FormatBytes(t.PinnedPeakBytes), units.FormatBytes(t.PinnedPoolBytes), nvme)
	b.WriteString("moved (the whole run, placement and checkpoints included):")
	for l, n := range t.LinkBytes {
		fmt.Fprintf(&b, " %s %s", shard.Link(l), units.FormatBytes(n))
	}
	fmt.Fprintf(&b, "\nprefetch (the steps'): %d accesses, hit rate %.4f (%d late, %d missed; %d waited for data written just before), %d divergences",
		t.Accesses, t.HitRate, t.Late, t.Misses, t.Dependent, t.Divergences)
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

// frozenJSON is summary.json's "frozen": the chunks strata.freeze froze,
// their parameters, and the model state they do not keep (all ranks; the
// device figure per device, as model_state_peak_bytes is).
func frozenJSON(s report.Summary) map[string]any {
	return map[string]any{
		"chunks":                      s.FrozenChunks,
		"params":                      s.FrozenParams,
		"optimizer_state_saved_bytes": s.FrozenOptimizerSavedBytes(),
		"grad_saved_bytes":            s.FrozenGradSavedBytes(),
		"saved_device_bytes":          s.FrozenSavedTierBytes(shard.HBM) / int64(max(s.Devices, 1)),
		"saved_host_bytes":            s.FrozenSavedTierBytes(shard.Host),
		"saved_nvme_bytes":            s.FrozenSavedTierBytes(shard.NVMe),
	}
}

// tierJSON is summary.json's "tier": the tier store's figures in
// snake_case, bytes per tier and per link by name (shard.Tier, shard.Link).
func tierJSON(t *report.TierSummary) map[string]any {
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
	return map[string]any{
		"param_tier": t.ParamTier, "optimizer_tier": t.OptimizerTier, "nvme_paths": t.NVMePaths, "swap_bytes": t.SwapBytes,
		"host_home_bytes": t.HostHomeBytes, "nvme_home_bytes": t.NVMeHomeBytes,
		"estimate_host_bytes": t.EstimateHostBytes, "estimate_nvme_bytes": t.EstimateNVMeBytes,
		"budget_bytes": perTier(budget), "peak_bytes": perTier(t.PeakBytes),
		"pinned_pool_bytes": t.PinnedPoolBytes, "pinned_peak_bytes": t.PinnedPeakBytes, "link_bytes": links,
		"prefetch_accesses": t.Accesses, "prefetch_hits": t.Hits, "prefetch_late": t.Late, "prefetch_misses": t.Misses,
		"prefetch_dependent": t.Dependent, "prefetch_hit_rate": t.HitRate, "prefetch_divergences": t.Divergences,
		"rerecords": t.Rerecords, "optimizer_state_bytes": perTier(t.OptimizerStateBytes), "optimizer_state_moments": t.Moments, "optimizer_state_master": t.Master,
	}
}
