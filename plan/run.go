package plan

import (
	"cmp"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// PredictRun is the step time p predicts for a run of cfg (a resolved
// config of a model of shape, tokensPerStep tokens a step): the prediction
// of the placement cfg names among Predict's. ok is false where the
// profile has no measurement of this model, batch and machine, or where
// the run is a job the predictor does not model (gradient accumulation,
// LoRA, frozen chunks, a state precision or checkpointing it does not
// list): then there is no prediction, never a wrong one.
func PredictRun(p *Profile, cfg *config.Config, shape model.Shape, tokensPerStep int) (seconds float64, ok bool) {
	z := cfg.ZeRO
	if cfg.GradientAccumulationSteps != 1 || cfg.Strata.LoRA != nil || len(cfg.Strata.Freeze) > 0 {
		return 0, false // the profile's steps are one micro-batch of a full fine-tune
	}
	state := cfg.Strata.OptimizerState
	if state != (config.OptimizerState{Moments: config.MomentsFP32, Master: config.MasterFP32}) && state != (config.OptimizerState{Moments: NarrowMoments, Master: NarrowMaster}) {
		return 0, false // a state precision plan does not list
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
		return 0, false
	}
	ckpt := false
	if ac := cfg.ActivationCheckpointing; ac != nil {
		if ac.CPUCheckpointing || ac.NumberCheckpoints != 0 && ac.NumberCheckpoints != in.Shape.Layers {
			return 0, false // plan lists checkpointing of every block, kept on the devices
		}
		ckpt = true
	}
	optTier, err1 := shard.ParseTier(cmp.Or(z.OffloadOptimizer.Device, "none"))
	paramTier, err2 := shard.ParseTier(cmp.Or(z.OffloadParam.Device, "none"))
	if err1 != nil || err2 != nil {
		return 0, false
	}
	for _, pr := range preds {
		if pr.Stage == z.Stage && pr.Optimizer == optTier && pr.Params == paramTier && pr.Moments == state.Moments && pr.Master == state.Master &&
			pr.Checkpoint == ckpt {
			return pr.StepSeconds, true
		}
	}
	return 0, false
}
