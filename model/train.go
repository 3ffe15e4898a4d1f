package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
)

// TrainOptions configure the plain single-device training loop.
type TrainOptions struct {
	Batch int // rows (sequences) per micro-batch; default 4
	Seq   int // tokens per row; default min(64, MaxSeq)
	Accum int // micro-batches per step and rank; default 1
	// Ranks is the number of data-parallel ranks the step stands for
	// (default 1): each virtual rank accumulates its Accum micro-batches
	// (Sampler.RankBatch) into gradients of its own, and the ranks'
	// gradients are then summed in rank order in fp32 and rounded once,
	// as gpu.Comm reduces. This is the baseline a ZeRO run on Ranks devices
	// must reproduce.
	Ranks int
	// Precision is the dtype of the parameters and gradients on the device:
	// gpu.F32 (default), or gpu.BF16 or gpu.F16 for mixed precision with
	// fp32 master weights and Adam moments (this loop scales no loss: F16
	// here is the engine's fp16 path at loss scale 1).
	Precision gpu.DType
	// Activations say how the model keeps its activations: their dtype
	// (default Precision: bf16 activations in mixed precision, as the ZeRO
	// engine keeps them unless told otherwise) and how many blocks are
	// checkpointed. Offload is the engine's (it needs an InputStore): the
	// plain loop refuses it.
	Activations ActivationOptions

	LR          float64 // default 1e-3
	Beta1       float64 // default 0.9
	Beta2       float64 // default 0.95
	Eps         float64 // default 1e-8
	WeightDecay float64 // AdamW decoupled decay, applied to every parameter; default 0
	ClipNorm    float64 // clip the global gradient norm to this; 0 turns clipping off
	// Schedule returns the learning rate of step (1 for the first); nil
	// keeps LR constant.
	Schedule func(step int64) float64
	Seed     uint64 // initialisation seed (Layout.InitChunk)
	// Init, when not nil, is the initial params, one slice of each
	// chunk's length per chunk (Layout.Chunks), in place of Seed's.
	Init [][]float32
}

// WithDefaults fills the zero fields.
func (o TrainOptions) WithDefaults(s Shape) TrainOptions {
	if o.Batch == 0 {
		o.Batch = 4
	}
	if o.Seq == 0 {
		o.Seq = min(64, s.MaxSeq)
	}
	if o.Accum == 0 {
		o.Accum = 1
	}
	if o.Ranks == 0 {
		o.Ranks = 1
	}
	if o.Precision == 0 {
		o.Precision = gpu.F32
	}
	if o.Activations.DType == 0 {
		o.Activations.DType = o.Precision
	}
	if o.LR == 0 {
		o.LR = 1e-3
	}
	if o.Beta1 == 0 {
		o.Beta1 = 0.9
	}
	if o.Beta2 == 0 {
		o.Beta2 = 0.95
	}
	if o.Eps == 0 {
		o.Eps = 1e-8
	}
	return o
}

// Validate says what is wrong with o (after WithDefaults).
func (o TrainOptions) Validate(s Shape) error {
	switch {
	case o.Batch < 1 || o.Seq < 1 || o.Accum < 1 || o.Ranks < 1:
		return fmt.Errorf("model: batch %d, seq %d, accum %d and ranks %d must be >= 1", o.Batch, o.Seq, o.Accum, o.Ranks)
	case o.Seq > s.LongestSeq():
		return fmt.Errorf("model: seq %d exceeds max_seq_len %d", o.Seq, s.LongestSeq())
	case o.Precision != gpu.F32 && !o.Precision.Half():
		return fmt.Errorf("model: precision %s is not fp32, bf16 or fp16", o.Precision)
	case o.Activations.Offload:
		return fmt.Errorf("model: the plain training loop has no InputStore to offload checkpointed inputs to (cpu_checkpointing is the engine's)")
	case !(o.LR >= 0) || !(o.Beta1 >= 0 && o.Beta1 < 1) || !(o.Beta2 >= 0 && o.Beta2 < 1) || !(o.Eps > 0) || !(o.WeightDecay >= 0):
		return fmt.Errorf("model: invalid optimizer settings lr %v betas (%v, %v) eps %v weight decay %v", o.LR, o.Beta1, o.Beta2, o.Eps, o.WeightDecay)
	case !(o.ClipNorm >= 0):
		return fmt.Errorf("model: clip norm %v must be >= 0", o.ClipNorm)
	}
	return o.Activations.Validate(s)
}

