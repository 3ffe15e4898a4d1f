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

// TestGradientCheckWholeModel compares the fp32 gradient of the whole model
// (every op's backward, wired by Backward) with central differences of a
// float64 reference forward, at a sample of parameters of every tensor.
//
// Tolerance: |analytic − numeric| <= 1e-3·|numeric| + 1e-4·max|numeric|.
// The numeric side is exact to ~1e-9 (h = 1e-4 in float64, error O(h²));
// the analytic side is fp32: every op rounds to 2^-24 relative and the
// longest accumulation (the head GEMM over 256 logits, attention over 6
// keys) adds a few units, so its error is about 1e-6 of the gradient
// scale. The bound leaves two orders of magnitude of margin while a wrong
// transpose, a missing term or a wrong scale gives errors of order one.
func TestGradientCheckWholeModel(t *testing.T) {
	dev := newDevice(t)
	s := dev.DefaultStream()
	l, _ := NewLayout(checkShape)
	const batch, seq = 2, 6
	rng := rand.New(rand.NewPCG(5, 6))
	ids, targets := randomTokens(rng, batch*seq, checkShape.Vocab), randomTokens(rng, batch*seq, checkShape.Vocab)
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
	if err := m.Forward(s, res, Batch{IDs: ids, Targets: targets}); err != nil {
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
	want := refLoss(l, p64, ids, targets, batch, seq)
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
				n = seq * checkShape.Dim // rows past seq get no gradient
			}
			for k := 0; k < 6; k++ {
				i := tn.Offset + rng.IntN(n)
				orig := p64[c][i]
				p64[c][i] = orig + h
				up := refLoss(l, p64, ids, targets, batch, seq)
				p64[c][i] = orig - h
				down := refLoss(l, p64, ids, targets, batch, seq)
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

func (r *recorder) Acquire(s gpu.Stream, c int, p Pass) (gpu.Buffer, error) {
	r.log = append(r.log, Access{AccessAcquire, c, p})
	if err := r.fail(); err != nil {
		return nil, err
	}
	return r.Resident.Acquire(s, c, p)
}
func (r *recorder) Release(s gpu.Stream, c int, p Pass) {
	r.log = append(r.log, Access{AccessRelease, c, p})
}
func (r *recorder) Grad(s gpu.Stream, c int) (gpu.Buffer, error) {
	r.log = append(r.log, Access{AccessGrad, c, PassBackward})
	if err := r.fail(); err != nil {
		return nil, err
	}
	return r.Resident.Grad(s, c)
}
func (r *recorder) GradReady(s gpu.Stream, c int) error {
	r.log = append(r.log, Access{AccessGradReady, c, PassBackward})
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
		if want := AccessOrder(shape.Layers); !slices.Equal(rec.log, want) {
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
	order := AccessOrder(shape.Layers)
	forwardCalls := slices.IndexFunc(order, func(a Access) bool { return a.Pass == PassBackward })
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
	// Linear in batch, and the attention term is quadratic in seq.
	a1, a2 := ActivationBytes(shape, 1, 64), ActivationBytes(shape, 2, 64)
	if r := float64(a2) / float64(a1); r < 1.9 || r > 2.1 {
		t.Errorf("doubling the batch scales activations by %.3f", r)
	}
	g, _ := Lookup("gpt2")
	if b := ActivationBytes(g, 1, 1024); b < 1*units.GiB || b > 4*units.GiB {
		t.Errorf("gpt2 at B=1 T=1024: %s of activations, expected 1-4 GiB", units.FormatBytes(b))
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

// TestBF16ForwardNearF32: the same parameters, rounded to bf16, give a
// loss within 2 % (bf16 keeps 8 bits of mantissa: each weight moves by up
// to 2^-9 relative, and at init the loss is near ln 256).
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
		m, err := New(dev, l, 2, 32)
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
