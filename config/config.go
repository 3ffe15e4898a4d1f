package config

import (
	"encoding/json"
	"fmt"
	"os"
)

// Config is a parsed and checked run configuration. The exported fields hold
// resolved values (defaults filled in, batch sizes derived); they carry the
// DeepSpeed key names as JSON tags, so that printing a Config as JSON gives a
// file that Parse reads back into the same run.
type Config struct {
	TrainBatchSize            int `json:"train_batch_size"`
	TrainMicroBatchSizePerGPU int `json:"train_micro_batch_size_per_gpu"`
	GradientAccumulationSteps int `json:"gradient_accumulation_steps"`

	Optimizer Optimizer `json:"optimizer"`
	Scheduler Scheduler `json:"scheduler"`
	BF16      BF16      `json:"bf16"`
	FP16      FP16      `json:"fp16"`

	GradientClipping   float64 `json:"gradient_clipping"` // max global L2 norm; 0 = off
	StepsPerPrint      int     `json:"steps_per_print"`
	WallClockBreakdown bool    `json:"wall_clock_breakdown"`

	ZeRO ZeRO `json:"zero_optimization"`
	AIO  AIO  `json:"aio"`
	// ActivationCheckpointing is on when the file has the block (nil: off).
	ActivationCheckpointing *ActivationCheckpointing `json:"activation_checkpointing,omitempty"`
	// TensorBoard and CSVMonitor are DeepSpeed's monitors, nil unless
	// enabled (monitor writes them; wandb and comet are refused).
	TensorBoard *Monitor `json:"tensorboard,omitempty"`
	CSVMonitor  *Monitor `json:"csv_monitor,omitempty"`
	Strata      Strata   `json:"strata"`

	ignored []string   // "said once" notices, in document order
	batch   batchGiven // which of the three batch keys the file gave
	file    string     // the file the config was parsed from, for messages
	chosen  []string   // the "auto" values Strata filled in, "key = value (from)", in document order
}

// batchGiven records the batch keys the user wrote (0 = absent or "auto"), so
// that a different device count can be applied later with DeepSpeed's rules.
type batchGiven struct {
	train, micro, accum int
}

// Optimizer is DeepSpeed's "optimizer" block. Strata implements Adam and AdamW.
type Optimizer struct {
	Type   string     `json:"type"` // "Adam" or "AdamW"
	Params AdamParams `json:"params"`
}

// AdamParams are the optimizer's hyper-parameters with DeepSpeed's defaults.
type AdamParams struct {
	LR          float64    `json:"lr"`           // default 1e-3
	Betas       [2]float64 `json:"betas"`        // default [0.9, 0.999]
	Eps         float64    `json:"eps"`          // default 1e-8
	WeightDecay float64    `json:"weight_decay"` // default 0
	// AdamWMode: weight decay decoupled from the gradient (AdamW). DeepSpeed's
	// default is true even for type "Adam"; type "AdamW" is always true.
	AdamWMode bool `json:"adam_w_mode"`
}

// Scheduler is DeepSpeed's "scheduler" block. Type "" means no scheduler:
// the learning rate stays optimizer.params.lr.
type Scheduler struct {
	Type   string          `json:"type,omitempty"` // "", "WarmupLR" or "WarmupDecayLR"
	Params SchedulerParams `json:"params"`
}

// MarshalJSON writes null for no scheduler, so the printed config reads back.
func (s Scheduler) MarshalJSON() ([]byte, error) {
	if s.Type == "" {
		return []byte("null"), nil
	}
	type plain Scheduler
	return json.Marshal(plain(s))
}

// SchedulerParams are the parameters of WarmupLR and WarmupDecayLR with
// DeepSpeed's defaults.
type SchedulerParams struct {
	WarmupMinLR    float64 `json:"warmup_min_lr"`             // default 0
	WarmupMaxLR    float64 `json:"warmup_max_lr"`             // default 1e-3
	WarmupNumSteps int     `json:"warmup_num_steps"`          // default 1000; DeepSpeed uses max(2, this)
	WarmupType     string  `json:"warmup_type"`               // "log" (default) or "linear"
	TotalNumSteps  int     `json:"total_num_steps,omitempty"` // WarmupDecayLR only; required there
}