func (o TrainOptions) String() string {
	return fmt.Sprintf("batch=%d seq=%d accum=%d ranks=%d precision=%s activations=%s checkpoint=%d lr=%g betas=(%g,%g) eps=%g wd=%g clip=%g schedule=%t seed=%d",
		o.Batch, o.Seq, o.Accum, o.Ranks, o.Precision, o.Activations.dtype(), o.Activations.Checkpoint, o.LR, o.Beta1, o.Beta2, o.Eps, o.WeightDecay, o.ClipNorm, o.Schedule != nil, o.Seed)
}

// StepResult describes one optimizer step.
type StepResult struct {
	Step     int64   // 1 for the first
	Loss     float64 // mean over the step's micro-batches of their mean loss
	GradNorm float64 // global L2 norm of the gradient before clipping
	ClipCoef float64 // factor applied to the gradient (1 when not clipped)
	LR       float64
}

// Trainer is the plain training loop on one device: every chunk resident,
// micro-batches accumulated, global-norm clipping, AdamW on the device
// (gpu.Ops.AdamStep) with fp32 master weights and moments. In fp32 mode the
// parameters are the master weights; in bf16 mode AdamStep writes the new
// bf16 parameters straight into the device copy the model reads.
//
// A step enqueues everything on one stream and synchronizes it once, after
// the backward passes, to read the losses and the gradient norm, and once
// after the optimizer; it is the baseline the ZeRO engine is
// compared with, not a fast path.
type Trainer struct {
	dev     gpu.Device
	s       gpu.Stream
	opts    TrainOptions
	layout  *Layout
	model   *Model
	params  *Resident
	rankGrd [][]gpu.Buffer // gradients of virtual ranks 1..Ranks-1
	sumBuf  gpu.Buffer     // fp32 reduction workspace (Ranks > 1)
	master  []gpu.Buffer   // bf16 mode only
	adamM   []gpu.Buffer
	adamV   []gpu.Buffer
	norms   gpu.Buffer // F64, one per chunk
	normsH  []byte
	step    int64
	allocs  []gpu.Buffer
}

