package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// TestTrainLlamaLossDrops: the plain loop trains the named tiny-llama
// (grouped-query attention, untied head) and tiny-qwen2 (biases) shapes
// from about ln 256 to below 1.5 within 40 steps on the repeated verse
// (they reach about 0.45-0.5), in fp32 and in bf16 mixed precision.
func TestTrainLlamaLossDrops(t *testing.T) {
	const steps, target = 40, 1.5
	for _, name := range []string{"tiny-llama", "tiny-qwen2"} {
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
			t.Run(name+"/"+dt.String(), func(t *testing.T) {
				shape, err := Lookup(name)
				if err != nil {
					t.Fatal(err)
				}
				dev := newDevice(t)
				data, err := NewSampler(Encode([]byte(repetitiveText)), 32, 7)
				if err != nil {
					t.Fatal(err)
				}
				losses, err := Train(dev, shape, data, TrainOptions{Batch: 4, Seq: 32, Precision: dt, LR: 1e-2, ClipNorm: 1, Seed: 1}, steps)
				if err != nil {
					t.Fatal(err)
				}
				first, last := losses[0], losses[len(losses)-1]
				t.Logf("%s %s: loss %.3f -> %.3f (%d steps)", name, dt, first, last, steps)
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
}

// passResult is one Forward and Backward's loss and gradients.
type passResult struct {
	loss  float64
	grads [][]float32
}

// onePass runs Forward and Backward (scale 1) of b on params, fp32.
func onePass(t *testing.T, l *Layout, params [][]float32, b Batch) passResult {
	t.Helper()
	dev := newDevice(t)
	s := dev.DefaultStream()
	res, err := NewResident(dev, l, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	res.Load(s, params)
	res.ZeroGrads(s)
	m, err := New(dev, l, b.Rows, b.Seq)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if err := m.Forward(s, res, b); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(s, res, 1); err != nil {
		t.Fatal(err)
	}
	var r passResult
	if r.loss, err = m.Loss(s); err != nil {
		t.Fatal(err)
	}
	if r.grads, err = res.ReadGrads(s); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPackedRowsKeepExamplesApart: example B (5 tokens) packed after
// example A (3 tokens) in one row, with A's targets ignored, has the loss
// and the gradient of B alone at the start of a row (the rest of the rows
// ignored): its positions restart and its attention does not reach A.
// Tolerance: 1e-5 relative for the loss and 1e-5 of the largest gradient
// (the same fp32 sums, in a different place of the GEMMs: a few roundings
// apart); A leaking into B moves them by far more.
func TestPackedRowsKeepExamplesApart(t *testing.T) {
	const seq = 8
	rng := rand.New(rand.NewPCG(8, 8))
	for _, shape := range []Shape{checkShape, checkLlama, checkQwen2} {
		t.Run(shape.ArchName(), func(t *testing.T) {
			l, err := NewLayout(shape)
			if err != nil {
				t.Fatal(err)
			}
			params := perturbedParams(l, 4)
			a, bIDs, bTargets := randomTokens(rng, 3, 256), randomTokens(rng, 5, 256), randomTokens(rng, 5, 256)
			other := randomTokens(rng, seq, 256)
			ignored := func(n int) []int32 {
				v := make([]int32, n)
				for i := range v {
					v[i] = IgnoreTarget
				}
				return v
			}
			packed := Batch{Rows: 2, Seq: seq,
				IDs:     append(append(append([]int32{}, a...), bIDs...), other...),
				Targets: append(append(ignored(3), bTargets...), ignored(seq)...),
				Pos:     []int32{0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7}}
			alone := Batch{Rows: 2, Seq: seq,
				IDs:     append(append(append([]int32{}, bIDs...), a...), other...),
				Targets: append(append(append([]int32{}, bTargets...), ignored(3)...), ignored(seq)...)}
			p, q := onePass(t, l, params, packed), onePass(t, l, params, alone)
			if math.Abs(p.loss-q.loss) > 1e-5*q.loss {
				t.Errorf("loss of B packed after A %.7f, alone %.7f", p.loss, q.loss)
			}
			var scale, worst float64
			for c := range q.grads {
				for i := range q.grads[c] {
					scale = math.Max(scale, math.Abs(float64(q.grads[c][i])))
				}
			}
			for c := range q.grads {
				for i := range q.grads[c] {
					worst = math.Max(worst, math.Abs(float64(p.grads[c][i]-q.grads[c][i])))
				}
			}
			if worst > 1e-5*scale || scale == 0 {
				t.Errorf("gradients differ by %.3g (largest %.3g)", worst, scale)
			}
		})
	}
}

// TestNoTargetMicroBatch: a micro-batch whose targets are all IgnoreTarget
// has loss 0 and adds exactly zero to every gradient.
func TestNoTargetMicroBatch(t *testing.T) {
	for _, shape := range []Shape{checkShape, checkLlama} {
		l, _ := NewLayout(shape)
		rng := rand.New(rand.NewPCG(2, 2))
		b := Batch{Rows: 2, Seq: 6, IDs: randomTokens(rng, 12, 256), Targets: make([]int32, 12)}
		for i := range b.Targets {
			b.Targets[i] = IgnoreTarget
		}
		r := onePass(t, l, perturbedParams(l, 1), b)
		if r.loss != 0 {
			t.Errorf("%s: loss %v, want 0", shape.ArchName(), r.loss)
		}
		for c, g := range r.grads {
			for i, x := range g {
				if x != 0 {
					t.Fatalf("%s: chunk %d gradient %d is %v, want 0", shape.ArchName(), c, i, x)
				}
			}
		}
	}
}

// TestForwardRefusesBadPositions: positions that do not restart at 0 and
// count up by one within an example, and targets below IgnoreTarget, are
// refused naming the token.
func TestForwardRefusesBadPositions(t *testing.T) {
	dev := newDevice(t)
	l, _ := NewLayout(checkLlama)
	res, err := NewResident(dev, l, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	m, err := New(dev, l, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	ids := []int32{1, 2, 3, 4}
	for _, b := range []Batch{
		{IDs: ids, Targets: ids, Pos: []int32{1, 2, 3, 4}},
		{IDs: ids, Targets: ids, Pos: []int32{0, 1, 3, 4}},
		{IDs: ids, Targets: ids, Pos: []int32{0, 1}},
		{IDs: ids, Targets: []int32{1, -2, 3, 4}},
		{Rows: 2, Seq: 2, IDs: ids, Targets: ids},
	} {
		if msg := catchPanic(func() { m.Forward(dev.DefaultStream(), res, b) }); msg == "" {
			t.Errorf("batch %+v accepted", b)
		}
	}
}

func catchPanic(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = r.(string)
		}
	}()
	f()
	return ""
}
