package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

func newDevice(t testing.TB) gpu.Device {
	t.Helper()
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 2 * units.GiB})
	if err != nil {
		t.Fatal(err)
	}
	return devs[0]
}

// checkShape is small enough for a float64 finite-difference sweep and has
// every feature: 2 layers, 2 heads, the full byte vocabulary.
var checkShape = Shape{Name: "check", Layers: 2, Dim: 16, Heads: 2, Vocab: 256, MaxSeq: 8}

// checkLlama has grouped-query attention (4 heads over 2 key/value heads
// of 4), an MLP width that is not 4C and an untied head; checkQwen2 adds
// the q, k, v biases and ties its head (as Qwen2-0.5B does).
var (
	checkLlama = Shape{Name: "check-llama", Layers: 2, Dim: 16, Heads: 4, Vocab: 256, MaxSeq: 8, Arch: ArchLlama, KVHeads: 2, FFN: 24, RopeTheta: 500}
	checkQwen2 = Shape{Name: "check-qwen2", Layers: 2, Dim: 16, Heads: 4, Vocab: 256, MaxSeq: 8, Arch: ArchQwen2, KVHeads: 1, FFN: 24, NormEps: 1e-6, TieEmbeddings: true}
)

// perturbedParams is the GPT-2 init plus N(0, 0.1) on every parameter, so
// that gains, biases and attention are far from their trivial values and
// every path carries gradient.
func perturbedParams(l *Layout, seed uint64) [][]float32 {
	p := l.Init(seed)
	rng := rand.New(rand.NewPCG(seed, 99))
	for _, ch := range p {
		for i := range ch {
			ch[i] += float32(0.1 * rng.NormFloat64())
		}
	}
	return p
}

func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
	}
	return ids
}

func widen(p [][]float32) [][]float64 {
	out := make([][]float64, len(p))
	for c, ch := range p {
		out[c] = make([]float64, len(ch))
		for i, x := range ch {
			out[c][i] = float64(x)
		}
	}
	return out
}

// gradCase is one whole-model gradient check: a shape and its batch.
type gradCase struct {
	name  string
	shape Shape
	batch Batch
}

// gradCases: GPT-2 with one example per row; GPT-2, Llama and Qwen2 with
// packed rows (examples of 2, 1 and 3 tokens restart the positions) and
// ignored targets.
func gradCases(rng *rand.Rand) []gradCase {
	const batch, seq = 2, 6
	plain := Batch{Rows: batch, Seq: seq, IDs: randomTokens(rng, batch*seq, 256), Targets: randomTokens(rng, batch*seq, 256)}
	packed := Batch{Rows: batch, Seq: seq, IDs: randomTokens(rng, batch*seq, 256), Targets: randomTokens(rng, batch*seq, 256),
		Pos: []int32{0, 1, 0, 0, 1, 2, 0, 1, 2, 3, 0, 1}}
	packed.Targets[1], packed.Targets[7] = IgnoreTarget, IgnoreTarget
	return []gradCase{
		{"gpt2", checkShape, plain},
		{"gpt2 packed", checkShape, packed},
		{"llama packed", checkLlama, packed},
		{"qwen2 packed", checkQwen2, packed},
		{"qwen2", checkQwen2, plain},
	}
}

// TestGradientCheckWholeModel compares the fp32 gradient of the whole model
// (every op's backward, wired by Backward) with central differences of a
// float64 reference forward, at a sample of parameters of every tensor,
// for each architecture, with packed rows and ignored targets.
//
// Tolerance: |analytic − numeric| <= 1e-3·|numeric| + 1e-4·max|numeric|.
// The numeric side is exact to ~1e-9 (h = 1e-4 in float64, error O(h²));
// the analytic side is fp32: every op rounds to 2^-24 relative and the
// longest accumulation (the head GEMM over 256 logits, attention over 6
// keys) adds a few units, so its error is about 1e-6 of the gradient
// scale. The bound leaves two orders of magnitude of margin while a wrong
// transpose, a missing term or a wrong scale gives errors of order one.
func TestGradientCheckWholeModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, gc := range gradCases(rng) {
		t.Run(gc.name, func(t *testing.T) { gradientCheck(t, gc, rng) })
	}
}

