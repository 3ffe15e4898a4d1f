package engine

import (
	"errors"
	"fmt"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
)

// Model is what the engine trains: the decoder the config's strata.model
// names (GPT-2, the Llama family: package model), or a model a Go program
// brings in Options.Model. The engine goes through these methods for both.
//
// The engine owns the parameters, gradients and optimizer state: it lays
// them out by Layout (each chunk sharded, gathered, reduced, offloaded as
// a unit), initialises chunk c with InitChunk (or Options.Init), and hands
// them to the passes through model.Params. The model owns its activations:
// New allocates them on one device (tag them gpu.Activation), Free frees
// them.
type Model interface {
	// Layout is the parameters in chunks, each a flat run of named tensors
	// (model.CustomLayout builds one). The engine reads it once, in New.
	Layout() *model.Layout
	// AccessOrder is the Params calls of one micro-batch, Forward then
	// Backward, in the order the passes make them, the same for every
	// micro-batch (model.StackOrder is that of a stack of chunks). The
	// engine checks every call against it (a call out of order panics) and
	// plans its collectives and transfers from it. The rules it must keep
	// (model.CheckAccessOrder): the forward makes only Acquire and Release calls
	// (and model.InputStore's, for the decoders with cpu_checkpointing),
	// acquires every chunk and comes before the backward; at most one chunk
	// is acquired (between Acquire and Release) at a time, Release naming
	// the chunk and pass of the Acquire before it; every chunk gets exactly
	// one Grad, in the backward, and one GradReady after it; at most two
	// chunks are between Grad and GradReady at once. The engine's workspace
	// (gathered chunks, gradient buckets) is sized for these rules.
	AccessOrder() []model.Access
	// InitChunk writes chunk c's initial values into dst (exactly the
	// chunk's length) for seed (strata.seed); the values must depend only
	// on (seed, c).
	InitChunk(seed uint64, c int, dst []float32)
	// Vocab is the number of token ids the model reads: the engine checks
	// every batch's ids and targets against [0, Vocab).
	Vocab() int
	// MaxSeq is the longest sequence the model takes: the default
	// strata.seq_len, and its bound.
	MaxSeq() int
	// New allocates one device's instance for micro-batches of batch rows
	// of seq tokens. The engine calls it once per device; an error
	// (*gpu.OutOfMemoryError among them) stops New.
	New(dev gpu.Device, batch, seq int) (Instance, error)
}

// Instance is a Model bound to one device and one micro-batch shape, used
// from one goroutine. Per micro-batch the engine calls Forward, Backward,
// then Losses.
type Instance interface {
	// Forward enqueues the forward pass of b on s (b.Rows×b.Seq tokens,
	// targets model.IgnoreTarget where no loss is taken), reaching chunk
	// c's parameters through p between p.Acquire and p.Release only. An
	// error of p ends the pass at once and is returned as it is, with no
	// further call to p; a Forward that fails leaves no loss for Losses.
	Forward(s gpu.Stream, p model.Params, b model.Batch) error
	// Backward enqueues the backward pass of the last Forward on s,
	// accumulating (+=) gradScale × the gradient of its mean loss into the
	// buffers p.Grad returns (the engine passes 1/(devices·accumulation),
	// so that the sum over the step's micro-batches is the gradient of the
	// step's mean loss). The same error rule as Forward.
	Backward(s gpu.Stream, p model.Params, gradScale float32) error
	// Losses synchronizes s and returns the mean loss (over the tokens with
	// a target; 0 when none has one) of every Forward since the last
	// call, oldest first. The engine calls it after each micro-batch whose
	// Forward succeeded, its Backward failed or not, and wants one value.
	Losses(s gpu.Stream) ([]float64, error)
	// Free releases the instance's device memory; the streams that used it
	// have completed.
	Free()
}

// builtin is a decoder of package model as a Model, with the activation
// options of the config (estimate.ActivationOptionsFromConfig): they decide its
// allocations and, with cpu_checkpointing, its InputStore calls.
type builtin struct {
	layout *model.Layout
	act    model.ActivationOptions
}

