package plan

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// ErrNotModelled is a run the predictor does not model: PredictRun's
// error says which part of the job (wrapped, in parentheses).
var ErrNotModelled = errors.New("plan: strata plan does not model this job")

// notModelled is ErrNotModelled with its reason.
func notModelled(format string, args ...any) error {
	return fmt.Errorf("%w (%s)", ErrNotModelled, fmt.Sprintf(format, args...))
}

// PredictRun is the step time p predicts for a run of cfg (a resolved
// config of a model of shape, tokensPerStep tokens a step, on devices of
// hbmBytes each, whose spare memory keeps offloaded params staged): its placement
// (stage, tiers, optimizer state, activation checkpointing), its job
// (full or LoRA, the base as stored) and its micro-batches, predicted as
// Predict predicts the placements it ranks. Where there is none the
// error says why, never a wrong prediction: a *MeasurementError
// (ErrNoMeasurement) where the profile has no measurement of this model,
// job, batch, sequence or NVMe path, ErrNotModelled (wrapped, with the
// reason) where the run is a job the predictor does not model (frozen
// chunks, checkpoints in host RAM or of some blocks). fp16 is predicted
// as bf16: its loss scale is folded into Adam's gradient scale and the
// norm's overflow test, no pass of its own. p is taken to be this
// machine's (Profile.Check).
func PredictRun(p *Profile, cfg *config.Config, shape model.Shape, tokensPerStep int, hbmBytes int64) (seconds float64, err error) {
	z := cfg.ZeRO
	if len(cfg.Strata.Freeze) > 0 {
		return 0, notModelled("frozen chunks (strata.freeze): plan models a full fine-tune or LoRA")
	}
	state := cfg.Strata.OptimizerState
	accum := max(cfg.GradientAccumulationSteps, 1)
	rows := cfg.Strata.Devices * cfg.TrainMicroBatchSizePerGPU * accum
	in := Inputs{Model: cfg.Strata.Model.Name, Shape: shape, Job: JobFromConfig(cfg, shape), Accum: accum, Devices: cfg.Strata.Devices,
		Batch: cfg.TrainMicroBatchSizePerGPU, Seq: tokensPerStep / max(rows, 1), HBMBytes: hbmBytes, SharedCores: cfg.Strata.Backend == "cpu"}
	for _, paths := range [][]string{z.OffloadOptimizer.NVMePath, z.OffloadParam.NVMePath} {
		if len(paths) > 0 && in.NVMePath == "" {
			in.NVMePath = paths[0] // the profile's rates are per path; the first one's
		}
	}
	c := Config{Stage: z.Stage, Moments: state.Moments, Master: cfg.MasterFormat()}
	if ac := cfg.ActivationCheckpointing; ac != nil {
		switch {
		case ac.CPUCheckpointing:
			return 0, notModelled("activation checkpoints in host RAM (cpu_checkpointing): plan lists them kept on the devices")
		case ac.NumberCheckpoints != 0 && ac.NumberCheckpoints != in.Shape.Layers:
			return 0, notModelled("activation checkpointing of %d of %d blocks: plan lists every block", ac.NumberCheckpoints, in.Shape.Layers)
		}
		c.Checkpoint = true
	}
	if c.Optimizer, err = shard.ParseTier(cmp.Or(z.OffloadOptimizer.Device, "none")); err != nil {
		return 0, notModelled("offload_optimizer: %v", err)
	}
	if c.Params, err = shard.ParseTier(cmp.Or(z.OffloadParam.Device, "none")); err != nil {
		return 0, notModelled("offload_param: %v", err)
	}
	c.Name = "the run's placement"
	preds, err := predict(p, in, []Config{c})
	if err != nil {
		return 0, err
	}
	if len(preds) == 0 { // checkpointed, and the profile has no checkpointed step
		return 0, &MeasurementError{Inputs: in, Lacks: fmt.Sprintf("has no step of %s with activation checkpointing on %d device(s) at batch %d × %d tokens", in.Model, in.Devices, in.Batch, in.Seq)}
	}
	return preds[0].StepSeconds, nil
}