// BF16 is DeepSpeed's "bf16" block: bf16 mixed precision (bf16 params,
// gradients and activations on the devices, fp32 master weights and
// moments), the default; off only when FP16 is on.
type BF16 struct {
	Enabled bool `json:"enabled"`
	// OptimizerStates is DeepSpeed's bf16_optimizer_states: Adam's moments
	// in bf16, the same as strata.optimizer_state.moments "bf16".
	OptimizerStates bool `json:"bf16_optimizer_states,omitempty"`
}

// FP16 is DeepSpeed's "fp16" block: fp16 mixed precision (fp16 params,
// gradients and activations on the devices, fp32 master weights and
// moments) with DeepSpeed's loss scaling, whose keys and defaults these
// are (internal/lossscale has the rules; config/README.md the sources).
type FP16 struct {
	Enabled bool `json:"enabled"`
	// LossScale is loss_scale: 0 (default) for dynamic scaling, else a
	// static scale.
	LossScale float64 `json:"loss_scale"`
	// InitialScalePower: the dynamic scale starts at 2^this (16).
	InitialScalePower int `json:"initial_scale_power"`
	// LossScaleWindow: good steps before the scale doubles (1000).
	LossScaleWindow int `json:"loss_scale_window"`
	// Hysteresis: overflows tolerated before the scale halves (2).
	Hysteresis int `json:"hysteresis"`
	// ConsecutiveHysteresis: a good step refills the hysteresis (false).
	ConsecutiveHysteresis bool `json:"consecutive_hysteresis"`
	// MinLossScale: the smallest scale (1); an overflow there stops the run.
	MinLossScale float64 `json:"min_loss_scale"`
}

// ZeRO is DeepSpeed's "zero_optimization" block. Counts are in parameters
// (elements), as in DeepSpeed.
type ZeRO struct {
	Stage                               int   `json:"stage"`                                     // 0-3, default 0
	ContiguousGradients                 bool  `json:"contiguous_gradients"`                      // not used: chunks are contiguous
	OverlapComm                         bool  `json:"overlap_comm"`                              // not used: always overlapped per chunk
	ReduceBucketSize                    int64 `json:"reduce_bucket_size"`                        // stage 2 gradient buckets; default 5e8
	AllgatherBucketSize                 int64 `json:"allgather_bucket_size"`                     // not used
	ReduceScatter                       bool  `json:"reduce_scatter"`                            // not used: always ReduceScatter
	Stage3ParamPersistenceThreshold     int64 `json:"stage3_param_persistence_threshold"`        // chunks with fewer params stay gathered; default 1e5
	Stage3PrefetchBucketSize            int64 `json:"stage3_prefetch_bucket_size"`               // not used: the planner decides
	Stage3MaxLiveParameters             int64 `json:"stage3_max_live_parameters"`                // not used: the planner decides
	Stage3MaxReuseDistance              int64 `json:"stage3_max_reuse_distance"`                 // not used: the planner decides
	Stage3Gather16bitWeightsOnModelSave bool  `json:"stage3_gather_16bit_weights_on_model_save"` // not used
	SubGroupSize                        int64 `json:"sub_group_size"`                            // not used: the optimizer works per chunk shard

	OffloadParam     OffloadParam     `json:"offload_param"`
	OffloadOptimizer OffloadOptimizer `json:"offload_optimizer"`

	auto []string // keys written as "auto", resolved by ResolveModel
}

// Offload devices, as DeepSpeed names them.
const (
	DeviceNone = "none"
	DeviceCPU  = "cpu"
	DeviceNVMe = "nvme"
)

// OffloadParam is zero_optimization.offload_param (stage 3 only).
type OffloadParam struct {
	Device      string   `json:"device"`       // none (default), cpu or nvme
	NVMePath    []string `json:"nvme_path"`    // one path or several (striped); required for nvme
	PinMemory   bool     `json:"pin_memory"`   // not used: Strata's host buffers are always pinned
	BufferCount int      `json:"buffer_count"` // not used: derived from the model and the plan
	BufferSize  int64    `json:"buffer_size"`  // not used: derived from the model and the plan
	MaxInCPU    int64    `json:"max_in_cpu"`   // not used: strata.host_budget decides
}

