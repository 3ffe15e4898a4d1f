package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
)

// TrainStepOptions configure the one-device training-step benchmark: the
// plain loop (model.Trainer) on the CPU backend, the baseline the ZeRO
// engine is compared with.
type TrainStepOptions struct {
	Shape     string    // a named model shape; default "gpt2" (124M)
	Batch     int       // sequences per step; default 1
	Seq       int       // tokens per sequence; default 128
	Precision gpu.DType // gpu.F32 (default) or gpu.BF16
	Steps     int       // measured steps after one warm-up step; default 2
	Workers   int       // CPU backend workers; 0: GOMAXPROCS
	Kernel    string    // CPU backend GEMM kernel (cpu.Options.Kernel); "" for its default
	HBMBytes  int64     // device budget; default 32 GiB (host memory is used only as allocated)
}

// WithDefaults fills the zero fields.
func (o TrainStepOptions) WithDefaults() TrainStepOptions {
	if o.Shape == "" {
		o.Shape = "gpt2"
	}
	if o.Batch == 0 {
		o.Batch = 1
	}
	if o.Seq == 0 {
		o.Seq = 128
	}
	if o.Precision == 0 {
		o.Precision = gpu.F32
	}
	if o.Steps == 0 {
		o.Steps = 2
	}
	if o.HBMBytes == 0 {
		o.HBMBytes = 32 * units.GiB
	}
	return o
}

// Validate says what is wrong with o (after WithDefaults).
func (o TrainStepOptions) Validate() error {
	s, err := model.Lookup(o.Shape)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	switch {
	case o.Batch < 1 || o.Seq < 1 || o.Steps < 1 || o.Workers < 0:
		return fmt.Errorf("bench: batch %d, seq %d, steps %d must be >= 1 and workers %d >= 0", o.Batch, o.Seq, o.Steps, o.Workers)
	case o.Seq > s.MaxSeq:
		return fmt.Errorf("bench: seq %d exceeds %s's max_seq_len %d", o.Seq, s.Name, s.MaxSeq)
	case o.Precision != gpu.F32 && o.Precision != gpu.BF16:
		return fmt.Errorf("bench: precision %s is not fp32 or bf16", o.Precision)
	}
	return nil
}

func (o TrainStepOptions) String() string {
	return fmt.Sprintf("shape=%s batch=%d seq=%d precision=%s steps=%d workers=%d kernel=%q hbm=%s",
		o.Shape, o.Batch, o.Seq, o.Precision, o.Steps, o.Workers, o.Kernel, units.FormatBytes(o.HBMBytes))
}

// TrainStepResult is what the benchmark measured.
type TrainStepResult struct {
	Options       TrainStepOptions
	Shape         model.Shape
	Workers       int
	Kernel        string  // the GEMM kernel the backend chose
	StepSeconds   float64 // mean over the measured steps
	TokensPerSec  float64
	StepFLOPs     float64 // 6·N·tokens + 12·L·C·T·tokens (N: params without wpe)
	StepGFLOPS    float64 // StepFLOPs / StepSeconds / 1e9
	GemmGFLOPS    float64 // the anchor: the backend's GEMM at the model's c_fc shape, forward and both backward forms, same run
	GemmForward   float64 // GFLOP/s of y = x·Wᵀ (B·T × 4C × C)
	GemmDX        float64 // GFLOP/s of dx = dy·W
	GemmDW        float64 // GFLOP/s of dW += dyᵀ·x
	Ratio         float64 // StepGFLOPS / GemmGFLOPS: the share of GEMM speed the whole step keeps
	Losses        []float64
	ModelState    int64 // measured peak bytes per kind on the device
	Activations   int64
	Workspace     int64
	ActivationFor int64 // model.ActivationBytesWith for the shape, batch, seq and the trainer's activations
}

