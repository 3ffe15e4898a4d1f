package estimate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// AllStages is Request.Stage for a table of stages 0-3.
const AllStages = -1

// Request is what an estimate is of: the model-state options (where the
// state lives, its precisions, devices and nodes, budgets), the model's
// shape or a bare parameter count, the stage or all of them, LoRA
// adapters or frozen tensors, and the micro-batch of the activation part.
// RequestFromConfig fills one from a resolved config; a caller's own
// settings (the CLI's flags) then override its fields.
type Request struct {
	// Options are the model-state options. New fills in ChunkParams (from
	// Shape, or Params as one chunk) and Frozen (from Freeze or LoRA).
	Options Options
	// Shape is the model's; nil estimates Params parameters as one chunk,
	// without the activation part.
	Shape *model.Shape
	// Params is Ψ when Shape is nil.
	Params int64
	// Stage is the ZeRO stage 0-3, or AllStages.
	Stage int
	// LoRA puts adapters on the frozen base (LoRA.Base: how the base is
	// stored in its offload tier; needs stage 3 and offloaded params).
	LoRA *model.LoRA
	// Freeze are strata.freeze's tensor-name patterns (FrozenChunks).
	Freeze []string
	// Activations is the micro-batch of the activation part.
	Activations ActivationRequest
}

// ActivationRequest is the micro-batch the activation part of an
// estimate is of, and how the activations are kept.
type ActivationRequest struct {
	Micro int // sequences per device (train_micro_batch_size_per_gpu)
	Seq   int // tokens per sequence; 0: the shape's max_seq_len
	Accum int // micro-batches per step (gradient_accumulation_steps)
	// BudgetBytes is each device's memory (strata.hbm_bytes): the report
	// says which configuration fits it. 0: none given.
	BudgetBytes int64
	// DType is strata.activation_dtype: config.ActivationBF16 or
	// config.ActivationFP32.
	DType string
	// Checkpoints is activation_checkpointing.number_checkpoints: the
	// blocks recomputed (0: every block).
	Checkpoints int
}

// Input names the part of a Request a RequestError is about, so that a
// caller can name its own flag or key for it.
type Input int

// The inputs a RequestError names.
const (
	InputSize            Input = iota + 1 // the model state's sizes pass int64 (devices, alignment)
	InputActivations                      // the micro-batch's tokens: the activation sizes pass int64
	InputMicro                            // Activations.Micro or Accum below 1
	InputSeq                              // Activations.Seq past the shape's max_seq_len
	InputCheckpoints                      // Activations.Checkpoints past the shape's blocks
	InputActivationDType                  // Activations.DType neither bf16 nor fp32
	InputMoments                          // Options.MomentsDType needs the optimizer offloaded
	InputMaster                           // Options.MasterDType needs the optimizer offloaded
	InputLoRA                             // the adapters (on a parameter count, or not valid for the shape)
	InputLoRAFreeze                       // LoRA with frozen patterns
	InputLoRABase                         // a coded LoRA base without stage 3 and offloaded params
	InputFreeze                           // frozen patterns on a parameter count
	InputFreezePatterns                   // frozen patterns FrozenChunks refuses
	InputStage                            // the stage's estimate
)

// RequestError is a Request New refuses: Input says which part is at
// fault, Err what is wrong.
type RequestError struct {
	Input Input
	Err   error
}

// Error is Err's message.
func (e *RequestError) Error() string { return e.Err.Error() }

// Unwrap is Err.
func (e *RequestError) Unwrap() error { return e.Err }

func requestErr(in Input, format string, args ...any) error {
	return &RequestError{Input: in, Err: fmt.Errorf(format, args...)}
}

// Report is an estimate: the model state of each stage, and for a shape
// each device's activations and working set.
type Report struct {
	// Description says what was estimated: the model, Ψ and its chunks,
	// the adapters or frozen chunks, in lines.
	Description string
	// Model is the shape's name ("" for a parameter count).
	Model   string
	Options Options
	Stages  []Stage
	// Breakdown says that one stage was asked for: the text gives its
	// bytes by state.
	Breakdown bool
	// Activations is nil without a shape.
	Activations *ActivationReport
}

