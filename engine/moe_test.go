package engine

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
)

// Mixtures of experts through the engine: a tiny Mixtral (4 experts, top
// 2 renormalised) and a tiny Qwen3-MoE (6 experts of 12, top 2 not
// renormalised, its middle layer dense), both with the load-balancing
// loss in the loss, so that every expert chunk, the routers and the
// host-side routing gradients are exercised.
const (
	mixtralShapeJSON = `{"n_layer": 2, "n_embd": 16, "n_head": 4, "vocab_size": 256, "max_seq_len": 16, "arch": "mixtral", "n_kv_head": 2, "n_inner": 24,
  "num_experts": 4, "num_experts_per_tok": 2, "output_router_logits": true, "router_aux_loss_coef": 0.02}`
	qwen3MoEShapeJSON = `{"n_layer": 3, "n_embd": 16, "n_head": 4, "vocab_size": 256, "max_seq_len": 16, "arch": "qwen3_moe", "n_kv_head": 2, "n_inner": 32,
  "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 12, "mlp_layers": "ede", "output_router_logits": true, "router_aux_loss_coef": 0.02}`
)

// TestMoEEquivalence: both mixtures train 20 steps on 2 devices at every
// stage with nothing offloaded, at stage 2 with the optimizer on the host,
// and at stage 3 with params and optimizer state in host RAM and on NVMe
// (each expert a chunk the tier store moves on its own), and end with
// params, master weights and losses bit-identical to model.Trainer with
// Ranks = 2. Why it holds: the routing is computed on the host from the
// same logits in the same order, the experts' GEMMs run on the same
// grouped rows, and the rest is TestLlamaEquivalence's argument.
func TestMoEEquivalence(t *testing.T) {
	const n = 2
	for _, sh := range []struct{ name, js string }{{"mixtral", mixtralShapeJSON}, {"qwen3_moe", qwen3MoEShapeJSON}} {
		t.Run(sh.name, func(t *testing.T) {
			want := runLlamaTrainer(t, llamaConfig(sh.js, 0, n, "none", "none", ""), n, testSteps)
			if want.losses[testSteps-1] >= want.losses[0] {
				t.Errorf("model.Trainer: loss did not go down: %v", want.losses)
			}
			t.Logf("%s: model.Trainer loss %.4f -> %.4f in %d steps", sh.name, want.losses[0], want.losses[testSteps-1], testSteps)
			type run struct{ name, js string }
			runs := []run{
				{"stage0", llamaConfig(sh.js, 0, n, "none", "none", "")},
				{"stage1", llamaConfig(sh.js, 1, n, "none", "none", "")},
				{"stage2/opt-cpu", llamaConfig(sh.js, 2, n, "none", "cpu", "")},
				{"stage3", llamaConfig(sh.js, 3, n, "none", "none", "")},
				{"stage3/param-cpu/opt-cpu", llamaConfig(sh.js, 3, n, "cpu", "cpu", "")},
				{"stage3/param-nvme/opt-nvme", llamaConfig(sh.js, 3, n, "nvme", "nvme", nvmetest.Dir(t))},
			}
			for _, r := range runs {
				t.Run(r.name, func(t *testing.T) {
					got := runLlamaEngine(t, r.js, n, testSteps)
					sameAsTrainer(t, got, want)
					// The load-balancing loss is reported: k when the router spreads
					// its tokens evenly, more when it does not.
					if rl := got.stats[0].RouterLoss; !(rl >= 2 && rl < 4) {
						t.Errorf("step 1: router loss %v, want in [k, 2k) for a router near uniform", rl)
					}
				})
			}
		})
	}
}

// TestMoEResume: a mixture of experts with params and optimizer state on
// NVMe resumes from a checkpoint bit-identically (checkResume).
func TestMoEResume(t *testing.T) {
	nvmetest.Require(t)
	js := llamaConfig(qwen3MoEShapeJSON, 3, 2, "nvme", "nvme", nvmetest.Dir(t))
	checkResume(t, func(t *testing.T) *Engine { return newEngineJSON(t, js, 2) }, 4)
}