func (r TrainStepResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "train step: %s, batch %d × seq %d, %s, cpu backend with %d workers, gemm kernel %s\n",
		r.Shape, r.Options.Batch, r.Options.Seq, r.Options.Precision, r.Workers, r.Kernel)
	fmt.Fprintf(&b, "  step %.3f s (mean of %d after a warm-up), %.0f tokens/s, %.1f GFLOP/s (%.1f GFLOP per step)\n",
		r.StepSeconds, r.Options.Steps, r.TokensPerSec, r.StepGFLOPS, r.StepFLOPs/1e9)
	fmt.Fprintf(&b, "  anchor: GEMM of c_fc (%d tokens, %d→%d) on the same device %.1f GFLOP/s (x·Wᵀ %.1f, dy·W %.1f, dyᵀ·x %.1f); step/GEMM = %.2f\n",
		r.Options.Batch*r.Options.Seq, r.Shape.Dim, 4*r.Shape.Dim, r.GemmGFLOPS, r.GemmForward, r.GemmDX, r.GemmDW, r.Ratio)
	fmt.Fprintf(&b, "  peak device bytes: model state %s, activations %s (model.ActivationBytesWith %s), workspace %s\n",
		units.FormatBytes(r.ModelState), units.FormatBytes(r.Activations), units.FormatBytes(r.ActivationFor), units.FormatBytes(r.Workspace))
	fmt.Fprintf(&b, "  losses %.4f", r.Losses)
	return b.String()
}

// TrainStep builds a model.Trainer for the named shape on one CPU-backend
// device, runs one warm-up step and Steps measured ones on random byte
// tokens, and measures the backend's GEMM at the model's c_fc shape
// (B·T tokens, C → 4C; forward and both backward forms) side by side as
// the anchor: step/GEMM is the share of pure-GEMM speed the whole step
// keeps (the rest: attention, layernorm, the 50257-way softmax, Adam).
func TrainStep(o TrainStepOptions) (TrainStepResult, error) {
	run, err := newTrainStepRun(o)
	if err != nil {
		return TrainStepResult{}, err
	}
	defer run.close()
	var measured time.Duration
	for i := 0; i <= run.o.Steps; i++ {
		d, err := run.step()
		if err != nil {
			return run.r, err
		}
		if i > 0 {
			measured += d
		}
	}
	return run.result(measured, run.o.Steps)
}

// trainStepRun is the set-up of TrainStep, built before any step is timed:
// the device, the sampler over random byte tokens, and the trainer.
type trainStepRun struct {
	o     TrainStepOptions // with defaults
	shape model.Shape
	dev   *cpu.Device
	data  *model.Sampler
	tr    *model.Trainer
	r     TrainStepResult // the losses so far
}

// newTrainStepRun validates o and builds the run; close frees it.
func newTrainStepRun(o TrainStepOptions) (*trainStepRun, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	shape, _ := model.Lookup(o.Shape)
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: o.HBMBytes, Workers: o.Workers, Kernel: o.Kernel})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	dev := devs[0]
	rng := rand.New(rand.NewPCG(1, 2))
	corpus := make([]byte, 1<<16)
	for i := range corpus {
		corpus[i] = byte(rng.IntN(model.ByteVocab))
	}
	data, err := model.NewSampler(model.Encode(corpus), o.Seq, 1)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	tr, err := model.NewTrainer(dev, shape, model.TrainOptions{Batch: o.Batch, Seq: o.Seq, Precision: o.Precision, LR: 1e-4, ClipNorm: 1, Seed: 1})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	dev.ResetPeak()
	return &trainStepRun{o: o, shape: shape, dev: dev, data: data, tr: tr,
		r: TrainStepResult{Options: o, Shape: shape, Workers: dev.Workers(), Kernel: dev.Kernel()}}, nil
}

func (t *trainStepRun) close() { t.tr.Free() }

// step runs one training step and returns how long it took.
func (t *trainStepRun) step() (time.Duration, error) {
	start := time.Now()
	res, err := t.tr.Step(t.data)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	d := time.Since(start)
	t.r.Losses = append(t.r.Losses, res.Loss)
	return d, nil
}