func gradientCheck(t *testing.T, gc gradCase, rng *rand.Rand) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	l, err := NewLayout(gc.shape)
	if err != nil {
		t.Fatal(err)
	}
	batch, seq := gc.batch.Rows, gc.batch.Seq
	p32 := perturbedParams(l, 3)

	res, err := NewResident(dev, l, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	res.Load(s, p32)
	res.ZeroGrads(s)
	m, err := New(dev, l, batch, seq)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if err := m.Forward(s, res, gc.batch); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(s, res, 1); err != nil {
		t.Fatal(err)
	}
	loss, err := m.Loss(s)
	if err != nil {
		t.Fatal(err)
	}
	grads, err := res.ReadGrads(s)
	if err != nil {
		t.Fatal(err)
	}

	p64 := widen(p32)
	want := refLoss(l, p64, gc.batch, batch, seq)
	if math.Abs(loss-want) > 1e-5*math.Abs(want) {
		t.Fatalf("loss %.9f, float64 reference %.9f", loss, want)
	}

	type probe struct {
		name              string
		analytic, numeric float64
	}
	var probes []probe
	const h = 1e-4
	for c, ch := range l.Chunks {
		for _, tn := range ch.Tensors {
			n := tn.Len
			if tn.Name == "wpe" {
				n = seq * gc.shape.Dim // rows past seq get no gradient
			}
			for k := 0; k < 6; k++ {
				i := tn.Offset + rng.IntN(n)
				orig := p64[c][i]
				p64[c][i] = orig + h
				up := refLoss(l, p64, gc.batch, batch, seq)
				p64[c][i] = orig - h
				down := refLoss(l, p64, gc.batch, batch, seq)
				p64[c][i] = orig
				probes = append(probes, probe{tn.Name, float64(grads[c][i]), (up - down) / (2 * h)})
			}
		}
	}
	var scale float64
	for _, p := range probes {
		scale = math.Max(scale, math.Abs(p.numeric))
	}
	var worst float64
	bad := 0
	for _, p := range probes {
		diff := math.Abs(p.analytic - p.numeric)
		worst = math.Max(worst, diff/scale)
		if diff > 1e-3*math.Abs(p.numeric)+1e-4*scale {
			bad++
			t.Errorf("%s: analytic %.6e numeric %.6e", p.name, p.analytic, p.numeric)
		}
	}
	t.Logf("%d probes over %d tensors; max |numeric| %.3e; worst |diff|/max %.2e", len(probes), len(probes)/6, scale, worst)
	if scale == 0 || bad > 0 {
		t.Fatalf("%d probes out of tolerance (scale %g)", bad, scale)
	}
}

// recorder is a Params that logs every call and serves a Resident.
type recorder struct {
	*Resident
	log    []Access
	failAt int // the 1-based call that fails; 0: none
}

func (r *recorder) Acquire(s gpu.Stream, c int, p shard.Phase) (gpu.Buffer, error) {
	r.log = append(r.log, Access{AccessAcquire, c, p})
	if err := r.fail(); err != nil {
		return nil, err
	}
	return r.Resident.Acquire(s, c, p)
}
func (r *recorder) Release(s gpu.Stream, c int, p shard.Phase) {
	r.log = append(r.log, Access{AccessRelease, c, p})
}
func (r *recorder) Grad(s gpu.Stream, c int) (gpu.Buffer, error) {
	r.log = append(r.log, Access{AccessGrad, c, shard.Backward})
	if err := r.fail(); err != nil {
		return nil, err
	}
	return r.Resident.Grad(s, c)
}
func (r *recorder) GradReady(s gpu.Stream, c int) error {
	r.log = append(r.log, Access{AccessGradReady, c, shard.Backward})
	return r.fail()
}

// fail returns errInjected for the call that makes the log failAt long
// (0: never).
func (r *recorder) fail() error {
	if len(r.log) == r.failAt {
		return fmt.Errorf("call %d: %w", r.failAt, errInjected)
	}
	return nil
}

var errInjected = errors.New("injected failure")