func (b builtin) Layout() *model.Layout       { return b.layout }
func (b builtin) AccessOrder() []model.Access { return b.layout.AccessOrder(b.act) }
func (b builtin) Vocab() int                  { return b.layout.Shape.Vocab }
func (b builtin) MaxSeq() int                 { return b.layout.Shape.LongestSeq() }

func (b builtin) InitChunk(seed uint64, c int, dst []float32) {
	b.layout.InitChunkInto(seed, c, dst)
}

func (b builtin) New(dev gpu.Device, batch, seq int) (Instance, error) {
	m, err := model.NewWith(dev, b.layout, batch, seq, b.act)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return m, nil
}

// newModel is the model New trains: Options.Model, or the decoder of the
// config's strata.model. With Options.Model, strata.model must be left out
// (a config without it names config.DefaultModel) or name the model
// (Layout().Name); cfg's copy that the engine keeps then names it, so that
// the config a checkpoint records says which model it holds. It checks the
// model's layout and access order.
func newModel(cfg *config.Config, opts Options) (Model, *model.Layout, []model.Access, *config.Config, error) {
	m := opts.Model
	if m == nil {
		if cfg.Shape() == nil {
			return nil, nil, nil, nil, errors.New("engine: strata.model has no shape (parse with config.Options.LookupShape)")
		}
		shape := model.Shape(*cfg.Shape())
		if shape.Name == "" {
			shape.Name = "config"
		}
		l, err := estimate.LayoutFromConfig(cfg, shape)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("engine: %w", err)
		}
		act := estimate.ActivationOptionsFromConfig(cfg, shape, opts.Precision)
		if err := act.Validate(shape); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("engine: %w", err)
		}
		m = builtin{l, act}
	}
	l := m.Layout()
	if l == nil {
		return nil, nil, nil, nil, errors.New("engine: Options.Model has no layout")
	}
	if err := l.Validate(); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("engine: %w", err)
	}
	if opts.Model != nil {
		if !l.Custom() {
			return nil, nil, nil, nil, fmt.Errorf("engine: Options.Model %q has a layout of package model (shape %v): name a built-in model in strata.model instead", l.Name, l.Shape)
		}
		if n := cfg.Strata.Model.Name; n != config.DefaultModel && n != l.Name {
			what := fmt.Sprintf("names %q", n)
			if n == "" {
				what = "is a shape"
			}
			return nil, nil, nil, nil, fmt.Errorf("engine: strata.model %s, but Options.Model is %q: leave strata.model out of the config (or name %q there)", what, l.Name, l.Name)
		}
		if opts.Init != nil {
			return nil, nil, nil, nil, fmt.Errorf("engine: Options.Init and Options.Model %q: a library model's initial values come from its InitChunk", l.Name)
		}
		if cfg.ActivationCheckpointing != nil {
			return nil, nil, nil, nil, fmt.Errorf("%w: activation_checkpointing with Options.Model %q: the engine checkpoints the blocks of package model's decoders; a library model keeps its own activations", ErrNotBuilt, l.Name)
		}
		c := *cfg
		c.Strata.Model = config.ModelSpec{Name: l.Name}
		cfg = &c
	}
	if v, s := m.Vocab(), m.MaxSeq(); v < 1 || s < 1 {
		return nil, nil, nil, nil, fmt.Errorf("engine: model %q: vocabulary %d and max sequence %d must be >= 1", l.Name, v, s)
	}
	order := m.AccessOrder()
	if err := model.CheckAccessOrder(order, len(l.Chunks)); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("engine: model %q: %w", l.Name, err)
	}
	return m, l, order, cfg, nil
}

// activationsOf is how m keeps its activations: the builtin decoders'
// options, or for a library model (which allocates its own) the dtype
// the config asks for, without checkpointing.
func activationsOf(m Model, cfg *config.Config, opts Options) model.ActivationOptions {
	if b, ok := m.(builtin); ok {
		return b.act
	}
	return estimate.ActivationOptionsFromConfig(cfg, m.Layout().Shape, opts.Precision)
}