// result is the run's figures for steps measured steps that took measured
// in all: the peaks, the rates, and the GEMM anchor, measured now.
func (t *trainStepRun) result(measured time.Duration, steps int) (TrainStepResult, error) {
	r, o, shape := t.r, t.o, t.shape
	r.Options.Steps = steps
	ms := t.dev.MemStats()
	r.ModelState, r.Activations, r.Workspace = ms.PeakByKind[gpu.ModelState], ms.PeakByKind[gpu.Activation], ms.PeakByKind[gpu.Workspace]
	r.ActivationFor = model.ActivationBytesWith(shape, o.Batch, o.Seq, t.tr.Options().Activations)

	tokens := float64(o.Batch * o.Seq)
	n := float64(shape.ParamCount() - int64(shape.MaxSeq*shape.Dim))
	r.StepFLOPs = 6*n*tokens + 12*float64(shape.Layers*shape.Dim*o.Seq)*tokens
	r.StepSeconds = measured.Seconds() / float64(steps)
	r.TokensPerSec = tokens / r.StepSeconds
	r.StepGFLOPS = r.StepFLOPs / r.StepSeconds / 1e9

	var err error
	r.GemmForward, r.GemmDX, r.GemmDW, r.GemmGFLOPS, err = gemmRates(t.dev, o.Batch*o.Seq, shape.Dim, o.Precision, max(0.3, r.StepSeconds/6))
	if err != nil {
		return r, err
	}
	r.Ratio = r.StepGFLOPS / r.GemmGFLOPS
	return r, nil
}

// gemmRates measures the backend's GEMM at the c_fc layer of the step
// (rows = B·T tokens, C → 4C) in the three forms a linear layer's training
// runs: the forward y = x·Wᵀ, the input gradient dx = dy·W and the weight
// gradient dW += dyᵀ·x, with W in dt and everything else fp32. Each runs for
// at least minSeconds; all is their FLOP-weighted rate: 3 equal-FLOP GEMMs
// over the sum of their times.
func gemmRates(dev gpu.Device, rows, c int, dt gpu.DType, minSeconds float64) (fwd, dx, dw, all float64, err error) {
	var bufs []gpu.Buffer
	defer func() {
		for _, b := range bufs {
			dev.Free(b)
		}
	}()
	alloc := func(n int, dt gpu.DType) gpu.Buffer {
		if err != nil {
			return nil
		}
		var b gpu.Buffer
		if b, err = dev.Alloc(n, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "gemm anchor"}); err != nil {
			err = fmt.Errorf("bench: gemm anchor: %w", err)
			return nil
		}
		bufs = append(bufs, b)
		return b
	}
	x, w, y := alloc(rows*c, gpu.F32), alloc(4*c*c, dt), alloc(rows*4*c, gpu.F32)
	gw := alloc(4*c*c, dt)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	s, ops := dev.DefaultStream(), dev.Ops()
	ops.Fill(s, x, 0.5)
	ops.Fill(s, w, 0.25)
	ops.Fill(s, y, 0.125)
	flops := 2 * float64(rows) * float64(4*c) * float64(c)
	rate := func(run func()) (float64, float64, error) {
		run() // warm-up
		if err := s.Synchronize(); err != nil {
			return 0, 0, fmt.Errorf("bench: gemm anchor: %w", err)
		}
		reps := 0
		start := time.Now()
		for time.Since(start).Seconds() < minSeconds {
			run()
			if err := s.Synchronize(); err != nil {
				return 0, 0, fmt.Errorf("bench: gemm anchor: %w", err)
			}
			reps++
		}
		sec := time.Since(start).Seconds() / float64(reps)
		return flops / sec / 1e9, sec, nil
	}
	var t1, t2, t3 float64
	if fwd, t1, err = rate(func() { ops.Gemm(s, false, true, rows, 4*c, c, 1, x, w, 0, y) }); err != nil {
		return
	}
	if dx, t2, err = rate(func() { ops.Gemm(s, false, false, rows, c, 4*c, 1, y, w, 0, x) }); err != nil {
		return
	}
	if dw, t3, err = rate(func() { ops.Gemm(s, true, false, 4*c, c, rows, 1, y, x, 1, gw) }); err != nil {
		return
	}
	return fwd, dx, dw, 3 * flops / (t1 + t2 + t3) / 1e9, nil
}