// RequestFromConfig is the request of cfg (resolved, strata.model's shape
// looked up) for shape: OptionsFromConfig's model-state options, the
// config's stage, strata.lora (its base_dtype) or strata.freeze, and its
// micro-batch, sequence, accumulation, HBM budget and activation
// checkpointing. shape decides over the config's (a caller's --model).
func RequestFromConfig(cfg *config.Config, shape model.Shape) (Request, error) {
	l, err := model.NewLayout(shape)
	if err != nil {
		return Request{}, fmt.Errorf("estimate: %w", err)
	}
	opts, err := OptionsFromConfig(cfg, l)
	if err != nil {
		return Request{}, err
	}
	r := Request{Options: opts, Shape: &shape, Stage: cfg.ZeRO.Stage, Freeze: cfg.Strata.Freeze,
		Activations: ActivationRequest{Micro: cfg.TrainMicroBatchSizePerGPU, Seq: cfg.Strata.SeqLen, Accum: cfg.GradientAccumulationSteps,
			BudgetBytes: cfg.Strata.HBMBytes, DType: cfg.Strata.ActivationDType}}
	if ac := cfg.ActivationCheckpointing; ac != nil {
		r.Activations.Checkpoints = ac.NumberCheckpoints
	}
	if cfg.Strata.LoRA != nil {
		r.LoRA = LoRAFromConfig(cfg, shape)
		r.LoRA.Base = BaseDType(cfg.Strata.LoRA.BaseDType)
	}
	return r, nil
}

// FromConfig is the estimate of a run of cfg (a resolved config) of a
// model of shape at the config's stage: RequestFromConfig, then New.
func FromConfig(cfg *config.Config, shape model.Shape) (*Report, error) {
	r, err := RequestFromConfig(cfg, shape)
	if err != nil {
		return nil, err
	}
	return New(r)
}

// New estimates r: the model state of r.Stage (or of every stage), and
// with a shape the activations and working set per device. A request that
// cannot be estimated is a *RequestError naming its part.
func New(r Request) (*Report, error) {
	opts := r.Options
	if opts.ShardAlignElems == 0 {
		opts.ShardAlignElems = DefaultShardAlignElems
	}
	if opts.HostGradDType == 0 {
		opts.HostGradDType = dtype.BF16
	}
	rep := &Report{Breakdown: r.Stage >= 0}
	var base *model.Layout
	if r.Shape != nil {
		var err error
		if base, err = model.NewLayout(*r.Shape); err != nil {
			return nil, fmt.Errorf("estimate: %w", err)
		}
		opts.ChunkParams = ChunkParams(base)
		rep.Model = r.Shape.Name
		rep.Description = fmt.Sprintf("%s: Ψ = %s parameters in %d chunks", r.Shape, groupDigits(r.Shape.ParamCount()), len(opts.ChunkParams))
		if s := *r.Shape; s.MoE() {
			seq := r.Activations.Seq
			if seq == 0 {
				seq = s.MaxSeq
			}
			tokens, where := max(r.Activations.Micro, 1)*seq*max(opts.Devices, 1), "a micro-batch"
			if opts.Devices > 1 {
				where = fmt.Sprintf("a micro-batch on each of %d devices", opts.Devices)
			}
			rep.Description += fmt.Sprintf("; a mixture of experts: %s active per token (%d of %d experts of %s parameters in each of %d sparse layers), "+
				"every expert a chunk of its own; a training pass acquires the experts its tokens reach: the %d tokens of %s "+
				"reach about %.1f of the %d experts of each sparse layer if routed uniformly, so a pass reads about %s parameters (%.1f%% of Ψ; fewer with a skewed router); "+
				"the optimizer still steps every expert (an expert no token reached has a zero gradient)",
				groupDigits(s.ActiveParamCount()), s.TopK, s.Experts, groupDigits(s.ExpertParamCount()), s.SparseLayers(),
				tokens, where, s.ExpertsReached(tokens), s.Experts, groupDigits(int64(s.PassParamCount(tokens))), 100*s.PassParamCount(tokens)/float64(s.ParamCount()))
		}
	} else {
		if r.Params < 1 {
			return nil, requestErr(InputSize, "estimate: %d parameters: give a shape or at least 1 parameter", r.Params)
		}
		opts.ChunkParams = []int64{r.Params}
		rep.Description = fmt.Sprintf("Ψ = %s parameters as one chunk", groupDigits(r.Params))
	}
	if err := checkHostState(opts); err != nil {
		return nil, err
	}
	if err := CheckSize(opts); err != nil {
		return nil, &RequestError{Input: InputSize, Err: err}
	}
	if err := rep.frozen(r, &opts, base); err != nil {
		return nil, err
	}
	rep.Options = opts
	if s := r.Stage; s >= 0 {
		o := opts
		o.Stage = s
		e, err := Memory(o)
		if err != nil {
			return nil, &RequestError{Input: InputStage, Err: err}
		}
		rep.Stages = []Stage{{Stage: s, ModelState: e}}
	} else {
		rep.Stages = Stages(opts)
	}
	if r.Shape != nil {
		a, err := newActivations(*r.Shape, r.Activations, r.LoRA, rep.Stages)
		if err != nil {
			return nil, err
		}
		rep.Activations = a
	}
	return rep, nil
}

