package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// TestMoEFollowsAccessOrder: a mixture of experts (a dense layer between
// sparse ones), with and without LoRA adapters on its attention, router
// and experts, makes exactly the Params calls of Layout.AccessOrder in
// every micro-batch (each expert after its block in the forward, before
// it in the backward, the adapters before the first of a layer's chunks
// in each pass), and that order keeps CheckAccessOrder's rules.
func TestMoEFollowsAccessOrder(t *testing.T) {
	s := Shape{Name: "moe", Layers: 3, Dim: 16, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchQwen3MoE, KVHeads: 2, FFN: 24,
		HeadDimension: 4, Experts: 4, TopK: 2, ExpertFFN: 8, MLPLayers: "ede"}
	for _, lora := range []bool{false, true} {
		dev := newDevice(t)
		st := dev.DefaultStream()
		l, err := NewLayout(s)
		if err != nil {
			t.Fatal(err)
		}
		if lora {
			if l, err = l.WithLoRA(LoRA{R: 2, Alpha: 4, Targets: []string{"all-linear"}}); err != nil {
				t.Fatal(err)
			}
		}
		if n := l.ExpertChunks(); n != 8 || l.ExpertChunk(1, 0) != -1 || l.ExpertChunk(2, 3) != s.Layers+2+7 {
			t.Fatalf("%d expert chunks; layer 1's expert 0 at %d, layer 2's expert 3 at %d", n, l.ExpertChunk(1, 0), l.ExpertChunk(2, 3))
		}
		order := l.AccessOrder(ActivationOptions{})
		if err := CheckAccessOrder(order, len(l.Chunks)); err != nil {
			t.Fatal(err)
		}
		res, err := NewResident(dev, l, gpu.BF16)
		if err != nil {
			t.Fatal(err)
		}
		res.Load(st, l.Init(1))
		m, err := NewWith(dev, l, 1, 8, ActivationOptions{LoRA: l.LoRA})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{Resident: res}
		ids := Encode([]byte("abcdefghi"))
		for range 2 {
			rec.log = nil
			if err := m.Forward(st, rec, Batch{IDs: ids[:8], Targets: ids[1:]}); err != nil {
				t.Fatal(err)
			}
			if err := m.Backward(st, rec, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Loss(st); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rec.log, order) {
				t.Fatalf("LoRA %t: calls:\n%v\nLayout.AccessOrder:\n%v", lora, rec.log, order)
			}
		}
		m.Free()
		res.Free()
	}
}

// TestMoEMergeLoRA: a Mixtral's adapters on every linear (the router's in
// the block chunk, each expert's in that expert's chunk) merged into the
// base weights (MergeLoRA chunk by chunk, as an export does) give the
// adapted model's loss: within 1e-5 relative (the merged weights are
// rounded to fp32 once; the adapted forward adds its low-rank products in
// fp32), where leaving out one expert's merge is off by far more.
func TestMoEMergeLoRA(t *testing.T) {
	s := Shape{Name: "mixtral-merge", Layers: 2, Dim: 16, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchMixtral, KVHeads: 2, FFN: 24, Experts: 4, TopK: 2}
	base, err := NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	l, err := base.WithLoRA(LoRA{R: 4, Alpha: 8, Targets: []string{"all-linear"}})
	if err != nil {
		t.Fatal(err)
	}
	params := perturbedParams(l, 9)
	for c := range l.Chunks { // B away from zero, so every adapter matters
		if l.IsAdapter(c) {
			for i := range params[c] {
				params[c][i] *= 4
			}
		}
	}
	ids := Encode([]byte("the experts merge"))
	b := Batch{IDs: ids[:16], Targets: ids[1:17]}
	loss := func(l *Layout, p [][]float32) float64 {
		dev := newDevice(t)
		st := dev.DefaultStream()
		res, err := NewResident(dev, l, gpu.F32)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Free()
		res.Load(st, p)
		m, err := NewWith(dev, l, 1, 16, ActivationOptions{LoRA: l.LoRA})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Free()
		if err := m.Forward(st, res, b); err != nil {
			t.Fatal(err)
		}
		v, err := m.Loss(st)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	want := loss(l, params)
	merge := func(skip int) [][]float32 {
		merged := make([][]float32, len(base.Chunks))
		for c := range base.Chunks {
			merged[c] = slices.Clone(params[c])
			if layer := l.ChunkLayer(c); layer >= 0 && c != skip {
				if err := l.MergeLoRA(c, merged[c], params[l.AdapterChunk(layer)]); err != nil {
					t.Fatal(err)
				}
			}
		}
		return merged
	}
	got := loss(base, merge(-1))
	if e := math.Abs(got-want) / math.Abs(want); !(e <= 1e-5) {
		t.Errorf("merged loss %.9g, adapted %.9g: relative error %.3g", got, want, e)
	}
	partial := loss(base, merge(l.ExpertChunk(1, 2)))
	if e := math.Abs(partial-want) / math.Abs(want); !(e > 1e-4) {
		t.Errorf("without layer 1's expert 2 merged the loss is %.9g, adapted %.9g: the expert's adapters do not matter", partial, want)
	}
	t.Logf("adapted %.9g, merged %.9g, merged but for one expert %.9g", want, got, partial)
}

// TestExpertsReached: the mean number of distinct experts tokens reach
// when each draws its TopK of E uniformly, against a simulation of 4000
// micro-batches per case (standard error below 0.1 experts; the bar 0.3),
// and PassParamCount's parameters from it: all for a dense shape, the
// active ones for one token, every one for many.
func TestExpertsReached(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ e, k, tokens int }{{128, 8, 1}, {128, 8, 16}, {128, 8, 64}, {8, 2, 3}, {8, 2, 16}} {
		s := Shape{Layers: 1, Arch: ArchMixtral, Experts: c.e, TopK: c.k}
		const trials = 4000
		var sum float64
		seen := make([]bool, c.e)
		for range trials {
			clear(seen)
			for range c.tokens {
				for _, e := range rng.Perm(c.e)[:c.k] {
					seen[e] = true
				}
			}
			for _, ok := range seen {
				if ok {
					sum++
				}
			}
		}
		got, want := s.ExpertsReached(c.tokens), sum/trials
		if math.Abs(got-want) > 0.3 {
			t.Errorf("E %d k %d, %d tokens: ExpertsReached %.2f, simulated %.2f", c.e, c.k, c.tokens, got, want)
		}
	}
	sh, err := Lookup("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	if got := sh.PassParamCount(1); math.Abs(got-float64(sh.ActiveParamCount())) > 1 {
		t.Errorf("one token reads %.0f parameters, %d active", got, sh.ActiveParamCount())
	}
	if got := sh.PassParamCount(1 << 20); math.Abs(got-float64(sh.ParamCount())) > 1 {
		t.Errorf("a million tokens read %.0f parameters of %d", got, sh.ParamCount())
	}
	if d, _ := Lookup("llama-3-8b"); d.PassParamCount(16) != float64(d.ParamCount()) {
		t.Errorf("a dense shape reads %.0f parameters of %d", d.PassParamCount(16), d.ParamCount())
	}
}
