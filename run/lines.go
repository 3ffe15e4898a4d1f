package run

import (
	"encoding/json"
	"math"

	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/shard"
)

// StepLine is one line of steps.jsonl.
type StepLine struct {
	Step     int64   `json:"step"`
	Loss     Number  `json:"loss"`
	LR       float64 `json:"lr"`
	GradNorm Number  `json:"grad_norm"`
	ClipCoef float64 `json:"clip_coef"`
	// RouterLoss is a mixture of experts' load-balancing loss
	// (report.StepStats.RouterLoss); absent for a dense model.
	RouterLoss float64 `json:"router_loss,omitempty"`
	// LossScale is the fp16 loss scale the step ran with, Skipped whether
	// it overflowed and updated nothing (its grad_norm is then null).
	LossScale        float64 `json:"loss_scale,omitempty"`
	Skipped          bool    `json:"skipped,omitempty"`
	StepSeconds      float64 `json:"step_s"`
	TokensPerSecond  float64 `json:"tokens_per_s"`
	HostToDevice     int64   `json:"bytes_host_to_device"`
	DeviceToHost     int64   `json:"bytes_device_to_host"`
	DeviceToDevice   int64   `json:"bytes_device_to_device"`
	CollectiveBytes  int64   `json:"bytes_collective"`
	ModelStatePeak   []int64 `json:"model_state_peak_bytes,omitempty"` // per device, on the last line
	ElapsedSeconds   float64 `json:"elapsed_s"`
	TokensThisStep   int     `json:"tokens"`
	GlobalBatchLines int     `json:"global_batch_rows"`
	OptimizerSeconds float64 `json:"optimizer_s"`
	Goroutines       int     `json:"goroutines"` // when the line is written: flat over a run (bench/soak.sh)
	*EvalLine                // after an evaluation of the held-out data
	*TierLine                // with the tier store (offload_param, NVMe offload)
	*HostOptLine             // with the host optimizer
}

// Number is a float64 that JSON writes as null when it is not finite (the
// gradient norm of a step an fp16 overflow skipped).
type Number float64

// MarshalJSON writes n, or null when it is not finite.
func (n Number) MarshalJSON() ([]byte, error) {
	if f := float64(n); math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(n))
}

// EvalLine is an evaluation of the held-out data in steps.jsonl and
// summary.json.
type EvalLine struct {
	Loss   float64 `json:"eval_loss"`
	Tokens int64   `json:"eval_tokens"`
}

// HostOptLine is the host optimizer's time of the runs completed in a step
// (report.HostOptStats): cpu adam and its exposed part (no compute stream
// busy), the waits for its state and their exposed part.
type HostOptLine struct {
	AdamSeconds        float64 `json:"adam_s"`
	AdamExposedSeconds float64 `json:"adam_exposed_s"`
	IOSeconds          float64 `json:"opt_io_s"`
	IOExposedSeconds   float64 `json:"opt_io_exposed_s"`
}

func newHostOptLine(e *engine.Engine, h report.HostOptStats) *HostOptLine {
	if !e.HostOptimizer() {
		return nil
	}
	return &HostOptLine{h.Adam.Seconds(), h.AdamExposed.Seconds(), h.IOWait.Seconds(), h.IOExposed.Seconds()}
}

// TierLine is a step's tier figures: prefetch hits, the time the devices
// waited for shards per access tier, bytes per link, peak bytes per tier.
type TierLine struct {
	HitRate   float64 `json:"prefetch_hit_rate"`
	Accesses  int64   `json:"prefetch_accesses"`
	Late      int64   `json:"prefetch_late"`
	Misses    int64   `json:"prefetch_misses"`
	RoomWaits int64   `json:"prefetch_room_waits"` // of the misses, writes that found no room
	Dependent int64   `json:"prefetch_dependent"`
	// Skipped: a mixture of experts' expert accesses the step passed over
	// (no token reached the expert); omitted when 0.
	Skipped         int64   `json:"prefetch_skipped,omitempty"`
	StallHBM        float64 `json:"stall_hbm_s"`
	StallHost       float64 `json:"stall_host_s"`
	BytesNVMeToHost int64   `json:"bytes_nvme_to_host"`
	BytesHostToHBM  int64   `json:"bytes_host_to_hbm"`
	BytesHBMToHost  int64   `json:"bytes_hbm_to_host"`
	BytesHostToNVMe int64   `json:"bytes_host_to_nvme"`
	PeakHBM         int64   `json:"peak_hbm_bytes"`
	PeakHost        int64   `json:"peak_host_bytes"`
	PeakNVMe        int64   `json:"peak_nvme_bytes"`
	BudgetHBM       int64   `json:"budget_hbm_bytes"`
	BudgetHost      int64   `json:"budget_host_bytes"`
	BudgetNVMe      int64   `json:"budget_nvme_bytes"`
}

func newTierLine(t *report.TierStats) *TierLine {
	if t == nil {
		return nil
	}
	return &TierLine{HitRate: t.HitRate, Accesses: t.Accesses, Late: t.Late, Misses: t.Misses, RoomWaits: t.RoomWaits, Dependent: t.Dependent, Skipped: t.Skipped,
		StallHBM: t.Stall[shard.HBM].Seconds(), StallHost: t.Stall[shard.Host].Seconds(),
		BytesNVMeToHost: t.LinkBytes[shard.NVMeToHost], BytesHostToHBM: t.LinkBytes[shard.HostToHBM],
		BytesHBMToHost: t.LinkBytes[shard.HBMToHost], BytesHostToNVMe: t.LinkBytes[shard.HostToNVMe],
		PeakHBM: t.PeakBytes[shard.HBM], PeakHost: t.PeakBytes[shard.Host], PeakNVMe: t.PeakBytes[shard.NVMe],
		BudgetHBM: t.BudgetBytes[shard.HBM], BudgetHost: t.BudgetBytes[shard.Host], BudgetNVMe: t.BudgetBytes[shard.NVMe]}
}
