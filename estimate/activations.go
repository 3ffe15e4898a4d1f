package estimate

import (
	"errors"
	"fmt"
	"slices"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// ActivationOptionsFromConfig is how the engine keeps a model's
// activations for cfg with params and grads of dtype precision: bf16
// activations in bf16 mixed precision unless strata.activation_dtype is
// "fp32" (fp32 with fp32 params); activation checkpointing of
// CheckpointedBlocks blocks with the activation_checkpointing block, their
// inputs offloaded with cpu_checkpointing.
func ActivationOptionsFromConfig(cfg *config.Config, s model.Shape, precision gpu.DType) model.ActivationOptions {
	o := model.ActivationOptions{DType: gpu.F32, Checkpoint: cfg.CheckpointedBlocks(s.Layers)}
	if precision.Half() && !cfg.ActivationsFP32() {
		o.DType = precision // bf16, or fp16 with fp16 mixed precision
	}
	o.Offload = o.Checkpoint > 0 && cfg.ActivationCheckpointing.CPUCheckpointing
	o.LoRA = LoRAFromConfig(cfg, s)
	return o
}

// LoRAFromConfig is strata.lora as the model's adapters of shape s (nil
// without), target_modules defaulting to PEFT's for the architecture:
// q_proj and v_proj, GPT-2's c_attn.
func LoRAFromConfig(cfg *config.Config, s model.Shape) *model.LoRA {
	c := cfg.Strata.LoRA
	if c == nil {
		return nil
	}
	o := &model.LoRA{R: c.R, Alpha: c.Alpha, Dropout: c.Dropout, Targets: slices.Clone(c.TargetModules), RSLoRA: c.UseRSLoRA}
	if len(o.Targets) == 0 {
		switch {
		case !s.IsLlama():
			o.Targets = []string{"c_attn"}
		case s.Fused():
			o.Targets = []string{"qkv_proj"}
		default:
			o.Targets = []string{"q_proj", "v_proj"}
		}
	}
	return o
}

// LayoutFromConfig is the layout of shape s under cfg: model.NewLayout,
// with strata.lora's adapters when it has them.
func LayoutFromConfig(cfg *config.Config, s model.Shape) (*model.Layout, error) {
	l, err := model.NewLayout(s)
	if err != nil || cfg.Strata.LoRA == nil {
		return l, err
	}
	return l.WithLoRA(*LoRAFromConfig(cfg, s))
}

// ActivationMemory is one device's activation memory for micro-batches
// of Micro sequences of Seq tokens, by term: what each rank's model
// allocates (model.ActivationTerms) and, with cpu_checkpointing, the tier
// store's room for the saved inputs brought back to the device, and the
// host memory that keeps them.
type ActivationMemory struct {
	Options    model.ActivationOptions
	Micro, Seq int
	Terms      []model.ActivationTerm
	// RestoredInputBytes is, with cpu_checkpointing, the HBM the tier
	// store keeps for saved inputs brought back for the backward (two, in
	// the planner's IOAlignBytes units): tagged gpu.Activation on the
	// device. 0 without. With offload_param the store's slots for them can
	// hold more (up to one per checkpointed block: tier.Store.ReserveHBM),
	// which this does not count.
	RestoredInputBytes int64
	// HostInputBytes is, with cpu_checkpointing, one rank's saved inputs in
	// pinned host memory. 0 without.
	HostInputBytes int64
}

// RestoredInputTerm names ActivationMemory.RestoredInputBytes.
const RestoredInputTerm = "restored inputs (tier store room: 2 block inputs)"

// Activations is the activation memory of one device for shape s
// with o at micro×seq tokens per micro-batch.
func Activations(s model.Shape, micro, seq int, o model.ActivationOptions) ActivationMemory {
	e := ActivationMemory{Options: o, Micro: micro, Seq: seq, Terms: model.ActivationTerms(s, micro, seq, o)}
	if o.Offload {
		in := model.InputBytes(s, micro, seq, o)
		e.RestoredInputBytes = 2 * IOBytes(in)
		for l := range s.Layers {
			if o.Checkpointed(l, s.Layers) {
				e.HostInputBytes += in
			}
		}
	}
	return e
}

// DeviceBytes is the activation memory of each device: the terms and the
// restored inputs.
func (a ActivationMemory) DeviceBytes() int64 {
	n := a.RestoredInputBytes
	for _, t := range a.Terms {
		n += t.Bytes
	}
	return n
}

// AllTerms are Terms with the restored inputs as one more term.
func (a ActivationMemory) AllTerms() []model.ActivationTerm {
	out := append([]model.ActivationTerm(nil), a.Terms...)
	if a.RestoredInputBytes > 0 {
		out = append(out, model.ActivationTerm{Name: RestoredInputTerm, Bytes: a.RestoredInputBytes})
	}
	return out
}

// Describe says how the activations are kept: "bf16, every block
// checkpointed, inputs in host memory".
func (a ActivationMemory) Describe() string { return DescribeActivations(a.Options, -1) }

// DescribeActivations says how o keeps a model's activations; layers < 0
// when the block count is not at hand.
func DescribeActivations(o model.ActivationOptions, layers int) string {
	dt := "fp32"
	switch o.DType {
	case gpu.BF16:
		dt = "bf16"
	case gpu.F16:
		dt = "fp16"
	}
	switch {
	case o.Checkpoint == 0:
		return dt + ", no checkpointing"
	case o.Checkpoint == layers:
		dt += ", every block checkpointed"
	default:
		dt += fmt.Sprintf(", %d blocks checkpointed", o.Checkpoint)
	}
	if o.Offload {
		return dt + ", inputs in host memory (cpu_checkpointing)"
	}
	return dt
}

// WorkingSet is the engine's transient device memory in a step, by term
// (WorkingSetFor): the largest it can take, which New checks each device has
// room for beyond the model state and the activations.
type WorkingSet struct {
	GatheredBytes  int64 // stage 3: MaxLiveChunks gathered chunks, the largest
	BucketBytes    int64 // stages 2-3: three gradient buckets and their reduce shards
	GradShardBytes int64 // optimizer on NVMe: reduced gradient shards on their way to the host
	// ParamStagingBytes is, with offload_param, the least HBM the tier
	// store needs for param shards (two of the largest: the one in use and
	// the next arriving); the engine gives it what is left, at most every
	// shard of the rank.
	ParamStagingBytes int64
	// FrozenGradBytes is the frozen chunks' gradient scratch (freeze.go).
	FrozenGradBytes int64
}

// Bytes is the whole working set.
func (w WorkingSet) Bytes() int64 {
	return w.GatheredBytes + w.BucketBytes + w.GradShardBytes + w.ParamStagingBytes + w.FrozenGradBytes
}

// Terms names the working set's parts that are not zero.
func (w WorkingSet) Terms() []model.ActivationTerm {
	var out []model.ActivationTerm
	for _, t := range []model.ActivationTerm{
		{Name: "gathered chunks (stage 3, 2 in flight)", Bytes: w.GatheredBytes},
		{Name: "gradient buckets (stages 2-3, 3 in flight)", Bytes: w.BucketBytes},
		{Name: "gradient shards bound for the host", Bytes: w.GradShardBytes},
		{Name: "param shards staged in HBM (offload_param, at least 2)", Bytes: w.ParamStagingBytes},
		{Name: "frozen chunks' gradient scratch", Bytes: w.FrozenGradBytes},
	} {
		if t.Bytes > 0 {
			out = append(out, t)
		}
	}
	return out
}

// WorkingSetFor is the working set of one rank of a layout of chunks over n
// devices (shardElems per chunk, frozen ones marked) at stage, in dtype of
// size sz, with maxLive gathered chunks and accum micro-batches per step.
func WorkingSetFor(chunkParams, shardElems []int64, frozen []bool, n, stage, maxLive, accum int, o Options, sz int64) WorkingSet {
	var maxPadded, maxGradPadded, maxGradShard, maxFrozen, gradShards, maxParamShard int64
	for c, s := range shardElems {
		padded := int64(n) * s
		maxPadded = max(maxPadded, padded)
		if c < len(frozen) && frozen[c] {
			maxFrozen = max(maxFrozen, chunkParams[c])
			continue
		}
		maxGradPadded, maxGradShard = max(maxGradPadded, padded), max(maxGradShard, s)
		gradShards += s
		if !(stage == 3 && chunkParams[c] < o.PersistenceThreshold) {
			maxParamShard = max(maxParamShard, s)
		}
	}
	var w WorkingSet
	if stage == 3 {
		w.GatheredBytes = int64(maxLive) * maxPadded * sz
	}
	if stage >= 2 {
		w.BucketBytes = 3 * (maxGradPadded + maxGradShard) * sz
	}
	if o.OptimizerTier == shard.NVMe {
		// two (one micro-batch), or every trainable chunk's through the step
		w.GradShardBytes = 2 * maxGradShard * sz
		if accum > 1 {
			w.GradShardBytes = gradShards * sz
		}
	}
	if o.ParamTier != shard.HBM {
		w.ParamStagingBytes = 2 * IOBytes(2*maxParamShard)
	}
	w.FrozenGradBytes = maxFrozen * sz
	return w
}

// WorkingSetOf is the working set of one rank for the memory
// options o (bf16 mixed precision) with accum micro-batches per step and
// the engine's default MaxLiveChunks (2).
func WorkingSetOf(e ModelState, accum int) WorkingSet {
	o := e.Options
	return WorkingSetFor(o.ChunkParams, e.ShardElems, o.Frozen, o.Devices, o.Stage, 2, accum, o, 2)
}

// InputHostBytes is one rank's saved inputs in host RAM as the tier store
// charges them (each rounded up to IOAlignBytes) for shape s, micro×seq
// tokens per micro-batch and activation options o: 0 without
// cpu_checkpointing.
func InputHostBytes(s model.Shape, micro, seq int, o model.ActivationOptions) int64 {
	if !o.Offload {
		return 0
	}
	var n int64
	for l := range s.Layers {
		if o.Checkpointed(l, s.Layers) {
			n += IOBytes(model.InputBytes(s, micro, seq, o))
		}
	}
	return n
}

// ErrTooLarge says a size does not fit in int64 bytes (more than 8 EiB):
// the arithmetic would wrap to nonsense, negative sizes among it.
var ErrTooLarge = errors.New("more than 2^63 bytes")

// CheckActivationTokens refuses micro-batches of micro × seq tokens whose
// activation sizes could pass int64 (Activations would wrap): a bound of
// every term, each token's widest rows (the residual stream, q|k|v, the
// MLP, the attention statistics, the logits) in fp32 in every block and
// the head, with a factor 4 to spare. It says nothing of what fits a
// device; it keeps the arithmetic honest. The error matches ErrTooLarge.
func CheckActivationTokens(s model.Shape, micro, seq int) error {
	if micro < 1 || seq < 1 {
		return fmt.Errorf("estimate: %d × %d tokens: want at least 1 × 1", micro, seq)
	}
	width, ok := units.Add(16*int64(s.Dim), 4*2*int64(s.FFNDim()), 4*int64(s.Heads+2*s.KVHeadCount())*int64(s.HeadDim()), 4*int64(s.Heads), int64(s.Vocab), 64)
	if ok {
		_, ok = units.Mul(int64(micro), int64(seq), int64(s.Layers)+4, width, 4*4)
	}
	if !ok {
		return fmt.Errorf("estimate: micro-batches of %d × %d tokens: the activation sizes may pass int64: %w", micro, seq, ErrTooLarge)
	}
	return nil
}
