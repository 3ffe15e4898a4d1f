package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// decoderShapes are the architectures the key/value cache is checked on:
// GPT-2 (learned positions: the cache's rows must meet wpe at the right
// position), Llama with grouped-query attention and an untied head, and
// Qwen2 with q/k/v biases, one key/value head and a tied head. MaxSeq 96
// lets a prompt cross the CPU backend's 64-row attention tiles.
var decoderShapes = []Shape{
	{Name: "gpt2-kv", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 96},
	{Name: "llama-kv", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 96, Arch: ArchLlama, KVHeads: 2, FFN: 48, RopeTheta: 10000},
	{Name: "qwen2-kv", Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 96, Arch: ArchQwen2, KVHeads: 1, FFN: 48, RopeTheta: 1e6, NormEps: 1e-6, TieEmbeddings: true},
}

// forwardLogits runs the training forward (Model.Forward) on ids as one
// row and returns every position's logits.
func forwardLogits(t *testing.T, dev gpu.Device, l *Layout, p Params, ids []int32) []float32 {
	t.Helper()
	s := dev.DefaultStream()
	m, err := New(dev, l, 1, len(ids))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	targets := make([]int32, len(ids))
	for i := range targets {
		targets[i] = IgnoreTarget
	}
	if err := m.Forward(s, p, Batch{Rows: 1, Seq: len(ids), IDs: ids, Targets: targets}); err != nil {
		t.Fatal(err)
	}
	out, err := download(dev, s, []gpu.Buffer{m.a.logits})
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// argmax is the first index of the largest value, and the gap to the
// second largest.
func argmax(v []float32) (int32, float32) {
	best, second := 0, -1
	for i := 1; i < len(v); i++ {
		switch {
		case v[i] > v[best]:
			best, second = i, best
		case second < 0 || v[i] > v[second]:
			second = i
		}
	}
	return int32(best), v[best] - v[second]
}

// loadWeights puts params into fp32 Weights on dev.
func loadWeights(t *testing.T, dev gpu.Device, l *Layout, params [][]float32) *Weights {
	t.Helper()
	w, err := NewWeights(dev, l, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	s := dev.DefaultStream()
	for c, v := range params {
		w.LoadChunk(s, c, v)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return w
}

// decodeTol bounds max|cache - forward| / max|forward| of the logits. Both
// paths run the same fp32 ops in the same order per element except the
// GEMMs' and attention's blocking over rows (a 1-row GEMM against a
// 67-row one, cached attention tiles against the training forward's):
// differences of a few fp32 ulps of the largest terms, about 1e-7
// relative, compounded over two blocks. 1e-5 is a hundred times that; a
// wrong position, rotation, mask or cache row is off by more than 1e-2.
// (Measured on the CPU backend: 0, the same bits: its GEMM and attention
// tiles give each element the same sums whatever the row count.)
const decodeTol = 1e-5

// TestDecoderMatchesForward generates greedily with the key/value cache
// (the prompt of 67 tokens in one Step, then one token a Step) and, at
// every step, runs the whole sequence so far through Model.Forward: the
// next-token logits agree within decodeTol, and the greedy tokens are the
// full-recompute greedy tokens (each step's choice is the argmax of the
// full forward's logits).
func TestDecoderMatchesForward(t *testing.T) {
	const prompt, steps = 67, 14
	for i, s := range decoderShapes {
		t.Run(s.ArchName(), func(t *testing.T) {
			l, err := NewLayout(s)
			if err != nil {
				t.Fatal(err)
			}
			dev := newDevice(t)
			st := dev.DefaultStream()
			w := loadWeights(t, dev, l, perturbedParams(l, uint64(30+i)))
			defer w.Free()
			d, err := NewDecoder(dev, l, DecoderOptions{Capacity: prompt + steps, MaxStep: prompt})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free()
			seq := randomTokens(rand.New(rand.NewPCG(uint64(i), 5)), prompt, s.Vocab)
			logits, err := d.Step(st, w, seq)
			if err != nil {
				t.Fatal(err)
			}
			var worst float64
			minGap := float32(math.Inf(1))
			for step := range steps {
				full := forwardLogits(t, dev, l, w, seq)
				want := full[(len(seq)-1)*s.Vocab:]
				e := maxRelErr(logits, want)
				worst = math.Max(worst, e)
				if !(e <= decodeTol) {
					t.Fatalf("step %d (position %d): logits differ from the full forward's by %.3g relative (tolerance %g)", step, len(seq), e, decodeTol)
				}
				next, _ := argmax(logits)
				ref, gap := argmax(want)
				minGap = min(minGap, gap)
				if next != ref {
					t.Fatalf("step %d: the cache's greedy token is %d, the full recompute's %d", step, next, ref)
				}
				seq = append(seq, next)
				if step == steps-1 {
					break
				}
				if logits, err = d.Step(st, w, []int32{next}); err != nil {
					t.Fatal(err)
				}
			}
			if d.Len() != prompt+steps-1 {
				t.Errorf("Len %d after the prompt and %d tokens, want %d", d.Len(), steps-1, prompt+steps-1)
			}
			t.Logf("%s: %d steps; max relative logit error %.2e; smallest top-2 gap %.3g", s.ArchName(), steps, worst, minGap)
		})
	}
}

// TestDecoderScoreMatchesForward scores a row with ignored targets in
// blocks of 16 head rows: each row's logits and the mean loss equal
// Model.Forward's and Model.Loss's (tolerance decodeTol, and 1e-6
// relative for the loss: a mean of 69 per-token losses, each within a
// few ulps), and a second Score after Reset gives the same bits.
func TestDecoderScoreMatchesForward(t *testing.T) {
	const n = 70
	for i, s := range decoderShapes {
		t.Run(s.ArchName(), func(t *testing.T) {
			l, err := NewLayout(s)
			if err != nil {
				t.Fatal(err)
			}
			dev := newDevice(t)
			st := dev.DefaultStream()
			w := loadWeights(t, dev, l, perturbedParams(l, uint64(40+i)))
			defer w.Free()
			rng := rand.New(rand.NewPCG(uint64(i), 6))
			ids, targets := randomTokens(rng, n, s.Vocab), randomTokens(rng, n, s.Vocab)
			targets[3], targets[n-1] = IgnoreTarget, IgnoreTarget

			m, err := New(dev, l, 1, n)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			if err := m.Forward(st, w, Batch{Rows: 1, Seq: n, IDs: ids, Targets: targets}); err != nil {
				t.Fatal(err)
			}
			want, err := download(dev, st, []gpu.Buffer{m.a.logits})
			if err != nil {
				t.Fatal(err)
			}
			wantLoss, err := m.Loss(st)
			if err != nil {
				t.Fatal(err)
			}

			d, err := NewDecoder(dev, l, DecoderOptions{Capacity: n, HeadRows: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free()
			var got []float32
			sum, counted, err := d.Score(st, w, ids, targets, func(row int, v []float32) {
				if row*s.Vocab != len(got) {
					t.Fatalf("row %d after %d values", row, len(got))
				}
				got = append(got, v...)
			})
			if err != nil {
				t.Fatal(err)
			}
			e := maxRelErr(got, want[0])
			if !(e <= decodeTol) {
				t.Errorf("logits differ from the forward's by %.3g relative (tolerance %g)", e, decodeTol)
			}
			t.Logf("%s: logits %.2e relative, mean loss %.2e relative", s.ArchName(), e, math.Abs(sum/float64(counted)-wantLoss)/wantLoss)
			if counted != n-2 {
				t.Errorf("%d tokens counted, want %d", counted, n-2)
			}
			if loss := sum / float64(counted); !(math.Abs(loss-wantLoss) <= 1e-6*wantLoss) {
				t.Errorf("mean loss %.9g, the forward's %.9g", loss, wantLoss)
			}
			d.Reset()
			sum2, _, err := d.Score(st, w, ids, targets, nil)
			if err != nil {
				t.Fatal(err)
			}
			if sum2 != sum {
				t.Errorf("a second Score after Reset gives %v, the first %v", sum2, sum)
			}
		})
	}
}

// TestDecoderBytesMatchesDevice: the device's activation bytes after
// NewDecoder are DecoderBytes, and Weights take WeightsBytes of model state.
func TestDecoderBytesMatchesDevice(t *testing.T) {
	for _, s := range decoderShapes {
		l, err := NewLayout(s)
		if err != nil {
			t.Fatal(err)
		}
		dev := newDevice(t)
		o := DecoderOptions{Capacity: 80, MaxStep: 33, HeadRows: 7}
		d, err := NewDecoder(dev, l, o)
		if err != nil {
			t.Fatal(err)
		}
		w, err := NewWeights(dev, l, gpu.BF16)
		if err != nil {
			t.Fatal(err)
		}
		ms := dev.MemStats()
		if got, want := ms.InUseByKind[gpu.Activation], DecoderBytes(s, o); got != want {
			t.Errorf("%s: %d activation bytes in use, DecoderBytes %d", s.ArchName(), got, want)
		}
		if got, want := ms.InUseByKind[gpu.ModelState], WeightsBytes(l, gpu.BF16); got < want || got > want+int64(64*len(l.Chunks)) {
			t.Errorf("%s: %d model-state bytes in use, WeightsBytes %d (+ at most 64 per chunk of granularity)", s.ArchName(), got, want)
		}
		d.Free()
		w.Free()
	}
}

// TestDecoderRefuses: too many tokens, a token outside the vocabulary and
// a full cache are errors that leave the cache as it was; the Weights
// give no gradient.
func TestDecoderRefuses(t *testing.T) {
	s := decoderShapes[1]
	l, err := NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	dev := newDevice(t)
	st := dev.DefaultStream()
	w := loadWeights(t, dev, l, l.Init(1))
	defer w.Free()
	if _, err := NewDecoder(dev, l, DecoderOptions{Capacity: s.MaxSeq + 1}); err == nil || !strings.Contains(err.Error(), "max_seq_len") {
		t.Errorf("capacity past max_seq_len: %v", err)
	}
	d, err := NewDecoder(dev, l, DecoderOptions{Capacity: 6, MaxStep: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	for _, c := range []struct {
		ids  []int32
		want string
	}{
		{[]int32{1, 2, 3, 4, 5}, "at most 4"},
		{[]int32{1, 256}, "outside the vocabulary"},
		{nil, "no tokens"},
	} {
		if _, err := d.Step(st, w, c.ids); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Step(%v): %v, want an error saying %q", c.ids, err, c.want)
		}
	}
	if d.Len() != 0 {
		t.Errorf("refused steps moved the cache to %d", d.Len())
	}
	if _, err := d.Step(st, w, []int32{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Step(st, w, []int32{5, 6, 7}); err == nil || !strings.Contains(err.Error(), "capacity of 6") {
		t.Errorf("past the capacity: %v", err)
	}
	if _, _, err := d.Score(st, w, []int32{5}, nil, nil); err == nil || !strings.Contains(err.Error(), "0 targets") {
		t.Errorf("Score without targets: %v", err)
	}
	if d.Len() != 4 {
		t.Errorf("Len %d, want 4", d.Len())
	}
	if _, err := w.Grad(st, 0); !errors.Is(err, ErrNoGradients) {
		t.Errorf("Weights.Grad: %v", err)
	}
}
