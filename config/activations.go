package config

import "fmt"

// ActivationCheckpointing is DeepSpeed's "activation_checkpointing" block.
// Its presence turns activation checkpointing on: Strata owns the model,
// so it checkpoints the blocks itself (no checkpoint calls in a training
// script), every block unless NumberCheckpoints says how many.
type ActivationCheckpointing struct {
	// NumberCheckpoints is the number of transformer blocks whose
	// activations are recomputed in the backward, spread evenly over the
	// model's blocks (every k-th block boundary: n = L/2 checkpoints every
	// second block; see model.ActivationOptions.Checkpointed); 0 (absent or
	// null) checkpoints every block. More than the model's blocks is an
	// error.
	NumberCheckpoints int `json:"number_checkpoints,omitempty"`
	// CPUCheckpointing keeps the checkpointed blocks' inputs in pinned host
	// memory between their forward and their backward, through the tier
	// store, which brings each back ahead of its block's backward.
	CPUCheckpointing bool `json:"cpu_checkpointing"`
	// Accepted with a notice of what Strata does instead (see
	// activationNotices).
	PartitionActivations          bool `json:"partition_activations"`
	ContiguousMemoryOptimization  bool `json:"contiguous_memory_optimization"`
	SynchronizeCheckpointBoundary bool `json:"synchronize_checkpoint_boundary"`
	Profile                       bool `json:"profile"`
}

// activationNotices say, for each DeepSpeed knob of the block that Strata
// accepts without a use for it, what Strata does instead.
var activationNotices = []struct{ key, why string }{
	{"partition_activations", "Strata has no model parallelism: each rank checkpoints its own micro-batch's activations, whole (cpu_checkpointing moves them off the device)"},
	{"contiguous_memory_optimization", "the activations are allocated once, before the first step, one contiguous allocation per block: they do not fragment"},
	{"synchronize_checkpoint_boundary", "the recompute runs on the device stream of the block's backward, ordered by the stream; there is nothing to synchronize"},
	{"profile", "the timeline (strata train --trace) shows each checkpointed block's recompute inside its backward span"},
}

// decodeActivations reads activation_checkpointing (present: on) and
// strata.activation_dtype.
func (c *Config) decodeActivations(r *section) {
	s := r.sub("activation_checkpointing")
	if s.n == nil {
		return
	}
	ac := &ActivationCheckpointing{}
	c.ActivationCheckpointing = ac
	s.intKey("number_checkpoints", &ac.NumberCheckpoints, atLeast(1))
	s.boolKey("cpu_checkpointing", &ac.CPUCheckpointing)
	for i, n := range activationNotices {
		dst := []*bool{&ac.PartitionActivations, &ac.ContiguousMemoryOptimization, &ac.SynchronizeCheckpointBoundary, &ac.Profile}[i]
		s.boolKey(n.key, dst)
		if *dst {
			s.notice(n.key, n.why)
		}
	}
}

// checkActivations checks number_checkpoints against the model's blocks
// once the shape is known.
func (c *Config) checkActivations(d *decoder) {
	ac, sh := c.ActivationCheckpointing, c.Strata.Model.Shape
	if ac != nil && sh != nil && ac.NumberCheckpoints > sh.Layers {
		d.errPath("activation_checkpointing.number_checkpoints", "%d is more than the model's %d blocks (n_layer): checkpoint at most every block, or leave it out for every block", ac.NumberCheckpoints, sh.Layers)
	}
}

// Activation dtypes of strata.activation_dtype.
const (
	ActivationBF16 = "bf16" // the default: bf16 activations, fp32 statistics and loss
	ActivationFP32 = "fp32" // fp32 activations with bf16 params and grads: for checks
)

// ActivationsFP32 says whether the config asks for fp32 activations.
func (c *Config) ActivationsFP32() bool { return c.Strata.ActivationDType == ActivationFP32 }

// CheckpointedBlocks is the number of blocks activation checkpointing
// recomputes for a model of layers blocks: 0 without the block, else
// number_checkpoints or every block.
func (c *Config) CheckpointedBlocks(layers int) int {
	ac := c.ActivationCheckpointing
	switch {
	case ac == nil:
		return 0
	case ac.NumberCheckpoints > 0:
		return ac.NumberCheckpoints
	}
	return layers
}

func (a *ActivationCheckpointing) String() string {
	if a == nil {
		return "off"
	}
	n := "every block"
	if a.NumberCheckpoints > 0 {
		n = fmt.Sprintf("%d blocks", a.NumberCheckpoints)
	}
	where := "on the device"
	if a.CPUCheckpointing {
		where = "in host memory (cpu_checkpointing)"
	}
	return fmt.Sprintf("%s, inputs %s", n, where)
}