// OffloadOptimizer is zero_optimization.offload_optimizer (stage 1-3).
type OffloadOptimizer struct {
	Device        string   `json:"device"`         // none (default), cpu or nvme
	NVMePath      []string `json:"nvme_path"`      // one path or several (striped); required for nvme
	PinMemory     bool     `json:"pin_memory"`     // not used: always pinned
	BufferCount   int      `json:"buffer_count"`   // not used: derived
	FastInit      bool     `json:"fast_init"`      // not used
	PipelineRead  bool     `json:"pipeline_read"`  // not used: always reads ahead
	PipelineWrite bool     `json:"pipeline_write"` // not used: always writes behind
	Ratio         float64  `json:"ratio"`          // not used: the whole optimizer is offloaded
}

// AIO is DeepSpeed's "aio" block: how the NVMe engine is driven.
type AIO struct {
	BlockSize     int64 `json:"block_size"`     // bytes per request; default 1 MiB
	QueueDepth    int   `json:"queue_depth"`    // requests in flight per thread; default 8
	ThreadCount   int   `json:"thread_count"`   // also read as intra_op_parallelism; default 1
	SingleSubmit  bool  `json:"single_submit"`  // not used
	OverlapEvents bool  `json:"overlap_events"` // not used
	UseGDS        bool  `json:"use_gds"`        // not used: no GPUDirect Storage
}

// Strata is the "strata" block: what DeepSpeed leaves to the training script.
type Strata struct {
	Model           ModelSpec `json:"model"`       // default "tiny"
	Devices         int       `json:"devices"`     // local devices to use; default 1
	Backend         string    `json:"backend"`     // "cpu" (default) or "cuda"
	HBMBytes        int64     `json:"hbm_bytes"`   // per-device budget; 0 = the backend's capacity
	HostBudgetBytes int64     `json:"host_budget"` // the tier store's pinned host RAM (gradient shards, optimizer state, param copies, staging), all ranks; 0 = no limit
	SeqLen          int       `json:"seq_len"`     // tokens per sample; 0 = the model's max_seq_len
	Data            string    `json:"data"`        // training text; "" = built-in synthetic corpus
	// DataColumns are the names the data holds the examples' fields
	// under ("messages=dialog,role=speaker"; data.ParseColumns), "" for
	// the conventions' own: recorded so that a resumed run reads the
	// same examples.
	DataColumns string `json:"data_columns,omitempty"`
	Seed        uint64 `json:"seed"`    // default 1
	Overlap     string `json:"overlap"` // "exact" (default), "serial" (the optimizer after the step, a reference) or "dpu"
	// DPUWarmupSteps are the first steps of an overlap "dpu" run that run
	// exact (default 40, after the ZeRO-Offload paper).
	DPUWarmupSteps int `json:"dpu_warmup_steps"`
	// UpdateInBackward (overlap "exact", optimizer state in host RAM)
	// starts each chunk's cpuadam during the backward, as soon as its
	// gradient is final, as if the step were not clipped; a clipped or
	// non-finite step undoes it (a clipped one then updates after the
	// backward, and so does the step after it). Off by default: the undo
	// costs a copy of the optimizer state in host RAM (12 B per parameter
	// per rank).
	UpdateInBackward bool `json:"update_in_backward"`
	Steps            int  `json:"steps"` // optimizer steps; default 20
	// ActivationDType is the dtype the model keeps its activations in:
	// "bf16" (the default; norm and softmax statistics, the loss and the
	// residual gradient stay fp32) or "fp32", for checks.
	ActivationDType string `json:"activation_dtype"`
	// Freeze names the parameters that do not train, as patterns over the
	// model's tensor names (model.Layout): a pattern without any of * ? [
	// matches every tensor whose name contains it ("layers.0." is layer 0,
	// not 10); one with them is a path.Match glob over the whole name
	// ("h.[0-3].*"). The engine freezes whole chunks: the patterns must
	// cover every tensor of a chunk or none (estimate.FrozenChunks). A frozen
	// chunk keeps its params only: no gradient reduction, no optimizer
	// state, no update. Empty: everything trains.
	Freeze []string `json:"freeze,omitempty"`
	// LoRA trains low-rank adapters on a frozen base instead of every
	// weight (nil: full fine-tuning). PEFT's LoraConfig meanings.
	LoRA *LoRA `json:"lora,omitempty"`
	// Deterministic keeps the rank-order collectives (peer copies, ranks
	// added in order 0..N-1 and rounded once), so that every run of the
	// same config gives the same bits, on every rank. false lets the cuda
	// backend run them with NCCL where it can (faster on several GPUs; its
	// reduction order is its own, so runs may differ in the last bits).
	// Default true.
	Deterministic bool `json:"deterministic"`
	// OptimizerState is the stored precision of the offloaded optimizer
	// state (cpuadam's narrow moments).
	OptimizerState OptimizerState `json:"optimizer_state"`

	devicesFrom string // where Devices came from, for messages: "--devices", "strata.devices in FILE" or "" (the default)
}