func TestModelFollowsAccessOrder(t *testing.T) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	shape, _ := Lookup("tiny")
	shape.Layers = 3
	l, _ := NewLayout(shape)
	res, err := NewResident(dev, l, gpu.BF16)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	res.Load(s, l.Init(1))
	m, err := New(dev, l, 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	rec := &recorder{Resident: res}
	ids := Encode([]byte("abcdefghi"))
	for range 2 { // the order is the same for every micro-batch
		rec.log = nil
		if err := m.Forward(s, rec, Batch{IDs: ids[:8], Targets: ids[1:]}); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(s, rec, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Loss(s); err != nil {
			t.Fatal(err)
		}
		if want := AccessOrder(shape); !slices.Equal(rec.log, want) {
			t.Fatalf("calls:\n%v\nAccessOrder:\n%v", rec.log, want)
		}
	}
}

// TestModelStopsAtFailedAccess: whichever Params call fails, the pass
// makes no call after it and returns that error; a failed Forward leaves
// no loss behind, and a later micro-batch runs normally.
func TestModelStopsAtFailedAccess(t *testing.T) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	shape, _ := Lookup("tiny")
	shape.Layers = 2
	l, _ := NewLayout(shape)
	res, err := NewResident(dev, l, gpu.BF16)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	res.Load(s, l.Init(1))
	m, err := New(dev, l, 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	ids := Encode([]byte("abcdefghi"))
	order := AccessOrder(shape)
	forwardCalls := slices.IndexFunc(order, func(a Access) bool { return a.Pass == shard.Backward })
	for i := range order {
		if order[i].Kind == AccessRelease {
			continue // cannot fail
		}
		rec := &recorder{Resident: res, failAt: i + 1}
		err := m.Forward(s, rec, Batch{IDs: ids[:8], Targets: ids[1:]})
		if i >= forwardCalls {
			if err != nil {
				t.Fatalf("call %d (%v): forward failed: %v", i+1, order[i], err)
			}
			err = m.Backward(s, rec, 1)
		}
		if !errors.Is(err, errInjected) {
			t.Fatalf("call %d (%v) failed, the pass returned %v", i+1, order[i], err)
		}
		if !slices.Equal(rec.log, order[:i+1]) {
			t.Fatalf("call %d (%v) failed, the model went on:\n%v", i+1, order[i], rec.log[i:])
		}
		if _, err := m.Losses(s); err != nil {
			t.Fatal(err)
		}
	}
	// A failed Forward has no loss; the next micro-batch's is whole.
	if err := m.Forward(s, &recorder{Resident: res, failAt: 3}, Batch{IDs: ids[:8], Targets: ids[1:]}); !errors.Is(err, errInjected) {
		t.Fatalf("forward: %v", err)
	}
	if err := m.Forward(s, res, Batch{IDs: ids[:8], Targets: ids[1:]}); err != nil {
		t.Fatal(err)
	}
	if ls, err := m.Losses(s); err != nil || len(ls) != 1 {
		t.Fatalf("losses %v, %v: want the one of the whole forward", ls, err)
	}
}

func TestActivationBytesMatchesDevice(t *testing.T) {
	dev := newDevice(t)
	shape, _ := Lookup("tiny")
	l, _ := NewLayout(shape)
	for _, bt := range [][2]int{{1, 1}, {2, 16}, {3, 64}} {
		before := dev.MemStats().InUseByKind[gpu.Activation]
		m, err := New(dev, l, bt[0], bt[1])
		if err != nil {
			t.Fatal(err)
		}
		got := dev.MemStats().InUseByKind[gpu.Activation] - before
		want := ActivationBytes(shape, bt[0], bt[1])
		// The device rounds each of the L+4 allocations up to its granularity
		// (64 bytes on gpu/cpu, below 1 KiB on any backend).
		if got < want || got > want+int64(shape.Layers+4)*1024 {
			t.Errorf("batch %d seq %d: device shows %d activation bytes, ActivationBytes %d", bt[0], bt[1], got, want)
		}
		m.Free()
		if after := dev.MemStats().InUseByKind[gpu.Activation]; after != before {
			t.Errorf("Free left %d activation bytes", after-before)
		}
	}
	// Linear in batch and in seq: attention keeps no seq×seq term. (The
	// 256-byte padding of the smallest tensors, 32-64 values here, moves
	// the ratios by up to 2 %.)
	a1, a2, a3 := ActivationBytes(shape, 1, 64), ActivationBytes(shape, 2, 64), ActivationBytes(shape, 1, 32)
	if r := float64(a2) / float64(a1); r < 1.98 || r > 2.02 {
		t.Errorf("doubling the batch scales activations by %.3f", r)
	}
	if r := float64(a1) / float64(a3); r < 1.98 || r > 2.02 {
		t.Errorf("doubling seq scales activations by %.3f", r)
	}
}

// TestActivationBytesFormula: ActivationBytesWith is the per-token count of
// planActivations' doc plus the loss chunk, within the 256-byte padding of
// each tensor (0.1 % here), for GPT-2 124M at seq 1024 and Llama-3-8B at
// seq 256, fp32 and bf16, with every block, half the blocks or none
// checkpointed, and with the checkpointed inputs offloaded.
func TestActivationBytesFormula(t *testing.T) {
	for _, c := range []struct {
		name       string
		batch, seq int
		// block is a saved block's values per token (its dtype) and
		// statistics (fp32); scratch the backward's values besides dres.
		block   func(s Shape) (vals, stats int64)
		scratch func(s Shape) int64
	}{
		{"gpt2", 1, 1024, func(s Shape) (int64, int64) {
			c, f, h := int64(s.Dim), int64(s.FFNDim()), int64(s.Heads)
			return 7*c + 2*f, 4 + h
		}, func(s Shape) int64 { return int64(s.Dim) + max(3*int64(s.Dim), int64(s.FFNDim())) }},
		{"llama-3-8b", 2, 256, func(s Shape) (int64, int64) {
			c, f, h, kvd := int64(s.Dim), int64(s.FFNDim()), int64(s.Heads), int64(s.KVHeadCount()*s.HeadDim())
			return 5*c + 2*kvd + 3*f, 2 + h
		}, func(s Shape) int64 {
			c, f, kvd := int64(s.Dim), int64(s.FFNDim()), int64(s.KVHeadCount()*s.HeadDim())
			return c + max(c+2*kvd, 2*f)
		}},
	} {
		s, _ := Lookup(c.name)
		L := int64(s.Layers)
		for _, o := range []ActivationOptions{{}, {DType: gpu.BF16}, {DType: gpu.BF16, Checkpoint: s.Layers},
			{DType: gpu.BF16, Checkpoint: s.Layers / 2}, {DType: gpu.BF16, Checkpoint: s.Layers, Offload: true}} {
			d, C := int64(o.dtype().Size()), int64(s.Dim)
			vals, stats := c.block(s)
			k := int64(o.Checkpoint)
			saved := L - k // blocks with their own activations
			if k > 0 {
				saved++ // the work set
			}
			residual := (L + 1) * C * d
			if o.Offload {
				residual = (1 + 3) * C * d // the final norm's input and the ring
			}
			normStats := int64(2)
			if s.IsLlama() {
				normStats = 1
			}
			perToken := residual + saved*(vals*d+stats*4) + C*d + (normStats+1)*4 + C*4 + c.scratch(s)*d + 3*4
			tokens := int64(c.batch * c.seq)
			want := tokens*perToken + int64(lossRows(c.batch*c.seq, s.Vocab))*int64(s.Vocab)*4
			got := ActivationBytesWith(s, c.batch, c.seq, o)
			if dv := float64(got-want) / float64(want); dv < 0 || dv > 1e-3 {
				t.Errorf("%s B=%d T=%d %v: ActivationBytes %d, per-token formula %d (%+.4f)", c.name, c.batch, c.seq, o, got, want, dv)
			}
			var sum int64
			for _, term := range ActivationTerms(s, c.batch, c.seq, o) {
				sum += term.Bytes
			}
			if sum != got {
				t.Errorf("%s %v: terms sum to %d, ActivationBytesWith %d", c.name, o, sum, got)
			}
			t.Logf("%s B=%d T=%d %v: %s", c.name, c.batch, c.seq, o, units.FormatBytes(got))
		}
	}
}

// TestCheckpointedSpread: Checkpointed picks exactly Checkpoint blocks,
// every block for all of them, every second for half, the last for one.
func TestCheckpointedSpread(t *testing.T) {
	for _, c := range []struct {
		layers, k int
		want      string
	}{{4, 4, "xxxx"}, {4, 2, ".x.x"}, {4, 1, "...x"}, {4, 0, "...."}, {6, 4, ".xx.xx"}, {5, 2, "..x.x"}} {
		got := ""
		for l := range c.layers {
			if (ActivationOptions{Checkpoint: c.k}).Checkpointed(l, c.layers) {
				got += "x"
			} else {
				got += "."
			}
		}
		if got != c.want {
			t.Errorf("L=%d k=%d: %s, want %s", c.layers, c.k, got, c.want)
		}
	}
}

func TestNewRejectsBadShapes(t *testing.T) {
	dev := newDevice(t)
	shape, _ := Lookup("tiny")
	l, _ := NewLayout(shape)
	if _, err := New(dev, l, 1, shape.MaxSeq+1); err == nil || !strings.Contains(err.Error(), "max_seq_len") {
		t.Errorf("seq past MaxSeq: %v", err)
	}
	if _, err := New(dev, l, 0, 4); err == nil {
		t.Error("batch 0 accepted")
	}
	small, _, _ := cpu.New(cpu.Options{HBMBytes: 4096})
	var oom *gpu.OutOfMemoryError
	if _, err := New(small[0], l, 4, 64); err == nil || !errorsAs(err, &oom) {
		t.Errorf("4 KiB device: %v, want an out-of-memory error", err)
	}
	if n := small[0].MemStats().InUseBytes; n != 0 {
		t.Errorf("failed New left %d bytes allocated", n)
	}
}

// TestBF16ForwardNearF32: the same parameters, rounded to bf16, with bf16
// activations give a loss within 2 % (bf16 keeps 8 bits of mantissa: each
// weight and each stored activation moves by up to 2^-9 relative, and at
// init the loss is near ln 256).
func TestBF16ForwardNearF32(t *testing.T) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	shape, _ := Lookup("tiny")
	l, _ := NewLayout(shape)
	init := l.Init(11)
	ids := Encode([]byte(strings.Repeat("hello, world! ", 10)))
	var losses [2]float64
	for i, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		res, err := NewResident(dev, l, dt)
		if err != nil {
			t.Fatal(err)
		}
		res.Load(s, init)
		m, err := NewWith(dev, l, 2, 32, ActivationOptions{DType: dt})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Forward(s, res, Batch{IDs: ids[:64], Targets: ids[1:65]}); err != nil {
			t.Fatal(err)
		}
		res.ZeroGrads(s)
		if err := m.Backward(s, res, 1); err != nil {
			t.Fatal(err)
		}
		if losses[i], err = m.Loss(s); err != nil {
			t.Fatal(err)
		}
		g, err := res.ReadGrads(s)
		if err != nil {
			t.Fatal(err)
		}
		if dt == gpu.BF16 {
			for c := range g {
				for _, x := range g[c] {
					if x != bf16.Round(x) || math.IsNaN(float64(x)) {
						t.Fatalf("chunk %d: bf16 gradient %v", c, x)
					}
				}
			}
		}
		m.Free()
		res.Free()
	}
	if math.Abs(losses[0]-math.Log(256)) > 0.1 {
		t.Errorf("fp32 loss at init %.4f, want about ln 256 = %.4f", losses[0], math.Log(256))
	}
	if d := math.Abs(losses[1] - losses[0]); d > 0.02*losses[0] {
		t.Errorf("bf16 loss %.5f vs fp32 %.5f", losses[1], losses[0])
	}
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// TestLossesOfSeveralForwards: enqueuing micro-batches back to back and
// reading their losses with one synchronization gives what reading each
// one right after its Forward gives.
func TestLossesOfSeveralForwards(t *testing.T) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	shape, _ := Lookup("tiny")
	l, _ := NewLayout(shape)
	res, err := NewResident(dev, l, gpu.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Free()
	res.Load(s, l.Init(1))
	m, err := New(dev, l, 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	data, _ := NewSampler(randomTokens(rand.New(rand.NewPCG(1, 1)), 200, 256), 16, 1)
	var one []float64
	for i := 0; i < 3; i++ {
		b, err := data.Batch(i, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Forward(s, res, b); err != nil {
			t.Fatal(err)
		}
		x, err := m.Loss(s)
		if err != nil {
			t.Fatal(err)
		}
		one = append(one, x)
	}
	for i := 0; i < 3; i++ {
		b, err := data.Batch(i, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Forward(s, res, b); err != nil {
			t.Fatal(err)
		}
	}
	all, err := m.Losses(s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(all, one) || one[0] == one[1] {
		t.Fatalf("Losses %v, one at a time %v", all, one)
	}
	if x, _ := m.Loss(s); x != one[2] {
		t.Errorf("Loss after Losses: %v, want the last, %v", x, one[2])
	}
	if again, _ := m.Losses(s); len(again) != 0 {
		t.Errorf("second Losses returned %v", again)
	}
}