// checkHostState refuses narrow moments or a remainder master with the
// optimizer on the devices: they are the host optimizer's (cpuadam), as
// config's strata.optimizer_state says of a config.
func checkHostState(o Options) error {
	if o.OptimizerTier != shard.HBM {
		return nil
	}
	if o.MomentsDType != 0 && o.MomentsDType != dtype.F32 {
		return requestErr(InputMoments, "estimate: moments %s need the optimizer offloaded (narrow moments are the host optimizer's)", MomentsName(o.MomentsDType))
	}
	if o.MasterDType != 0 && o.MasterDType != dtype.F32 {
		return requestErr(InputMaster, "estimate: master %s needs the optimizer offloaded (the remainder is the host optimizer's)", MasterName(o.MasterDType))
	}
	return nil
}

// frozen resolves r's frozen chunks (Freeze's patterns, or LoRA's base)
// into opts and says so in the description.
func (rep *Report) frozen(r Request, opts *Options, base *model.Layout) error {
	opts.Frozen = nil
	lora := r.LoRA
	if lora != nil && r.Shape == nil {
		return requestErr(InputLoRA, "estimate: LoRA adapts a model's linears: give a shape, not a parameter count")
	}
	if lora != nil && len(r.Freeze) > 0 {
		return requestErr(InputLoRAFreeze, "estimate: LoRA with frozen patterns (strata.freeze): LoRA freezes the whole base already")
	}
	if len(r.Freeze) > 0 {
		if r.Shape == nil {
			return requestErr(InputFreeze, "estimate: frozen patterns (strata.freeze) match tensor names: give a shape, not a parameter count")
		}
		f, err := FrozenChunks(base, r.Freeze)
		if err != nil {
			return &RequestError{Input: InputFreezePatterns, Err: fmt.Errorf("estimate: freeze: %w", err)}
		}
		opts.Frozen = f
		fp := FrozenParams(base, f)
		rep.Description += fmt.Sprintf("\nfrozen: %s (%s parameters, %.1f%%) keep their params only; Ψₜ = %s trainable",
			DescribeChunks(base, f), groupDigits(fp), 100*float64(fp)/float64(base.ParamCount()), groupDigits(base.ParamCount()-fp))
		return nil
	}
	if lora == nil {
		return nil
	}
	if err := lora.Validate(*r.Shape); err != nil {
		return &RequestError{Input: InputLoRA, Err: fmt.Errorf("estimate: LoRA: %w", err)}
	}
	l, err := base.WithLoRA(*lora)
	if err != nil {
		return &RequestError{Input: InputLoRA, Err: fmt.Errorf("estimate: LoRA: %w", err)}
	}
	opts.ChunkParams = ChunkParams(l)
	if opts.Frozen, err = FrozenChunks(l, nil); err != nil {
		return err
	}
	stored := "bf16"
	if lora.Base != 0 {
		if opts.Stage != 3 && r.Stage != 3 || opts.ParamTier == shard.HBM {
			return requestErr(InputLoRABase, "estimate: a %s base streams from host RAM or NVMe: give stage 3 and offload_param cpu or nvme", lora.Base)
		}
		opts.FrozenParamDType = lora.Base
		stored = lora.Base.String() + " in " + opts.ParamTier.String()
	}
	adapters := l.ParamCount() - base.ParamCount()
	rep.Description += fmt.Sprintf("\nLoRA r %d, alpha %g on %s: the base (%s parameters) frozen, params only (%s); adapters Ψₐ = %s trainable (%.3f%% of the base) in %d chunks",
		lora.R, lora.Alpha, strings.Join(lora.Targets, ", "), groupDigits(base.ParamCount()), stored, groupDigits(adapters),
		100*float64(adapters)/float64(base.ParamCount()), len(l.Chunks)-len(base.Chunks))
	return nil
}

// groupDigits is n with its thousands separated by commas.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// GroupDigits is n with its thousands separated by commas (1,234,567),
// as the estimate writes parameter counts.
func GroupDigits(n int64) string { return groupDigits(n) }
