package plan

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

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
// config of a model of shape, tokensPerStep tokens a step): the prediction
// of the placement cfg names among Predict's. Where there is none the
// error says why, never a wrong prediction: a *MeasurementError
// (ErrNoMeasurement) where the profile has no measurement of this model,
// batch, sequence or NVMe path, ErrNotModelled (wrapped, with the reason)
// where the run is a job the predictor does not model (gradient
// accumulation, LoRA, frozen chunks, a state precision or checkpointing
// it does not list, a placement it does not rank). p is taken to be this
// machine's (Profile.Check).
func PredictRun(p *Profile, cfg *config.Config, shape model.Shape, tokensPerStep int) (seconds float64, err error) {
	z := cfg.ZeRO
	// The profile's steps are one micro-batch of a full fine-tune.
	switch {
	case cfg.GradientAccumulationSteps != 1:
		return 0, notModelled("gradient accumulation: %d micro-batches a step; plan measures one", cfg.GradientAccumulationSteps)
	case cfg.Strata.LoRA != nil:
		return 0, notModelled("LoRA: plan measures a full fine-tune")
	case len(cfg.Strata.Freeze) > 0:
		return 0, notModelled("frozen chunks: plan measures a full fine-tune")
	}
	state := cfg.Strata.OptimizerState
	if state != (config.OptimizerState{Moments: config.MomentsFP32, Master: config.MasterFP32}) && state != (config.OptimizerState{Moments: NarrowMoments, Master: NarrowMaster}) {
		return 0, notModelled("optimizer state %s moments, %s master: plan lists fp32 and %s moments with a %s master", state.Moments, state.Master, NarrowMoments, NarrowMaster)
	}
	rows := cfg.Strata.Devices * cfg.TrainMicroBatchSizePerGPU
	in := Inputs{Model: cfg.Strata.Model.Name, Shape: shape, Devices: cfg.Strata.Devices, Batch: cfg.TrainMicroBatchSizePerGPU,
		Seq: tokensPerStep / max(rows, 1), SharedCores: cfg.Strata.Backend == "cpu"}
	for _, paths := range [][]string{z.OffloadOptimizer.NVMePath, z.OffloadParam.NVMePath} {
		if len(paths) > 0 && in.NVMePath == "" {
			in.NVMePath = paths[0] // the profile's rates are per path; the first one's
		}
	}
	preds, err := Predict(p, in)
	if err != nil {
		return 0, err
	}
	ckpt := false
	if ac := cfg.ActivationCheckpointing; ac != nil {
		switch {
		case ac.CPUCheckpointing:
			return 0, notModelled("activation checkpoints in host RAM (cpu_checkpointing): plan lists them kept on the devices")
		case ac.NumberCheckpoints != 0 && ac.NumberCheckpoints != in.Shape.Layers:
			return 0, notModelled("activation checkpointing of %d of %d blocks: plan lists every block", ac.NumberCheckpoints, in.Shape.Layers)
		}
		ckpt = true
	}
	optTier, err := shard.ParseTier(cmp.Or(z.OffloadOptimizer.Device, "none"))
	if err != nil {
		return 0, notModelled("offload_optimizer: %v", err)
	}
	paramTier, err := shard.ParseTier(cmp.Or(z.OffloadParam.Device, "none"))
	if err != nil {
		return 0, notModelled("offload_param: %v", err)
	}
	for _, pr := range preds {
		if pr.Stage == z.Stage && pr.Optimizer == optTier && pr.Params == paramTier && pr.Moments == state.Moments && pr.Master == state.Master &&
			pr.Checkpoint == ckpt {
			return pr.StepSeconds, nil
		}
	}
	if ckpt && !slices.ContainsFunc(preds, func(pr Prediction) bool { return pr.Checkpoint }) {
		return 0, &MeasurementError{Inputs: in, Lacks: fmt.Sprintf("has no step of %s with activation checkpointing on %d device(s) at batch %d × %d tokens", in.Model, in.Devices, in.Batch, in.Seq)}
	}
	with := ""
	if ckpt {
		with = ", activation checkpointing"
	}
	return 0, notModelled("stage %d, optimizer on %s, params on %s, %s moments, %s master%s: not a placement plan ranks", z.Stage, optTier, paramTier, state.Moments, state.Master, with)
}