// TestMoELoRA: LoRA on every linear of a Mixtral (attention, router, each
// expert's w1, w3, w2: PEFT's all-linear) trains only its adapters, with
// the same bits at stage 0 resident, stage 2 with the optimizer in host
// RAM and stage 3 with everything on NVMe; and with the frozen base in
// NF4 on NVMe (QLoRA, every expert a coded chunk of its own) it trains bit
// for bit as the bf16 base of the same weights quantized and decoded.
func TestMoELoRA(t *testing.T) {
	const steps, n = 4, 2
	keys := `"lora": {"r": 4, "alpha": 8, "target_modules": ["all-linear"]}`
	ref := runFrozenJSON(t, withStrata(llamaConfig(mixtralShapeJSON, 0, n, "none", "none", ""), keys), n, steps, nil)
	l := ref.e.layout
	if l.LoRA == nil || l.ExpertChunks() != 8 {
		t.Fatalf("layout: LoRA %v, %d expert chunks", l.LoRA, l.ExpertChunks())
	}
	for c := range l.Chunks {
		p0, _ := initialParams(ref.e, c)
		if changed := sameBits(ref.res.params[c], p0) != 0; changed != l.IsAdapter(c) {
			t.Errorf("chunk %d (%s): changed %v, adapter %v", c, l.Chunks[c].Name, changed, l.IsAdapter(c))
		}
	}
	same := func(t *testing.T, got frozenRun) {
		t.Helper()
		for i := range steps {
			if got.res.losses[i] != ref.res.losses[i] {
				t.Errorf("step %d: loss %v, resident run %v", i+1, got.res.losses[i], ref.res.losses[i])
			}
		}
		for c := range l.Chunks {
			if m := sameBits(got.res.params[c], ref.res.params[c]); m != 0 {
				t.Errorf("chunk %d (%s): %d params differ from the resident run's", c, l.Chunks[c].Name, m)
			}
		}
	}
	t.Run("stage2/opt-cpu", func(t *testing.T) {
		same(t, runFrozenJSON(t, withStrata(llamaConfig(mixtralShapeJSON, 2, n, "none", "cpu", ""), keys), n, steps, nil))
	})
	nv := nvmetest.Dir(t)
	t.Run("stage3/param-nvme/opt-nvme", func(t *testing.T) {
		same(t, runFrozenJSON(t, withStrata(llamaConfig(mixtralShapeJSON, 3, n, "nvme", "nvme", nv), keys), n, steps, nil))
	})
	t.Run("stage3/nf4-base-nvme", func(t *testing.T) {
		js := llamaConfig(mixtralShapeJSON, 3, n, "nvme", "nvme", nv)
		got := runFrozenJSON(t, withStrata(js, strings.Replace(keys, `"alpha": 8,`, `"alpha": 8, "base_dtype": "nf4",`, 1)), n, steps, nil)
		gl := got.e.layout
		shards := make([]int, len(gl.Chunks))
		for c := range shards {
			shards[c] = got.e.chunks[c].shard
		}
		devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		dec, err := startEngine(t, testConfig(t, withStrata(js, keys)), cpu.Devices(devs), comms,
			Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, Init: codedSource{gl, got.e.cfg.Strata.Seed, shards, dtype.NF4}})
		if err != nil {
			t.Fatal(err)
		}
		want := trainFor(t, dec, steps)
		for i := range steps {
			if got.res.losses[i] != want[i] {
				t.Errorf("step %d: loss %v with the NF4 base, %v with its decoded values in bf16", i+1, got.res.losses[i], want[i])
			}
		}
		params, err := dec.Params()
		if err != nil {
			t.Fatal(err)
		}
		for c := range gl.Chunks {
			if m := sameBits(got.res.params[c], params[c]); m != 0 {
				t.Errorf("chunk %d (%s): %d params differ", c, gl.Chunks[c].Name, m)
			}
		}
	})
}

// routedSource is the seed's initial values of a mixture of experts whose
// routers reach only experts 0, 1, E-2 and E-1: each sparse block's
// post-attention norm keeps its first channel alone and the router reads
// only that channel (weights 3, 2, 0, …, 0, −2, −3), so a token goes to
// experts 0 and 1 or to E-1 and E-2 by the channel's sign. Training moves
// the weights by about the learning rate a step, far from changing that
// in a few steps.
//
// With pos, the route is the token's: its embedding's first channel is 1
// for a token in pos and -1 for the others, and neither the attention nor
// the experts write that channel (their output rows 0 are zero), so a
// token in pos goes to experts 0 and 1, any other to E-2 and E-1.
type routedSource struct {
	l    *model.Layout
	seed uint64
	pos  map[int32]bool
}

func (s routedSource) Shape() model.Shape { return s.l.Shape }

