package estimate

import (
	"fmt"
	"github.com/strata-ai/strata/dtype"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// TestFrozenChunks: the matching rule and the refusals of strata.freeze.
func TestFrozenChunks(t *testing.T) {
	gpt := mustLayout(t, model.Shape{Name: "tiny-gpt", Layers: 3, Dim: 16, Heads: 2, Vocab: 256, MaxSeq: 16})
	llama, err := model.Lookup("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	ll := mustLayout(t, llama)
	last := ll.FinalNormChunk()
	want := func(l *model.Layout, frozen ...int) []bool {
		f := make([]bool, len(l.Chunks))
		for _, c := range frozen {
			f[c] = true
		}
		return f
	}
	for _, c := range []struct {
		l        *model.Layout
		patterns []string
		want     []bool
	}{
		{ll, []string{"embed_tokens", "layers.0."}, want(ll, 0, 1)}, // the example
		{ll, []string{"layers.1."}, want(ll, 2)},                    // substring: not layers.10-19
		{ll, []string{"layers.[0-2].*"}, want(ll, 1, 2, 3)},         // a glob over the whole name
		{ll, []string{"norm.*", "lm_head*"}, want(ll, last)},        // globs over the whole name: not layers.N.*_layernorm.weight
		{gpt, []string{"wte", "wpe", "ln_f"}, want(gpt, 0, 4)},
		{gpt, []string{"w?e", "h.*"}, want(gpt, 0, 1, 2, 3)},
		{gpt, nil, nil},
	} {
		got, err := FrozenChunks(c.l, c.patterns)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s %q: %v (%v), want %v", c.l.Shape.Name, c.patterns, got, err, c.want)
		}
	}
	for _, c := range []struct {
		l        *model.Layout
		patterns []string
		want     []string
	}{
		// GPT-2's token embedding shares its chunk with the position embedding.
		{gpt, []string{"wte"}, []string{`chunk "embeddings": the patterns match wte but not wpe`}},
		// "norm.weight" is a substring of every layer's norms too.
		{ll, []string{"norm.weight"}, []string{`chunk "block 0": the patterns match layers.0.input_layernorm.weight, layers.0.post_attention_layernorm.weight but not layers.0.self_attn.q_proj.weight`,
			`; and 30 more chunks alike: add patterns`}},
		{ll, []string{"norm.*"}, []string{`chunk "norm": the patterns match norm.weight but not lm_head.weight`}},
		{ll, []string{"embed_tokens", "emb_tokens"}, []string{`pattern "emb_tokens" matches no tensor of llama-3-8b`, "embed_tokens.weight, layers.0.input_layernorm.weight"}},
		{gpt, []string{"w?e", "h.", "ln_f"}, []string{`freezes every chunk of tiny-gpt: nothing would train`}},
		{gpt, []string{"h.[0"}, []string{`pattern "h.[0": syntax error in pattern`}},
	} {
		_, err := FrozenChunks(c.l, c.patterns)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s %q: error %v, want one containing %q", c.l.Shape.Name, c.patterns, err, w)
			}
		}
	}
	if got := DescribeChunks(ll, want(ll, 0, 1, 2, 3, 5, last)); got != "embeddings, blocks 0-2, block 4, norm" {
		t.Errorf("DescribeChunks: %q", got)
	}
}

