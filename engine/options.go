package engine

import (
	"fmt"
	"runtime"
	"time"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/timeline"
)

// Options configure an Engine beyond its config file.
type Options struct {
	// Corpus is a raw training text, drawn from in random windows
	// (model.Sampler): in memory (model.Tokens, model.Encode), or streamed
	// from a file (model.FileCorpus, or a token file: data.OpenTrainData; the
	// caller closes it after the engine).
	Corpus model.Corpus
	// Model, when set, is the model to train, defined by the caller (a Go
	// program's own architecture; see Model and docs/library.md) instead
	// of the config's strata.model, which must then be left out or name
	// it (its Layout's Name). Init must be nil: the initial values come
	// from its InitChunk.
	Model Model
	// Dataset is packed training examples (data.Packed from
	// data.OpenTrainData, a JSONL file): the rows of each step by global index.
	// At most one of Corpus and Dataset; with neither, New opens
	// strata.data (data.OpenTrainData: the byte-level tokenizer, ChatML, token
	// file in os.TempDir, shuffled; the engine closes it), or uses the
	// built-in synthetic corpus when that is empty too.
	Dataset Dataset
	// Init, when set, gives the initial parameters instead of the seeded
	// initialisation (Layout.InitChunk with strata.seed): an imported
	// model (hf.Open, a training checkpoint's weights through
	// checkpoint.Open). Its shape must be the config's. New reads one
	// chunk at a time, in order, and writes it to every rank's shards
	// wherever they live (device, host, NVMe): the fp32 master weights
	// are the source's values, the bf16 params those rounded to nearest
	// even. The caller closes it after New.
	Init ChunkSource
	// InitAdapters, with strata.lora, is where the adapter chunks' initial
	// values come from (a PEFT adapter: hf.PEFTAdapter); nil: the seeded
	// initialisation (A Kaiming-uniform, B zero).
	InitAdapters ChunkSource
	// Inference builds an engine that evaluates and never trains: every
	// chunk is frozen (params only, wherever the config puts them: on
	// the devices, in host RAM, on NVMe, streamed through the tiers by
	// the planner as for training), so there is no gradient and no
	// optimizer state anywhere; Step is refused, Eval runs.
	Inference bool
	// Precision is the dtype of the device params and grads: gpu.BF16
	// (default, the config's bf16 mixed precision: fp32 master weights and
	// moments), gpu.F16 (the config's fp16 block, which sets it: fp16
	// mixed precision with loss scaling) or gpu.F32 (fp32 everywhere, the
	// params are the master weights). The config has no fp32 mode; this is
	// for library users and the tests. The activations are bf16 or fp16
	// with gpu.BF16 or gpu.F16 (fp32 with the config's
	// strata.activation_dtype "fp32") and fp32 with gpu.F32
	// (estimate.ActivationOptionsFromConfig), as model.Trainer keeps them with the
	// same Precision.
	Precision gpu.DType
	// OptimizerThreads is the number of goroutines of the host optimizer
	// (cpuadam) when offload_optimizer.device is cpu; 0 = GOMAXPROCS.
	OptimizerThreads int
	// MaxLiveChunks bounds, at stage 3, the gathered chunks each device
	// holds at once (the chunk in use and the next one, prefetched): 0 = 2.
	// When a gather would exceed it, the rank waits for the oldest
	// released chunk's last use and frees it.
	MaxLiveChunks int
	// PinnedLock is the mlock policy of the pinned host memory of the host
	// optimizer: the tier store's host copies and the parameter uploads.
	PinnedLock pinned.LockMode

	// The tier store (ZeRO-Infinity: offload_param, or offload_optimizer
	// nvme, at stage 3):

	// NVMeDevice, when set, wraps the NVMe engine under the swap files
	// (tests inject nvme.Faulty here). nil: the engine itself.
	NVMeDevice func(nvme.Device) nvme.Device
	// TierHBMBytes is the tier store's share of each device's memory: the
	// param shard copies staged in HBM. 0: what is left after the model
	// state, activations and workspace, at most the rank's param shards.
	TierHBMBytes int64
	// PrefetchSlack is how early every planned transfer aims to land
	// before the access that needs it; 0 = 20 ms: the planner's runner is
	// a goroutine woken by a timer, and while compute goroutines hold every
	// P the Go scheduler may run it up to a preemption quantum (10 ms) late.
	PrefetchSlack time.Duration
	// LinkBandwidth is the bandwidth of each link the planner starts
	// with, in bytes/s; zero entries take DefaultLinkBandwidth. Once a link
	// has moved 4 MiB the planner plans with 0.7 times what the tier store
	// measured on it (an average over steps, updated after each), within
	// 1/8 and 8 times this value.
	LinkBandwidth [shard.LinkCount]float64

	// HostRegistrar, when set, is given every pinned host arena of the
	// engine (pinned.Pool.AddRegistrar) so that the device backend can
	// page-lock it for DMA (gpu/cuda: Backend.HostRegistrar). A failure is
	// a note (Notes), not an error: the copies then go through pageable
	// memory. nil: nothing is registered (the CPU backend needs nothing).
	HostRegistrar pinned.Registrar
	// Collectives is what runs the comms' collectives, as the backend
	// says it (backend.Devices.Collectives), reported in Summary.
	Collectives string
	// NodeProcs is the processes of the job on this node (Options.Procs),
	// which share its strata.host_budget: each takes host_budget /
	// NodeProcs (0 or 1: the budget is this process's alone).
	NodeProcs int
	// Procs joins this process's devices with those of the other
	// processes of a job (procs.go); nil: this process is the job. The
	// comms are then global ranks Proc()·len(devices)+i of
	// Procs()·len(devices), and the config is resolved for all of them.
	Procs Procs
	// Trace, when set, records the run's timeline (compute and collectives
	// per stream, shard waits, tier-store moves per link, cpuadam, steps)
	// for Engine.WriteTrace and timeline.Overlap. One Tracer per Engine.
	// nil: nothing is recorded (the hooks cost a nil check).
	Trace *timeline.Tracer
}

