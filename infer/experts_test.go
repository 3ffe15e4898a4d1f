package infer_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// moeShape is Qwen3-MoE-shaped where it matters to the bytes: 128 experts
// a sparse layer, 8 routed per token; the widths are a test's.
var moeShape = model.Shape{Name: "moe", Arch: model.ArchQwen3MoE, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDimension: 8,
	FFN: 48, Vocab: 256, MaxSeq: 512, Experts: 128, TopK: 8, ExpertFFN: 16}

// writeMoEModel writes moeShape as a Hugging Face directory with seeded
// random weights, its routers' scaled by routerScale (larger: a more
// skewed popularity of experts).
func writeMoEModel(t *testing.T, routerScale float64) string {
	t.Helper()
	l, err := model.NewLayout(moeShape)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	dir := filepath.Join(t.TempDir(), "moe")
	_, err = hf.ExportDir(dir, l, hf.DirOptions{}, func(w *hf.ExportWriter) error {
		for c, ch := range l.Chunks {
			v := make([]float32, ch.Len)
			for _, tn := range ch.Tensors {
				std := 0.2
				if len(tn.Shape) == 1 {
					std = 0.05 // norms near 1 below
				} else if tn.Shape[0] == moeShape.Experts {
					std *= routerScale
				}
				for i := tn.Offset; i < tn.Offset+tn.Len; i++ {
					v[i] = float32(rng.NormFloat64() * std)
					if len(tn.Shape) == 1 {
						v[i]++
					}
				}
			}
			if err := w.F32(c, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// generate loads dir with opts and generates n tokens after a fixed
// prompt (greedily at temperature 0, else sampled with a fixed seed),
// returning them and the expert store's counters after each token.
func generate(t *testing.T, dir string, opts infer.Options, n int, temperature float64) ([]int32, []infer.ExpertStats) {
	t.Helper()
	ctx := context.Background()
	opts.HBMBytes = 1 << 30
	m, err := infer.Open(ctx, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Load(ctx, model.DecoderOptions{Capacity: n + 8}); err != nil {
		t.Fatal(err)
	}
	var ids []int32
	stats := []infer.ExpertStats{m.ExpertStats()}
	_, err = infer.Generate(ctx, m, []int32{10, 20, 30, 40}, infer.GenOptions{MaxNewTokens: n, Temperature: temperature, Seed: 7}, func(tk infer.Token) error {
		if !tk.Final {
			ids = append(ids, tk.ID)
			stats = append(stats, m.ExpertStats())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids, stats
}

// TestExpertsOffDevice: a Qwen3-MoE-shaped model (128 experts, 8 routed)
// generates the same tokens with its experts on the device, in host RAM
// and on NVMe, with and without a cache; with the experts on NVMe and no
// cache each generated token reads exactly its routed experts (8 per
// layer), which is at most 1.3× their bytes (the reads are padded to the
// file's alignment), and nothing for the dense part (resident).
func TestExpertsOffDevice(t *testing.T) {
	nvmetest.Require(t)
	dir := writeMoEModel(t, 1)
	const n = 12
	want, _ := generate(t, dir, infer.Options{}, n, 0)
	nv := nvmetest.Dir(t)
	for _, o := range []infer.Options{
		{Experts: infer.ExpertsHost},
		{Experts: infer.ExpertsHost, ExpertCache: 64},
		{Experts: infer.ExpertsNVMe, NVMePath: nv},
		{Experts: infer.ExpertsNVMe, NVMePath: nv, ExpertCache: 64, ExpertPolicy: infer.PolicyTinyLFU},
	} {
		got, stats := generate(t, dir, o, n, 0)
		if !slices.Equal(got, want) {
			t.Errorf("%s, cache %d %s: tokens %v, with the experts on the device %v", o.Experts, o.ExpertCache, o.ExpertPolicy, got, want)
		}
		if o.Experts != infer.ExpertsNVMe || o.ExpertCache != 0 {
			continue
		}
		routed := int64(moeShape.SparseLayers() * moeShape.TopK)
		for i := 2; i < len(stats); i++ { // one token a step (the first entry after the prompt's step)
			a, b := stats[i-1], stats[i]
			acq, hits, read := b.Acquires-a.Acquires, b.Hits-a.Hits, b.Reads-a.Reads
			if acq != routed || hits != 0 {
				t.Errorf("token %d: %d experts acquired (%d hits), want the %d routed", i, acq, hits, routed)
			}
			if ratio := float64(read) / float64(routed*b.ExpertBytes); ratio < 1 || ratio > 1.3 {
				t.Errorf("token %d: read %d B for %d routed experts of %d B: %.3f×, want within [1, 1.3]", i, read, routed, b.ExpertBytes, ratio)
			}
		}
		last := stats[len(stats)-1]
		t.Logf("NVMe, no cache: %d experts read in %d tokens, %d B each (%d B padded reads): %.3f× the routed bytes",
			last.Acquires, n, last.ExpertBytes, last.Reads/max(1, last.Acquires), float64(last.Reads)/float64(last.Acquires*last.ExpertBytes))
	}
}

// TestExpertCacheHitRate: over 256 tokens sampled at temperature 1 (a
// random model's greedy text soon repeats itself, and so would its
// experts), the hit rate of an expert cache of 64 of the 256 experts
// under ristretto's TinyLFU and under a plain LRU of the same size (the
// figures the README quotes), for routers of two skews. Each cache holds what it says: its hits never
// read, its misses read an expert each.
func TestExpertCacheHitRate(t *testing.T) {
	const n, slots = 256, 64
	for _, skew := range []float64{1, 4} {
		dir := writeMoEModel(t, skew)
		var rates [2]float64
		for i, policy := range []string{infer.PolicyLRU, infer.PolicyTinyLFU} {
			_, stats := generate(t, dir, infer.Options{Experts: infer.ExpertsHost, ExpertCache: slots, ExpertPolicy: policy}, n, 1)
			last := stats[len(stats)-1]
			if last.Reads != (last.Acquires-last.Hits)*last.ExpertBytes {
				t.Errorf("%s: %d B read for %d misses of %d B", policy, last.Reads, last.Acquires-last.Hits, last.ExpertBytes)
			}
			if last.Hits == 0 || last.Hits >= last.Acquires {
				t.Errorf("%s: %d hits of %d acquires", policy, last.Hits, last.Acquires)
			}
			rates[i] = last.HitRate()
		}
		t.Logf("router scale %g: %d tokens, cache of %d of %d experts: LRU hit rate %.3f, TinyLFU (ristretto) %.3f",
			skew, n, slots, moeShape.Experts*moeShape.SparseLayers(), rates[0], rates[1])
	}
}