// NewTrainer lays out shape, initialises the parameters from opts.Init or opts.Seed and
// allocates everything on dev.
func NewTrainer(dev gpu.Device, shape Shape, opts TrainOptions) (*Trainer, error) {
	opts = opts.WithDefaults(shape)
	if err := opts.Validate(shape); err != nil {
		return nil, err
	}
	layout, err := NewLayout(shape)
	if err != nil {
		return nil, err
	}
	if opts.Init != nil {
		if len(opts.Init) != len(layout.Chunks) {
			return nil, fmt.Errorf("model: Init has %d chunks, the layout %d", len(opts.Init), len(layout.Chunks))
		}
		for c, v := range opts.Init {
			if len(v) != layout.Chunks[c].Len {
				return nil, fmt.Errorf("model: Init's chunk %d (%s) has %d values, the layout %d", c, layout.Chunks[c].Name, len(v), layout.Chunks[c].Len)
			}
		}
	}
	t := &Trainer{dev: dev, s: dev.DefaultStream(), opts: opts, layout: layout}
	if t.params, err = NewResident(dev, layout, opts.Precision); err != nil {
		return nil, err
	}
	if t.model, err = NewWith(dev, layout, opts.Batch, opts.Seq, opts.Activations); err != nil {
		t.Free()
		return nil, err
	}
	alloc := func(n int, dt gpu.DType, kind gpu.Kind, purpose string) (gpu.Buffer, error) {
		b, err := dev.Alloc(n, dt, gpu.Tag{Kind: kind, Purpose: purpose})
		if err != nil {
			return nil, fmt.Errorf("model: trainer %s: %w", purpose, err)
		}
		t.allocs = append(t.allocs, b)
		return b, nil
	}
	maxLen := 0
	for _, ch := range layout.Chunks {
		maxLen = max(maxLen, ch.Len)
		if opts.Precision.Half() {
			b, err := alloc(ch.Len, gpu.F32, gpu.ModelState, "master")
			if err != nil {
				t.Free()
				return nil, err
			}
			t.master = append(t.master, b)
		}
		m, err := alloc(ch.Len, gpu.F32, gpu.ModelState, "adam m")
		if err != nil {
			t.Free()
			return nil, err
		}
		v, err := alloc(ch.Len, gpu.F32, gpu.ModelState, "adam v")
		if err != nil {
			t.Free()
			return nil, err
		}
		t.adamM, t.adamV = append(t.adamM, m), append(t.adamV, v)
	}
	for r := 1; r < opts.Ranks; r++ {
		var gs []gpu.Buffer
		for _, ch := range layout.Chunks {
			g, err := alloc(ch.Len, opts.Precision, gpu.ModelState, fmt.Sprintf("grad rank %d", r))
			if err != nil {
				t.Free()
				return nil, err
			}
			gs = append(gs, g)
		}
		t.rankGrd = append(t.rankGrd, gs)
	}
	if opts.Ranks > 1 {
		if t.sumBuf, err = alloc(maxLen, gpu.F32, gpu.Workspace, "grad reduction"); err != nil {
			t.Free()
			return nil, err
		}
	}
	if t.norms, err = alloc(len(layout.Chunks), gpu.F64, gpu.Workspace, "grad norms"); err != nil {
		t.Free()
		return nil, err
	}
	t.normsH = make([]byte, 8*len(layout.Chunks))

	init := opts.Init
	if init == nil {
		init = layout.Init(opts.Seed)
	}
	t.params.Load(t.s, init)
	for c := range t.master {
		upload(dev, t.s, t.master[c], init[c])
	}
	if err := t.s.Synchronize(); err != nil {
		t.Free()
		return nil, fmt.Errorf("model: trainer initialisation: %w", err)
	}
	return t, nil
}

// Free releases all device memory; no step may be running.
func (t *Trainer) Free() {
	if t.model != nil {
		t.model.Free()
		t.model = nil
	}
	if t.params != nil {
		t.params.Free()
		t.params = nil
	}
	for _, b := range t.allocs {
		t.dev.Free(b)
	}
	t.allocs = nil
}

// Options returns the options in use, defaults filled.
func (t *Trainer) Options() TrainOptions { return t.opts }

// Layout returns the parameter layout.
func (t *Trainer) Layout() *Layout { return t.layout }

// Model returns the model (its activations).
func (t *Trainer) Model() *Model { return t.model }

// Resident returns the device parameters and (rank 0's) gradients.
func (t *Trainer) Resident() *Resident { return t.params }

// Stream returns the stream every step runs on.
func (t *Trainer) Stream() gpu.Stream { return t.s }

// rankParams gives virtual rank r > 0 its own gradient buffers.
type rankParams struct {
	*Resident
	grads []gpu.Buffer
}

func (p rankParams) Grad(_ gpu.Stream, c int) (gpu.Buffer, error) { return p.grads[c], nil }

// ErrNonFinite says a step produced a NaN or infinite loss or gradient; the
// parameters were not updated.
var ErrNonFinite = errors.New("model: non-finite loss or gradient")