func (s routedSource) ReadChunk(c int, dst []float32) error {
	s.l.InitChunkInto(s.seed, c, dst)
	l := s.l.ChunkLayer(c)
	if s.pos == nil && (l < 0 || s.l.IsExpert(c) || !s.l.Shape.SparseLayer(l)) {
		return nil
	}
	for _, x := range s.l.Chunks[c].Tensors {
		v := dst[x.Offset : x.Offset+x.Len]
		if s.pos != nil {
			switch {
			case x.Name == "embed_tokens.weight":
				for tok := range x.Shape[0] {
					v[tok*x.Shape[1]] = -1
					if s.pos[int32(tok)] {
						v[tok*x.Shape[1]] = 1
					}
				}
			case strings.HasSuffix(x.Name, "o_proj.weight"), strings.HasSuffix(x.Name, ".w2.weight"):
				clear(v[:x.Shape[1]])
			}
		}
		if l < 0 || s.l.IsExpert(c) || !s.l.Shape.SparseLayer(l) {
			continue
		}
		switch {
		case strings.HasSuffix(x.Name, "post_attention_layernorm.weight"):
			clear(v)
			v[0] = 1
		case strings.HasSuffix(x.Name, ".gate.weight"): // the router, E×C
			ne, ch := x.Shape[0], x.Shape[1]
			clear(v)
			v[0], v[ch], v[(ne-2)*ch], v[(ne-1)*ch] = 3, 2, -2, -3
		}
	}
	return nil
}

