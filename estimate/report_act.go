package estimate

import (
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
)

// The activation part of a Report: each device's activations per
// micro-batch kept three ways (no checkpointing, checkpointing,
// cpu_checkpointing), the working set, and per stage the total against a
// device budget.

// ActivationTermOrder is the order a report lists the terms in: the
// model's allocations as it plans them, then the tier store's room.
var ActivationTermOrder = []string{model.TermTokens, model.TermResidual, model.TermOffloadRing, model.TermBlocks, model.TermWorkSet,
	model.TermHead, model.TermLossChunk, model.TermBackwardTemp, model.TermLoRA, RestoredInputTerm}

// ActivationConfig is one way of keeping the activations: "none",
// "checkpointing" or "cpu_checkpointing".
type ActivationConfig struct {
	Name string
	Est  ActivationMemory
}

// ActivationReport is the activation part of a Report.
type ActivationReport struct {
	Shape             model.Shape
	Micro, Seq, Accum int
	BudgetBytes       int64 // 0: none given
	Configs           []ActivationConfig
	// Totals are per stage (those that estimate) the device's total with
	// each of Configs.
	Totals []StageTotal
}

// StageTotal is one stage's device memory with each way of keeping the
// activations: model state + working set + activations.
type StageTotal struct {
	Stage      int
	ModelState int64
	Working    WorkingSet
	Totals     []int64 // per ActivationReport.Configs
}

// newActivations checks the micro-batch of r for shape and estimates the
// three ways of keeping its activations, and their totals over stages.
func newActivations(shape model.Shape, r ActivationRequest, lora *model.LoRA, stages []Stage) (*ActivationReport, error) {
	a := &ActivationReport{Shape: shape, Micro: r.Micro, Seq: r.Seq, Accum: r.Accum, BudgetBytes: r.BudgetBytes}
	if a.Micro == 0 {
		a.Micro = 1
	}
	if a.Accum == 0 {
		a.Accum = 1
	}
	if a.Seq == 0 {
		a.Seq = shape.MaxSeq
	}
	dt, checkpoints := r.DType, r.Checkpoints
	if dt == "" {
		dt = config.ActivationBF16
	}
	switch {
	case a.Micro < 1 || a.Accum < 1:
		return nil, requestErr(InputMicro, "estimate: micro-batch %d and accumulation %d must be at least 1", a.Micro, a.Accum)
	case a.Seq < 1 || a.Seq > shape.MaxSeq:
		return nil, requestErr(InputSeq, "estimate: seq %d: want 1 to the model's max_seq_len %d", a.Seq, shape.MaxSeq)
	case checkpoints < 0 || checkpoints > shape.Layers:
		return nil, requestErr(InputCheckpoints, "estimate: number_checkpoints %d: want 1 to the model's %d blocks (0: every block)", checkpoints, shape.Layers)
	case dt != config.ActivationBF16 && dt != config.ActivationFP32:
		return nil, requestErr(InputActivationDType, "estimate: activation dtype %q is not bf16 or fp32", dt)
	}
	if err := CheckActivationTokens(shape, a.Micro, a.Seq); err != nil {
		return nil, &RequestError{Input: InputActivations, Err: err}
	}
	if checkpoints == 0 {
		checkpoints = shape.Layers
	}
	o := model.ActivationOptions{DType: gpu.BF16, LoRA: lora}
	if dt == config.ActivationFP32 {
		o.DType = gpu.F32
	}
	for _, k := range []struct {
		name    string
		ckpt    int
		offload bool
	}{{"none", 0, false}, {"checkpointing", checkpoints, false}, {"cpu_checkpointing", checkpoints, true}} {
		ko := o
		ko.Checkpoint, ko.Offload = k.ckpt, k.offload
		a.Configs = append(a.Configs, ActivationConfig{Name: k.name, Est: Activations(shape, a.Micro, a.Seq, ko)})
	}
	a.Totals = a.totals(stages)
	return a, nil
}

func (a *ActivationReport) totals(stages []Stage) []StageTotal {
	var out []StageTotal
	for _, s := range stages {
		if s.Err != nil {
			continue
		}
		st := StageTotal{Stage: s.Stage, ModelState: s.DeviceBytes(), Working: WorkingSetOf(s.ModelState, a.Accum)}
		for _, k := range a.Configs {
			st.Totals = append(st.Totals, st.ModelState+st.Working.Bytes()+k.Est.DeviceBytes())
		}
		out = append(out, st)
	}
	return out
}

// Fit is the first configuration, by stage and then by way of keeping the
// activations (none, checkpointing, cpu_checkpointing: in order of the
// compute and traffic they add), whose total is within the budget; ok is
// false when none is, and then the smallest total is given. config indexes
// Configs.
func (a *ActivationReport) Fit() (stage, config int, total int64, ok bool) {
	best := int64(-1)
	for _, st := range a.Totals {
		for k, t := range st.Totals {
			if t <= a.BudgetBytes {
				return st.Stage, k, t, true
			}
			if best < 0 || t < best {
				best, stage, config = t, st.Stage, k
			}
		}
	}
	return stage, config, best, false
}

// ConfigPhrase names configuration k in a sentence.
func (a *ActivationReport) ConfigPhrase(k int) string {
	switch a.Configs[k].Name {
	case "none":
		return "no activation checkpointing"
	case "checkpointing":
		return "activation checkpointing"
	}
	return "activation checkpointing and cpu_checkpointing"
}
