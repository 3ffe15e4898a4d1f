package plan_test

import (
	"fmt"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/plan"
)

// ExamplePredict ranks the placements of gpt2 on one 1 GiB device from a
// profile of fixed rates (what `strata plan --probe` would measure: the
// copies, CPU Adam, the model's step), without probing the machine.
func ExamplePredict() {
	p := plan.NewProfile(plan.Machine{CPU: "example", CPUs: 8, Backend: "cpu", Device: "cpu:0"})
	p.CopyBytesPerS, p.AdamParamsPerS, p.AdamThreads = 10e9, 1e9, 8
	p.SetAdamRate(plan.AdamState{Moments: plan.NarrowMoments, Master: plan.NarrowMaster, ParamsPerS: 0.5e9})
	p.SetCompute(plan.Compute{Model: "gpt2", Devices: 1, Batch: 2, Seq: 64,
		FwdBwdSeconds: 0.5, DeviceAdamSeconds: 0.05, CheckpointFwdBwdSeconds: 0.65})
	shape, err := model.Lookup("gpt2")
	if err != nil {
		panic(err)
	}
	in := plan.Inputs{Model: "gpt2", Shape: shape, Devices: 1, Batch: 2, Seq: 64,
		HBMBytes: 1 * units.GiB, HostBytes: 16 * units.GiB, SharedCores: true}
	preds, err := plan.Predict(p, in)
	if err != nil {
		panic(err)
	}
	for _, pr := range preds[:3] {
		fmt.Printf("rank %d: %s: %.3f s a step, bound by %s\n", pr.Rank, pr.Name, pr.StepSeconds, pr.Bottleneck)
	}
	// Output:
	// rank 1: stage 1, optimizer on host: 0.600 s a step, bound by compute
	// rank 1: stage 2, optimizer on host: 0.600 s a step, bound by compute
	// rank 2: stage 1, optimizer on host, activation checkpointing: 0.750 s a step, bound by compute
}
