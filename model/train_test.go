package model

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
)

// repetitiveText is a short verse repeated: a model that learns its bytes
// predicts most of them, so the loss falls far below the ln 256 ≈ 5.55 of
// a uniform guess.
var repetitiveText = strings.Repeat("the quick brown fox jumps over the lazy dog; ", 40)

// trainShape is tiny on purpose: the test runs under -race on a busy
// 2-core machine.
var trainShape = Shape{Name: "train-test", Layers: 2, Dim: 32, Heads: 4, Vocab: ByteVocab, MaxSeq: 32}

func trainOpts(dt gpu.DType) TrainOptions {
	return TrainOptions{Batch: 4, Seq: 32, Precision: dt, LR: 1e-2, ClipNorm: 1, Seed: 1}
}

// TestTrainLossDrops: the plain loop takes the loss from about ln 256 to
// below 2.0 within 30 steps (it reaches about 1.1-1.2), in fp32 and in bf16 mixed precision.
func TestTrainLossDrops(t *testing.T) {
	const steps, target = 30, 2.0
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			dev := newDevice(t)
			data, err := NewSampler(Encode([]byte(repetitiveText)), 32, 7)
			if err != nil {
				t.Fatal(err)
			}
			losses, err := Train(dev, trainShape, data, trainOpts(dt), steps)
			if err != nil {
				t.Fatal(err)
			}
			first, last := losses[0], losses[len(losses)-1]
			t.Logf("%s: loss %.3f -> %.3f (%d steps)", dt, first, last, steps)
			if math.Abs(first-math.Log(256)) > 0.2 {
				t.Errorf("first loss %.3f, want about ln 256 = %.3f", first, math.Log(256))
			}
			if last > target {
				t.Errorf("loss after %d steps %.3f, want below %.1f; losses %.3f", steps, last, target, losses)
			}
			if n := dev.MemStats().InUseBytes; n != 0 {
				t.Errorf("Train left %d bytes allocated", n)
			}
		})
	}
}

// TestTrainerRanksSumInRankOrder: with Ranks = 2 the step's gradient is
// rank 0's plus rank 1's, each the gradient of its own micro-batch scaled
// by 1/2, added in fp32 and rounded once: bit for bit what the model gives
// for the two micro-batches separately, summed on the host the same way.
func TestTrainerRanksSumInRankOrder(t *testing.T) {
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			dev := newDevice(t)
			data, _ := NewSampler(Encode([]byte(repetitiveText)), 16, 3)
			opts := TrainOptions{Batch: 2, Seq: 16, Ranks: 2, Precision: dt, LR: 1e-3, Seed: 4}
			tr, err := NewTrainer(dev, trainShape, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Free()
			res, err := tr.Step(data)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tr.Resident().ReadGrads(tr.Stream())
			if err != nil {
				t.Fatal(err)
			}

			// The two ranks' gradients, computed one at a time from the init.
			l := tr.Layout()
			s := dev.DefaultStream()
			ref, err := NewResident(dev, l, dt)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Free()
			ref.Load(s, l.Init(opts.Seed))
			m, err := NewWith(dev, l, 2, 16, tr.Options().Activations)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			var rankGrads [2][][]float32
			var lossSum float64
			for r := 0; r < 2; r++ {
				b, err := data.RankBatch(0, r, 0, 1, 2)
				if err != nil {
					t.Fatal(err)
				}
				ref.ZeroGrads(s)
				if err := m.Forward(s, ref, b); err != nil {
					t.Fatal(err)
				}
				if err := m.Backward(s, ref, 0.5); err != nil {
					t.Fatal(err)
				}
				loss, err := m.Loss(s)
				if err != nil {
					t.Fatal(err)
				}
				lossSum += loss
				if rankGrads[r], err = ref.ReadGrads(s); err != nil {
					t.Fatal(err)
				}
			}
			if res.Loss != lossSum/2 {
				t.Errorf("step loss %v, mean of the ranks' losses %v", res.Loss, lossSum/2)
			}
			var sq float64
			for c := range got {
				for i := range got[c] {
					want := rankGrads[0][c][i] + rankGrads[1][c][i]
					if dt == gpu.BF16 {
						want = bf16.Round(want)
					}
					if math.Float32bits(got[c][i]) != math.Float32bits(want) {
						t.Fatalf("chunk %d [%d]: step gradient %v, rank sum %v", c, i, got[c][i], want)
					}
					sq += float64(want) * float64(want)
				}
			}
			if math.Abs(res.GradNorm-math.Sqrt(sq)) > 1e-12*math.Sqrt(sq) {
				t.Errorf("grad norm %v, want %v", res.GradNorm, math.Sqrt(sq))
			}
		})
	}
}