// values reads every chunk of s.
func (s routedSource) values(t *testing.T) [][]float32 {
	out := make([][]float32, len(s.l.Chunks))
	for c := range out {
		out[c] = make([]float32, s.l.Chunks[c].Len)
		if err := s.ReadChunk(c, out[c]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestMoESkipsExperts: a Mixtral of 8 experts whose routers reach only 4
// of them (routedSource) trains on 2 devices at stage 0, at stage 3 (the
// ranks' union decides the gathers) and at stage 3 with params and
// optimizer state on NVMe, bit-identical to model.Trainer, which acquires
// every expert (an expert no token reached gets a zero gradient either
// way). On NVMe the tier planner passes over the experts no token
// reached, without diverging from its trace, and the step moves fewer
// bytes to the devices than the same run acquiring every expert (the
// optimizer still reads and writes every expert's state: its zero
// gradient's step). QLoRA of 32 experts, 4 reached, the NF4 base on NVMe
// with a host budget smaller than it: bit-identical to the run acquiring
// every expert, and the step's NVMe and host→device bytes fall to at most
// a quarter of that run's (measured: nothing from NVMe once the reached
// experts are in host RAM, against 3.8-4.2 MB a step; 0.10-0.14 of its
// host→device bytes; 4 of 32 is an eighth of the experts' bytes, the
// attention and adapters weigh less than that again).
func TestMoESkipsExperts(t *testing.T) {
	nvmetest.Require(t)
	const n, steps = 2, 6
	js := strings.Replace(mixtralShapeJSON, `"num_experts": 4`, `"num_experts": 8`, 1)
	cfg := testConfig(t, llamaConfig(js, 0, n, "none", "none", ""))
	lo, err := model.NewLayout(model.Shape(*cfg.Shape()))
	if err != nil {
		t.Fatal(err)
	}
	src := routedSource{lo, testSeed, nil}
	want := runLlamaTrainerFrom(t, llamaConfig(js, 0, n, "none", "none", ""), n, steps, src.values(t))
	nv := nvmetest.Dir(t)
	for _, r := range []struct{ name, js string }{
		{"stage0", llamaConfig(js, 0, n, "none", "none", "")},
		{"stage3", llamaConfig(js, 3, n, "none", "none", "")},
		{"stage3/param-nvme/opt-nvme", llamaConfig(js, 3, n, "nvme", "nvme", nv)},
	} {
		t.Run(r.name, func(t *testing.T) {
			got := runLlamaEngineFrom(t, r.js, n, steps, src)
			sameAsTrainer(t, got, want)
			if got.stats[0].Tier == nil {
				return
			}
			all := everyExpertRun(t, func() tierRun { return runLlamaEngineFrom(t, r.js, n, steps, src) })
			sameAsTrainer(t, all, want)
			g, a := compareSkips(t, lo, n, got.stats, all.stats)
			if g[shard.HostToHBM] >= a[shard.HostToHBM] {
				t.Errorf("%d B host to device in the steps after the first, %d B acquiring every expert", g[shard.HostToHBM], a[shard.HostToHBM])
			}
		})
	}
	// The ranks reach different experts: rank 0's first micro-batch its
	// own tokens' (0 and 1, and E-2 and E-1 for those rank 1 has too),
	// rank 1's only E-2 and E-1. Every rank gathers the union.
	t.Run("stage3/ranks-apart", func(t *testing.T) {
		data, err := model.NewSampler(testTokens, testSeq, testSeed)
		if err != nil {
			t.Fatal(err)
		}
		b0, err0 := data.RankBatch(0, 0, 0, 1, 1)
		b1, err1 := data.RankBatch(0, 1, 0, 1, 1)
		if err0 != nil || err1 != nil {
			t.Fatal(err0, err1)
		}
		apart := routedSource{lo, testSeed, map[int32]bool{}}
		for _, tok := range b0.IDs {
			apart.pos[tok] = true
		}
		for _, tok := range b1.IDs {
			delete(apart.pos, tok)
		}
		if len(apart.pos) == 0 {
			t.Fatal("rank 0's first micro-batch has no token of its own")
		}
		want := runLlamaTrainerFrom(t, llamaConfig(js, 0, n, "none", "none", ""), n, steps, apart.values(t))
		sameAsTrainer(t, runLlamaEngineFrom(t, llamaConfig(js, 3, n, "none", "none", ""), n, steps, apart), want)
	})
	t.Run("qlora-nf4-nvme", func(t *testing.T) {
		big := strings.NewReplacer(`"n_embd": 16`, `"n_embd": 64`, `"n_inner": 24`, `"n_inner": 256`, `"num_experts": 8`, `"num_experts": 32`).Replace(js)
		keys := `"lora": {"r": 4, "alpha": 8, "base_dtype": "nf4", "target_modules": ["q_proj", "v_proj"]}, "host_budget": "1MiB"`
		js := withStrata(llamaConfig(big, 3, n, "nvme", "nvme", nv), keys)
		o := Options{TierHBMBytes: 160 << 10}
		lo := newEngineJSON(t, js, n).layout
		o.Init = routedSource{lo, testSeed, nil}
		got := runLlamaEngineWith(t, js, n, steps, o)
		all := everyExpertRun(t, func() tierRun { return runLlamaEngineWith(t, js, n, steps, o) })
		for i := range steps {
			if got.losses[i] != all.losses[i] {
				t.Errorf("step %d: loss %v, %v acquiring every expert", i+1, got.losses[i], all.losses[i])
			}
		}
		for c := range got.params {
			if m := sameBits(got.params[c], all.params[c]); m != 0 {
				t.Errorf("chunk %d (%s): %d params differ from the run acquiring every expert", c, lo.Chunks[c].Name, m)
			}
		}
		g, a := compareSkips(t, lo, n, got.stats, all.stats)
		for _, l := range []shard.Link{shard.NVMeToHost, shard.HostToHBM} {
			if g[l] > a[l]/4 {
				t.Errorf("%s: %d B in the steps after the first, more than a quarter of the %d B acquiring every expert", l, g[l], a[l])
			}
		}
	})
}

// everyExpertRun runs run with RouteExperts acquiring every expert.
func everyExpertRun(t *testing.T, run func() tierRun) tierRun {
	everyExpert = true
	defer func() { everyExpert = false }()
	return run()
}

// compareSkips checks that each step of got passed over the experts no
// token reached (at least the 4 of each sparse layer's E that
// routedSource leaves out, in both passes, on each of the n ranks) and
// that the steps after the second (the first records, the second
// re-records for the pipelined optimizer) followed the planner's trace; all,
// acquiring every expert, skipped none. It returns the bytes each run
// moved on each link in the steps after the first.
func compareSkips(t *testing.T, lo *model.Layout, n int, got, all []report.StepStats) (g, a [shard.LinkCount]int64) {
	t.Helper()
	sh := lo.Shape
	least := int64(n * sh.SparseLayers() * (sh.Experts - 4) * 2)
	for i := range got {
		gs, as := got[i].Tier, all[i].Tier
		t.Logf("step %d: skipped %d, divergences %d/%d, nvme->host %d / %d B, host->hbm %d / %d B, hit rate %.2f / %.2f (every expert acquired after the /)",
			i+1, gs.Skipped, gs.Divergences, as.Divergences, gs.LinkBytes[shard.NVMeToHost], as.LinkBytes[shard.NVMeToHost],
			gs.LinkBytes[shard.HostToHBM], as.LinkBytes[shard.HostToHBM], gs.HitRate, as.HitRate)
		if gs.Skipped < least || as.Skipped != 0 {
			t.Errorf("step %d: %d accesses skipped, want at least %d; %d acquiring every expert", i+1, gs.Skipped, least, as.Skipped)
		}
		if i >= 2 && gs.Divergences != 0 {
			t.Errorf("step %d: %d divergences from the planner's trace", i+1, gs.Divergences)
		}
		if i == 0 {
			continue
		}
		for l := range g {
			g[l] += gs.LinkBytes[l]
			a[l] += as.LinkBytes[l]
		}
	}
	return g, a
}