// ChunkSource gives a model's parameters one chunk at a time
// (Options.Init).
type ChunkSource interface {
	// Shape is the shape of the model the source holds.
	Shape() model.Shape
	// ReadChunk fills dst, exactly the length of chunk c of the shape's
	// layout, with the chunk's values as fp32.
	ReadChunk(c int, dst []float32) error
}

// DefaultLinkBandwidth is what the planner assumes of each link when
// Options.LinkBandwidth does not say: about this machine's virtio disk
// (reads 1.5 GB/s, writes 1 GB/s) and a host memcpy for the CPU backend's
// host<->device copies (6 GB/s). Lower than the truth makes the planner
// issue transfers earlier (more memory held, fewer stalls).
var DefaultLinkBandwidth = [shard.LinkCount]float64{
	shard.NVMeToHost: 1.5e9,
	shard.HostToHBM:  6e9,
	shard.HBMToHost:  6e9,
	shard.HostToNVMe: 1e9,
}

func (o Options) withDefaults() Options {
	if o.Precision == 0 {
		o.Precision = gpu.BF16
	}
	if o.OptimizerThreads == 0 {
		o.OptimizerThreads = runtime.GOMAXPROCS(0)
	}
	if o.MaxLiveChunks == 0 {
		o.MaxLiveChunks = 2
	}
	if o.PrefetchSlack == 0 {
		o.PrefetchSlack = 20 * time.Millisecond
	}
	for l, bw := range o.LinkBandwidth {
		if bw == 0 {
			o.LinkBandwidth[l] = DefaultLinkBandwidth[l]
		}
	}
	return o
}

// Validate says what is wrong with o (after defaults).
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Precision != gpu.F32 && !o.Precision.Half():
		return fmt.Errorf("engine: precision %s is not bf16, f16 or f32", o.Precision)
	case o.OptimizerThreads < 1:
		return fmt.Errorf("engine: optimizer threads %d must be >= 1", o.OptimizerThreads)
	case o.MaxLiveChunks < 2:
		return fmt.Errorf("engine: max live chunks %d must be >= 2 (the chunk in use and the next)", o.MaxLiveChunks)
	case o.Corpus != nil && o.Dataset != nil:
		return fmt.Errorf("engine: options give both a Corpus and a Dataset: give one")
	case o.TierHBMBytes < 0 || o.PrefetchSlack < 0:
		return fmt.Errorf("engine: tier hbm bytes %d and prefetch slack %v must be >= 0", o.TierHBMBytes, o.PrefetchSlack)
	}
	for l, bw := range o.LinkBandwidth {
		if !(bw > 0) {
			return fmt.Errorf("engine: %s bandwidth %v B/s must be positive", shard.Link(l), bw)
		}
	}
	return nil
}

func (o Options) String() string {
	o = o.withDefaults()
	src := "config"
	switch c := o.Corpus.(type) {
	case nil:
		if o.Dataset != nil {
			src = fmt.Sprintf("packed rows of %d", o.Dataset.Seq())
		}
	case *model.FileCorpus:
		src = fmt.Sprintf("file %s (%d tokens)", c.Path(), c.Len())
	default:
		src = fmt.Sprintf("%d tokens", c.Len())
	}
	init := "seed"
	if o.Init != nil {
		init = o.Init.Shape().Name
	}
	mod := "config"
	if o.Model != nil {
		mod = "library model"
		if l := o.Model.Layout(); l != nil {
			mod = fmt.Sprintf("%q", l.Name)
		}
	}
	return fmt.Sprintf("engine.Options{Model: %s, Data: %s, Init: %s, Precision: %s, OptimizerThreads: %d, MaxLiveChunks: %d, PinnedLock: %s, TierHBMBytes: %d, PrefetchSlack: %v, Trace: %v}",
		mod, src, init, o.Precision, o.OptimizerThreads, o.MaxLiveChunks, o.PinnedLock, o.TierHBMBytes, o.PrefetchSlack, o.Trace != nil)
}

// UseData gives o the data of d (data.OpenTrainData): Corpus for raw
// text, Dataset for JSONL.
func (o *Options) UseData(d *data.TrainData) {
	o.Corpus, o.Dataset = nil, nil
	if d.Packed != nil {
		o.Dataset = d.Packed
	} else {
		o.Corpus = d.Corpus
	}
}