// TestTrainerMatchesAdamOnHost: one step's parameters are the init updated
// by cpuadam's formula (AdamW, first step) from the step's gradient, checked
// here against a float64 evaluation of that formula: on step 1,
// m̂/√v̂ = g/|g| so every parameter moves by lr·sign(g) (up to eps), and
// clipping scales g without changing its sign.
func TestTrainerMatchesAdamOnHost(t *testing.T) {
	dev := newDevice(t)
	data, _ := NewSampler(Encode([]byte(repetitiveText)), 16, 3)
	opts := TrainOptions{Batch: 2, Seq: 16, LR: 1e-3, ClipNorm: 1e-3, WeightDecay: 0.1, Seed: 4}
	tr, err := NewTrainer(dev, trainShape, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	init := tr.Layout().Init(opts.Seed)
	res, err := tr.Step(data)
	if err != nil {
		t.Fatal(err)
	}
	if !(res.ClipCoef < 1) || res.GradNorm <= opts.ClipNorm {
		t.Fatalf("clip coefficient %v at grad norm %v with clip %v", res.ClipCoef, res.GradNorm, opts.ClipNorm)
	}
	grads, _ := tr.Resident().ReadGrads(tr.Stream())
	got, err := tr.Master()
	if err != nil {
		t.Fatal(err)
	}
	for c := range got {
		for i, x := range got[c] {
			g := float64(grads[c][i]) * res.ClipCoef
			want := float64(init[c][i]) * (1 - opts.LR*opts.WeightDecay)
			if g != 0 {
				want -= opts.LR * g / (math.Abs(g) + 1e-8)
			}
			// fp32 arithmetic on values of order 0.02..1: a few ulp.
			if math.Abs(float64(x)-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("chunk %d [%d]: param %v, Adam step from %v with grad %v gives %v", c, i, x, init[c][i], g, want)
			}
		}
	}
}

func TestTrainOptionsValidate(t *testing.T) {
	s := trainShape
	bad := []TrainOptions{
		{Seq: s.MaxSeq + 1},
		{Precision: gpu.I32},
		{LR: -1},
		{Beta2: 1},
		{ClipNorm: -1},
		{Batch: -1},
	}
	for _, o := range bad {
		if err := o.WithDefaults(s).Validate(s); err == nil {
			t.Errorf("%v accepted", o.WithDefaults(s))
		}
	}
	if err := (TrainOptions{}).WithDefaults(s).Validate(s); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

func TestTrainerReportsNonFinite(t *testing.T) {
	dev := newDevice(t)
	data, _ := NewSampler(Encode([]byte(repetitiveText)), 16, 3)
	tr, err := NewTrainer(dev, trainShape, TrainOptions{Batch: 1, Seq: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	s := tr.Stream()
	dev.Ops().Fill(s, tr.Resident().Param(BlockChunk(0)), float32(math.Inf(1)))
	before, _ := tr.Master()
	if _, err := tr.Step(data); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("step with infinite weights: %v, want ErrNonFinite", err)
	}
	after, _ := tr.Master()
	if !equalBits(before[0], after[0]) {
		t.Error("a failed step changed the parameters")
	}
}

func equalBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestTrainDeterministic: two runs with the same seed and data give the
// same losses and parameters, bit for bit (the CPU backend's reductions
// have a fixed order whatever its worker count).
func TestTrainDeterministic(t *testing.T) {
	run := func() ([]float64, [][]float32) {
		dev := newDevice(t)
		data, _ := NewSampler(Encode([]byte(repetitiveText)), 16, 9)
		tr, err := NewTrainer(dev, trainShape, TrainOptions{Batch: 2, Seq: 16, Accum: 2, Precision: gpu.BF16, LR: 1e-2, ClipNorm: 1, Seed: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Free()
		var losses []float64
		for range 3 {
			r, err := tr.Step(data)
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, r.Loss)
		}
		p, err := tr.Master()
		if err != nil {
			t.Fatal(err)
		}
		return losses, p
	}
	l1, p1 := run()
	l2, p2 := run()
	if !slices.Equal(l1, l2) {
		t.Fatalf("losses %v then %v", l1, l2)
	}
	for c := range p1 {
		if !equalBits(p1[c], p2[c]) {
			t.Fatalf("chunk %d differs between two identical runs", c)
		}
	}
}