// LoRA is strata.lora, PEFT's LoraConfig: adapters of rank R on the
// linears TargetModules names (as PEFT matches a list: a module's name, or
// its path's last components; a target that matches nothing is an
// error), their output scaled by Alpha/R (Alpha/√R with UseRSLoRA). The
// base trains nothing (strata.freeze then adds nothing). Defaults: r 8,
// alpha 8 (PEFT's), target_modules PEFT's defaults for the architecture
// (q_proj and v_proj; GPT-2 c_attn).
type LoRA struct {
	R             int      `json:"r"`
	Alpha         float64  `json:"alpha"`
	Dropout       float64  `json:"dropout"` // the adapters' input dropout, [0, 1); default 0
	TargetModules []string `json:"target_modules"`
	UseRSLoRA     bool     `json:"use_rslora"`
	// BaseDType is how the frozen base's param shards are stored in host
	// RAM and on NVMe: "bf16" (the default), "nf4" (QLoRA's 4-bit
	// NormalFloat, block 64: 0.5625 B/param) or "int8" (LLM.int8's absmax
	// code, block 64: 1.0625 B/param), decoded to bf16 on the device as
	// each shard arrives. nf4 and int8 need the params offloaded
	// (zero_optimization.offload_param cpu or nvme, stage 3).
	BaseDType string `json:"base_dtype,omitempty"`
}

// Base dtypes of strata.lora.base_dtype.
const (
	BaseBF16 = "bf16"
	BaseNF4  = "nf4"
	BaseInt8 = "int8"
)

// BaseDTypes are strata.lora.base_dtype's names, BaseBF16 first; every
// other one names a codec of dtype.Codecs (a test of estimate checks that
// the two lists agree).
var BaseDTypes = []string{BaseBF16, BaseNF4, BaseInt8}

// OptimizerState is strata.optimizer_state. Narrow moments need the
// optimizer offloaded (zero_optimization.offload_optimizer.device cpu or
// nvme): they are a format of cpuadam's.
type OptimizerState struct {
	// Moments is Adam's m and v: "fp32" (the default, 8 B/param), "bf16"
	// (4 B/param; DeepSpeed's bf16.bf16_optimizer_states) or "int8" (8-bit
	// codes in blocks of 256 with an fp32 scale each, ~2.03 B/param;
	// shards under 4,096 params keep fp32).
	Moments string `json:"moments"`
	// Master is the master weights: "fp32" (4 B/param) or
	// "bf16+remainder" (the bf16 param plus the master's low 16 bits and a
	// bit saying the param was rounded up, 2.125 B/param beside the param:
	// bit-exact to fp32; bf16 training only). Unset (""), it is
	// MasterFormat's choice: "bf16+remainder" with the optimizer on NVMe
	// in bf16, where it saves 1.875 B/param of the drive's traffic each
	// way, else "fp32".
	Master string `json:"master,omitempty"`
}

// Master weights of strata.optimizer_state.master.
const (
	MasterFP32          = "fp32"
	MasterBF16Remainder = "bf16+remainder"
)