// Step runs one optimizer step on the step's global batch from data: for
// each rank r in order, micro-batches data.RankBatch(i, r, k, Accum, Batch)
// for k = 0..Accum-1, where i = StepResult.Step - 1 is the 0-based step
// index; each backward is scaled by 1/(Ranks·Accum) so that the gradient is
// that of the mean loss over the global batch.
func (t *Trainer) Step(data *Sampler) (StepResult, error) {
	if data.Seq() != t.opts.Seq {
		panic(fmt.Sprintf("model: sampler seq %d, trainer seq %d", data.Seq(), t.opts.Seq))
	}
	o, s, ops := t.opts, t.s, t.dev.Ops()
	step := t.step + 1
	res := StepResult{Step: step, LR: o.LR, ClipCoef: 1}
	if o.Schedule != nil {
		res.LR = o.Schedule(step)
	}
	scale := float32(1 / float64(o.Ranks*o.Accum))
	for r := 0; r < o.Ranks; r++ {
		var p Params = t.params
		grads := t.params.grads
		if r > 0 {
			grads = t.rankGrd[r-1]
			p = rankParams{t.params, grads}
		}
		for _, g := range grads {
			ops.Fill(s, g, 0)
		}
		for k := 0; k < o.Accum; k++ {
			b, err := data.RankBatch(int(step-1), r, k, o.Accum, o.Batch)
			if err != nil {
				return res, fmt.Errorf("model: step %d: %w", step, err)
			}
			if err := t.model.Forward(s, p, b); err != nil {
				return res, fmt.Errorf("model: step %d: %w", step, err)
			}
			if err := t.model.Backward(s, p, scale); err != nil {
				return res, fmt.Errorf("model: step %d: %w", step, err)
			}
		}
	}

	// Sum the virtual ranks' gradients into rank 0's, in rank order, in fp32.
	if o.Ranks > 1 {
		for c, g0 := range t.params.grads {
			acc := t.sumBuf.Slice(0, g0.Len())
			ops.Cast(s, acc, g0)
			for r := 1; r < o.Ranks; r++ {
				ops.Axpy(s, 1, t.rankGrd[r-1][c], acc)
			}
			ops.Cast(s, g0, acc)
		}
	}

	for c, g := range t.params.grads {
		ops.SumSquares(s, g, t.norms, c)
	}
	t.dev.CopyDeviceToHost(s, t.normsH, t.norms, 0)
	losses, err := t.model.Losses(s) // synchronizes s: the norms are in too
	if err != nil {
		return res, fmt.Errorf("model: step %d: %w", step, err)
	}
	var lossSum float64
	aux := t.model.RouterLosses()
	for i, l := range losses {
		if aux != nil {
			l = t.model.layout.Shape.Objective(l, aux[i])
		}
		lossSum += l
	}
	res.Loss = lossSum / float64(len(losses))
	var sq float64
	for _, v := range f64View(t.normsH) {
		sq += v
	}
	res.GradNorm = math.Sqrt(sq)
	if math.IsNaN(res.Loss) || math.IsInf(res.Loss, 0) || math.IsNaN(res.GradNorm) || math.IsInf(res.GradNorm, 0) {
		return res, fmt.Errorf("%w: step %d loss %v grad norm %v", ErrNonFinite, step, res.Loss, res.GradNorm)
	}
	if o.ClipNorm > 0 && res.GradNorm > o.ClipNorm {
		res.ClipCoef = o.ClipNorm / (res.GradNorm + 1e-6) // torch.nn.utils.clip_grad_norm_
	}

	ap := gpu.AdamParams{LR: res.LR, Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps, WeightDecay: o.WeightDecay, Step: step, GradScale: res.ClipCoef}
	for c := range t.layout.Chunks {
		if o.Precision.Half() {
			ops.AdamStep(s, t.master[c], t.params.grads[c], t.adamM[c], t.adamV[c], t.params.params[c], ap)
		} else {
			ops.AdamStep(s, t.params.params[c], t.params.grads[c], t.adamM[c], t.adamV[c], nil, ap)
		}
	}
	if err := s.Synchronize(); err != nil {
		return res, fmt.Errorf("model: step %d optimizer: %w", step, err)
	}
	t.step = step
	return res, nil
}

// Master synchronizes and returns the fp32 weights the optimizer updates
// (the parameters themselves in fp32 mode), one []float32 per chunk.
func (t *Trainer) Master() ([][]float32, error) {
	if t.opts.Precision.Half() {
		return download(t.dev, t.s, t.master)
	}
	return download(t.dev, t.s, t.params.params)
}

// Train runs steps optimizer steps of a fresh Trainer on dev and returns the
// loss of each step.
func Train(dev gpu.Device, shape Shape, data *Sampler, opts TrainOptions, steps int) ([]float64, error) {
	t, err := NewTrainer(dev, shape, opts)
	if err != nil {
		return nil, err
	}
	defer t.Free()
	losses := make([]float64, 0, steps)
	for i := 0; i < steps; i++ {
		r, err := t.Step(data)
		if err != nil {
			return losses, err
		}
		losses = append(losses, r.Loss)
	}
	return losses, nil
}
