package engine

import (
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
)

// ActivationOptionsFromConfig is how the engine keeps a model's
// activations for cfg with params and grads of dtype precision: bf16
// activations in bf16 mixed precision unless strata.activation_dtype is
// "fp32" (fp32 with fp32 params); activation checkpointing of
// CheckpointedBlocks blocks with the activation_checkpointing block, their
// inputs offloaded with cpu_checkpointing.
func ActivationOptionsFromConfig(cfg *config.Config, s model.Shape, precision gpu.DType) model.ActivationOptions {
	o := model.ActivationOptions{DType: gpu.F32, Checkpoint: cfg.CheckpointedBlocks(s.Layers)}
	if precision == gpu.BF16 && !cfg.ActivationsFP32() {
		o.DType = gpu.BF16
	}
	o.Offload = o.Checkpoint > 0 && cfg.ActivationCheckpointing.CPUCheckpointing
	return o
}