// MasterFormat is the master weights' format: strata.optimizer_state.master
// when set, else "bf16+remainder" with offload_optimizer "nvme" and bf16
// (the drive moves 2.125 B/param of master each way instead of 4, and the
// masters are the same bits), else "fp32". An engine whose precision is
// not the config's (engine.Options.Precision) resolves it again.
func (c *Config) MasterFormat() string {
	switch {
	case c.Strata.OptimizerState.Master != "":
		return c.Strata.OptimizerState.Master
	case c.ZeRO.OffloadOptimizer.Device == DeviceNVMe && !c.FP16.Enabled:
		return MasterBF16Remainder
	}
	return MasterFP32
}

// RemainderMaster reports whether the master is kept as the bf16 param
// plus a remainder (MasterFormat).
func (c *Config) RemainderMaster() bool {
	return c.MasterFormat() == MasterBF16Remainder
}

// Moment precisions of strata.optimizer_state.moments (cpuadam.Moments's names).
const (
	MomentsFP32 = "fp32"
	MomentsBF16 = "bf16"
	MomentsInt8 = "int8"
)

// NarrowMoments reports whether the moments are stored in fewer than 4 bytes.
func (c *Config) NarrowMoments() bool { return c.Strata.OptimizerState.Moments != MomentsFP32 }

// Shape is a model shape written out in the config. It has the fields of
// model.Shape in the same order, so engine converts with model.Shape(s).
type Shape struct {
	Name   string `json:"name,omitempty"`
	Layers int    `json:"n_layer"`
	Dim    int    `json:"n_embd"`
	Heads  int    `json:"n_head"`
	Vocab  int    `json:"vocab_size"`
	MaxSeq int    `json:"max_seq_len"`

	Arch          string  `json:"arch,omitempty"`
	KVHeads       int     `json:"n_kv_head,omitempty"`
	FFN           int     `json:"n_inner,omitempty"`
	RopeTheta     float64 `json:"rope_theta,omitempty"`
	NormEps       float64 `json:"norm_eps,omitempty"`
	TieEmbeddings bool    `json:"tie_word_embeddings,omitempty"`

	HeadDimension  int         `json:"head_dim,omitempty"`
	Rope           RopeScaling `json:"rope_scaling,omitzero"`
	RotaryFraction float64     `json:"partial_rotary_factor,omitempty"`
	SlidingWindow  int         `json:"sliding_window,omitempty"`
	LayerTypes     string      `json:"layer_types,omitempty"`
	RopeLocalTheta float64     `json:"rope_local_base_freq,omitempty"`
	QueryScale     float64     `json:"query_pre_attn_scalar,omitempty"`
	AttnSoftCap    float64     `json:"attn_logit_softcapping,omitempty"`
	FinalSoftCap   float64     `json:"final_logit_softcapping,omitempty"`

	Experts       int     `json:"num_experts,omitempty"`
	TopK          int     `json:"num_experts_per_tok,omitempty"`
	ExpertFFN     int     `json:"moe_intermediate_size,omitempty"`
	NormTopK      bool    `json:"norm_topk_prob,omitempty"`
	MLPLayers     string  `json:"mlp_layers,omitempty"`
	RouterAux     bool    `json:"output_router_logits,omitempty"`
	RouterAuxCoef float64 `json:"router_aux_loss_coef,omitempty"`
}

// RopeScaling is a shape's rotary scaling: model.RopeScaling, which
// documents it. Both alias one unnamed struct type (the same fields and
// tags), so that Shape converts to model.Shape without either package
// importing the other; keep the two declarations alike.
type RopeScaling = struct {
	Type            string  `json:"rope_type,omitempty"`
	Factor          float64 `json:"factor,omitempty"`
	OriginalMax     int     `json:"original_max_position_embeddings,omitempty"`
	LowFreqFactor   float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor  float64 `json:"high_freq_factor,omitempty"`
	AttentionFactor float64 `json:"attention_factor,omitempty"`
	BetaFast        float64 `json:"beta_fast,omitempty"`
	BetaSlow        float64 `json:"beta_slow,omitempty"`
	Mscale          float64 `json:"mscale,omitempty"`
	MscaleAllDim    float64 `json:"mscale_all_dim,omitempty"`
	NoTruncate      bool    `json:"no_truncate,omitempty"`
	ShortFactor     string  `json:"short_factor,omitempty"`
	LongFactor      string  `json:"long_factor,omitempty"`
}

