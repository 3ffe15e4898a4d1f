package engine

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
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