func mustLayout(t *testing.T, s model.Shape) *model.Layout {
	t.Helper()
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestEstimateFrozen: a frozen chunk costs its params only. Chunks of 100
// (frozen), 200 and 300 params on N = 2 without alignment: Ψ = 600, Ψₜ =
// 500; each figure below is written out from the ZeRO layout by hand.
func TestEstimateFrozen(t *testing.T) {
	base := Options{ChunkParams: []int64{100, 200, 300}, Devices: 2, ShardAlignElems: 1, Frozen: []bool{true, false, false}, MasterDType: dtype.F32}
	for _, c := range []struct {
		stage         int
		opt           shard.Tier
		device        int64  // per device
		formula       string // per device
		host, nvme    int64  // all ranks
		hostFormula   string // per rank
		saved         [shard.TierCount]int64
		savedOptimize int64 // master, m, v per rank
	}{
		// params 2Ψ (1200), grads 2Ψₜ (1000), master, m, v 12Ψₜ (6000);
		// the frozen chunk's 2·100 + 12·100 are not kept
		{0, shard.HBM, 8200, "2Ψ + 14Ψₜ", 0, 0, "0", [3]int64{1400, 0, 0}, 1200},
		{1, shard.HBM, 5200, "2Ψ + 2Ψₜ + 12Ψₜ/N", 0, 0, "0", [3]int64{200 + 600, 0, 0}, 600},
		{2, shard.HBM, 4700, "2Ψ + 14Ψₜ/N", 0, 0, "0", [3]int64{700, 0, 0}, 600},
		{3, shard.HBM, 4100, "2Ψ/N + 14Ψₜ/N", 0, 0, "0", [3]int64{700, 0, 0}, 600},
		// the host holds each rank's gradient copy and master, m, v: 14Ψₜ/N
		{3, shard.Host, 1100, "2Ψ/N + 2Ψₜ/N", 7000, 0, "14Ψₜ/N", [3]int64{100, 700, 0}, 600},
		// ZeRO-Infinity: the gradient's home is host RAM, master, m, v on NVMe
		{3, shard.NVMe, 600, "2Ψ/N", 1000, 6000, "2Ψₜ/N", [3]int64{0, 100, 600}, 600},
	} {
		o := base
		o.Stage, o.OptimizerTier = c.stage, c.opt
		e := mustEstimate(t, o)
		name := fmt.Sprintf("stage %d optimizer %s", c.stage, c.opt)
		if e.Params != 600 || e.TrainableParams != 500 || e.FrozenParams != 100 {
			t.Errorf("%s: Ψ %d, Ψₜ %d, frozen %d", name, e.Params, e.TrainableParams, e.FrozenParams)
		}
		if e.DeviceBytes() != c.device || e.FormulaDeviceBytes() != c.device || e.TierFormula(shard.HBM).String() != c.formula {
			t.Errorf("%s: device %d bytes (formula %s = %d), want %d (%s)", name, e.DeviceBytes(), e.TierFormula(shard.HBM), e.FormulaDeviceBytes(), c.device, c.formula)
		}
		if e.HostBytes() != c.host || e.NVMeBytes() != c.nvme || e.TierFormula(shard.Host).String() != c.hostFormula {
			t.Errorf("%s: host %d (%s), nvme %d; want %d (%s), %d", name, e.HostBytes(), e.TierFormula(shard.Host), e.NVMeBytes(), c.host, c.hostFormula, c.nvme)
		}
		var opt int64
		for tr := range shard.TierCount {
			if got := e.FrozenSavedBytes(shard.Tier(tr)) / 2; got != c.saved[tr] {
				t.Errorf("%s: frozen saves %d bytes per rank on %s, want %d", name, got, shard.Tier(tr), c.saved[tr])
			}
			for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
				opt += e.FrozenSavedPerRank[st][tr]
			}
		}
		if opt != c.savedOptimize {
			t.Errorf("%s: frozen saves %d bytes of master, m, v per rank, want %d", name, opt, c.savedOptimize)
		}
		// Nothing frozen: the same options give the sums of both.
		o.Frozen = nil
		all := mustEstimate(t, o)
		if all.DeviceBytes()-e.DeviceBytes() != e.FrozenSavedPerRank[shard.Grad][shard.HBM]+e.FrozenSavedPerRank[shard.Master][shard.HBM]+
			e.FrozenSavedPerRank[shard.AdamM][shard.HBM]+e.FrozenSavedPerRank[shard.AdamV][shard.HBM] || all.FrozenParams != 0 || all.TrainableParams != 600 {
			t.Errorf("%s: nothing frozen %d bytes per device, frozen %d: not the savings", name, all.DeviceBytes(), e.DeviceBytes())
		}
	}
	// A host budget keeps no state of a frozen chunk (it has none).
	o := base
	o.Stage, o.OptimizerTier, o.HostBudgetBytes = 3, shard.NVMe, 1<<30
	e := mustEstimate(t, o)
	for _, st := range []shard.State{shard.Grad, shard.Master, shard.AdamM, shard.AdamV} {
		if k := e.HostKept[st]; k[0] || !k[1] || !k[2] {
			t.Errorf("host budget keeps %s of chunks %v (chunk 0 is frozen)", st, k)
		}
	}
	o.Frozen = []bool{true, true, true}
	if _, err := Memory(o); err == nil || !strings.Contains(err.Error(), "every chunk is frozen") {
		t.Errorf("everything frozen: %v", err)
	}
}

// TestDescribeExperts: a mixture of experts' frozen experts are named by
// ranges: whole sparse layers as one, the rest by layer.
func TestDescribeExperts(t *testing.T) {
	s, err := model.Lookup("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	l := mustLayout(t, s)
	mask := make([]bool, len(l.Chunks))
	set := func(layer, from, to int) {
		for e := from; e <= to; e++ {
			mask[l.ExpertChunk(layer, e)] = true
		}
	}
	for layer := range s.Layers {
		set(layer, 0, s.Experts-1)
	}
	mask[0] = true
	if got, want := DescribeChunks(l, mask), "embeddings, the 128 experts of blocks 0-47"; got != want {
		t.Errorf("every expert: %q, want %q", got, want)
	}
	clear(mask)
	set(0, 0, 127)
	set(1, 0, 127)
	set(2, 3, 9)
	set(5, 0, 127)
	set(6, 0, 0)
	set(7, 127, 127)
	set(8, 0, 127)
	want := "the 128 experts of blocks 0-1, block 2 experts 3-9, the 128 experts of block 5, block 6 expert 0, block 7 expert 127, the 128 experts of block 8"
	if got := DescribeChunks(l, mask); got != want {
		t.Errorf("some experts: %q, want %q", got, want)
	}
}