// ModelSpec is strata.model: a named shape ("gpt2") or an explicit one.
// After Parse with Options.LookupShape (or after ResolveModel), Shape is set.
type ModelSpec struct {
	Name  string
	Shape *Shape
}

// MarshalJSON writes the name when there is one, else the shape.
func (m ModelSpec) MarshalJSON() ([]byte, error) {
	if m.Name != "" {
		return json.Marshal(m.Name)
	}
	if m.Shape == nil {
		return []byte("null"), nil
	}
	return json.Marshal(m.Shape)
}

// Options change how Parse works.
type Options struct {
	// LookupShape resolves a named strata.model at parse time, so that an
	// unknown name is reported at its line and "auto" values that depend on
	// the hidden size are filled in. cmd passes a wrapper of model.Lookup.
	LookupShape func(name string) (Shape, error)
	// Devices is cmd's --devices: when > 0 it decides the device count, as
	// DeepSpeed's launcher does; strata.devices is only the default.
	Devices int
	// Auto holds the trainer's values for keys written as "auto" (cmd's
	// flags); a zero field takes the documented default (see Auto).
	Auto Auto
}

// Default values, as DeepSpeed documents them unless said otherwise.
const (
	DefaultLR                   = 1e-3
	DefaultBeta1                = 0.9
	DefaultBeta2                = 0.999
	DefaultEps                  = 1e-8
	DefaultWarmupMaxLR          = 1e-3
	DefaultWarmupNumSteps       = 1000
	DefaultStepsPerPrint        = 10
	DefaultReduceBucketSize     = 500_000_000
	DefaultAllgatherBucketSize  = 500_000_000
	DefaultPersistenceThreshold = 100_000
	DefaultPrefetchBucketSize   = 50_000_000
	DefaultMaxLiveParameters    = 1_000_000_000
	DefaultMaxReuseDistance     = 1_000_000_000
	DefaultSubGroupSize         = 1_000_000_000
	DefaultAIOBlockSize         = 1 << 20
	DefaultAIOQueueDepth        = 8
	DefaultAIOThreadCount       = 1
	DefaultModel                = "tiny" // Strata
	DefaultSteps                = 20     // Strata
	DefaultSeed                 = 1      // Strata
	DefaultDPUWarmupSteps       = 40     // Strata: exact steps before the delayed update
	DefaultMicroBatch           = 4      // Strata, only for Default() (no file)
)

// Default is the configuration of a run without --config: DeepSpeed's
// defaults, micro-batch 4 on one device, the "tiny" model, 20 steps.
func Default() *Config {
	c := &Config{}
	c.setDefaults()
	c.batch = batchGiven{micro: DefaultMicroBatch}
	if err := c.resolveBatch(); err != nil {
		panic("config: default config is inconsistent: " + err.Error())
	}
	return c
}

func (c *Config) setDefaults() {
	c.Optimizer = Optimizer{Type: "AdamW", Params: AdamParams{LR: DefaultLR, Betas: [2]float64{DefaultBeta1, DefaultBeta2}, Eps: DefaultEps, AdamWMode: true}}
	c.Scheduler = Scheduler{Params: SchedulerParams{WarmupMaxLR: DefaultWarmupMaxLR, WarmupNumSteps: DefaultWarmupNumSteps, WarmupType: "log"}}
	c.BF16 = BF16{Enabled: true}
	c.FP16 = FP16{InitialScalePower: 16, LossScaleWindow: 1000, Hysteresis: 2, MinLossScale: 1}
	c.StepsPerPrint = DefaultStepsPerPrint
	c.ZeRO = ZeRO{
		ContiguousGradients:             true,
		ReduceBucketSize:                DefaultReduceBucketSize,
		AllgatherBucketSize:             DefaultAllgatherBucketSize,
		ReduceScatter:                   true,
		Stage3ParamPersistenceThreshold: DefaultPersistenceThreshold,
		Stage3PrefetchBucketSize:        DefaultPrefetchBucketSize,
		Stage3MaxLiveParameters:         DefaultMaxLiveParameters,
		Stage3MaxReuseDistance:          DefaultMaxReuseDistance,
		SubGroupSize:                    DefaultSubGroupSize,
		OffloadParam:                    OffloadParam{Device: DeviceNone, BufferCount: 5, BufferSize: 100_000_000, MaxInCPU: 1_000_000_000},
		OffloadOptimizer:                OffloadOptimizer{Device: DeviceNone, BufferCount: 4, Ratio: 1},
	}
	c.AIO = AIO{BlockSize: DefaultAIOBlockSize, QueueDepth: DefaultAIOQueueDepth, ThreadCount: DefaultAIOThreadCount, OverlapEvents: true}
	c.Strata = Strata{Model: ModelSpec{Name: DefaultModel}, Devices: 1, Backend: "cpu", Seed: DefaultSeed, Overlap: "exact", DPUWarmupSteps: DefaultDPUWarmupSteps, Steps: DefaultSteps,
		ActivationDType: ActivationBF16, Deterministic: true, OptimizerState: OptimizerState{Moments: MomentsFP32}}
}

// Load reads and parses a config file.
func Load(path string, opts Options) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path, opts)
}

// Ignored returns the notices about DeepSpeed knobs that the file sets and
// Strata accepts but does not use, one line each, to be shown once.
func (c *Config) Ignored() []string { return append([]string(nil), c.ignored...) }

// JSON returns the resolved config as indented JSON that Parse reads back.
func (c *Config) JSON() []byte {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		panic("config: marshal: " + err.Error())
	}
	return b
}

// Shape returns the resolved model shape, or nil when strata.model is a name
// that was not looked up (see Options.LookupShape and ResolveModel).
func (c *Config) Shape() *Shape { return c.Strata.Model.Shape }

// ResolveModel records the shape of a named strata.model and fills in the
// zero_optimization values written as "auto" from its hidden size C, as the
// Hugging Face integration does: reduce_bucket_size = C²,
// stage3_prefetch_bucket_size = 0.9·C², stage3_param_persistence_threshold = 10·C.
// A name that did not resolve to s (one not looked up, or looked up to
// another shape: a model opened from a Hugging Face directory) is dropped,
// so that the config written out (JSON) names s itself, and a run resumed
// from it gets the model it trained rather than the name's.
func (c *Config) ResolveModel(s Shape) {
	if m := c.Strata.Model; m.Name != "" && (m.Shape == nil || *m.Shape != s) {
		c.Strata.Model.Name = ""
	}
	c.Strata.Model.Shape = &s
	hidden := int64(s.Dim)
	for _, k := range c.ZeRO.auto {
		switch k {
		case "reduce_bucket_size":
			c.ZeRO.ReduceBucketSize = hidden * hidden
			c.chosen = append(c.chosen, fmt.Sprintf("zero_optimization.%s = %d (n_embd²)", k, c.ZeRO.ReduceBucketSize))
		case "stage3_prefetch_bucket_size":
			c.ZeRO.Stage3PrefetchBucketSize = hidden * hidden * 9 / 10
			c.chosen = append(c.chosen, fmt.Sprintf("zero_optimization.%s = %d (0.9·n_embd²)", k, c.ZeRO.Stage3PrefetchBucketSize))
		case "stage3_param_persistence_threshold":
			c.ZeRO.Stage3ParamPersistenceThreshold = 10 * hidden
			c.chosen = append(c.chosen, fmt.Sprintf("zero_optimization.%s = %d (10·n_embd)", k, c.ZeRO.Stage3ParamPersistenceThreshold))
		}
	}
	c.ZeRO.auto = nil
}

// DecoupledWeightDecay says whether weight decay is applied AdamW-style
// (true for AdamW, and for Adam unless adam_w_mode is false, as in DeepSpeed).
func (o Optimizer) DecoupledWeightDecay() bool { return o.Type == "AdamW" || o.Params.AdamWMode }
