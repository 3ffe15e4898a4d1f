package engine

import (
	"fmt"
	"testing"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// The Llama family through the engine: tiny shapes with the byte
// vocabulary. llamaShapeJSON has grouped-query attention (4 heads over 2
// key/value heads) and an untied head, whose lm_head lives in the final
// chunk (4112 params: the norm and lm_head) and changes the order of the
// model's accesses (model.AccessOrder); qwen2ShapeJSON has q, k, v biases,
// one key/value head and a tied head.
const (
	llamaShapeJSON = `{"n_layer": 2, "n_embd": 16, "n_head": 4, "vocab_size": 256, "max_seq_len": 16, "arch": "llama", "n_kv_head": 2, "n_inner": 32}`
	qwen2ShapeJSON = `{"n_layer": 2, "n_embd": 16, "n_head": 4, "vocab_size": 256, "max_seq_len": 16, "arch": "qwen2", "n_kv_head": 1, "n_inner": 32, "norm_eps": 1e-6, "tie_word_embeddings": true}`
)

// llamaConfig is the tests' training config (as runSpec's and tierSpec's:
// bf16, AdamW with weight decay, warmup, clipping) for a shape at a stage
// on n devices, with params and optimizer state where param and opt say
// (none, cpu, nvme; param only at stage 3) under dir.
func llamaConfig(shapeJSON string, stage, n int, param, opt, dir string) string {
	path := ""
	if dir != "" {
		path = fmt.Sprintf(`, "nvme_path": %q`, dir)
	}
	offParam := ""
	if stage == 3 {
		offParam = fmt.Sprintf(`"offload_param": {"device": %q%s}, `, param, path)
	}
	return fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 5, "warmup_type": "linear", "total_num_steps": 40}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": %d, "stage3_param_persistence_threshold": %d,
    %s"offload_optimizer": {"device": %q%s}},
  "aio": {"block_size": 65536, "queue_depth": 8, "intra_op_parallelism": 2},
  "strata": {"model": %s, "devices": %d, "seq_len": %d, "seed": %d}
}`, stage, testPersistence, offParam, opt, path, shapeJSON, n, testSeq, testSeed)
}

// runLlamaEngine trains steps steps of config js on n CPU devices.
func runLlamaEngine(t *testing.T, js string, n, steps int) tierRun {
	t.Helper()
	return runLlamaEngineFrom(t, js, n, steps, nil)
}

// runLlamaEngineFrom is runLlamaEngine from init's values (nil: the seed's).
func runLlamaEngineFrom(t *testing.T, js string, n, steps int, init ChunkSource) tierRun {
	t.Helper()
	return runLlamaEngineWith(t, js, n, steps, Options{Init: init})
}

// runLlamaEngineWith is runLlamaEngine with the options o (the test corpus
// and 2 optimizer threads).
func runLlamaEngineWith(t *testing.T, js string, n, steps int, o Options) tierRun {
	t.Helper()
	devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	o.Corpus, o.OptimizerThreads = model.Tokens(testTokens), 2
	e, err := startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, o)
	if err != nil {
		t.Fatal(err)
	}
	if s := e.layout.Shape; !s.IsLlama() || e.layout.LoRA == nil && e.layout.ParamCount() != s.ParamCount() {
		t.Fatalf("engine shape %v, %d params in its layout", s, e.layout.ParamCount())
	}
	var res tierRun
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error {
		res.losses = append(res.losses, st.Loss)
		res.stats = append(res.stats, st)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if res.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if res.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return res
}

// runLlamaTrainer trains steps steps of model.Trainer with Ranks = n on
// one device, with the optimizer, schedule and clipping of config js: the
// resident baseline.
func runLlamaTrainer(t *testing.T, js string, n, steps int) tierRun {
	t.Helper()
	return runLlamaTrainerFrom(t, js, n, steps, nil)
}

// runLlamaTrainerFrom is runLlamaTrainer from init's values (nil: the seed's).
func runLlamaTrainerFrom(t *testing.T, js string, n, steps int, init [][]float32) tierRun {
	t.Helper()
	cfg := testConfig(t, js)
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Optimizer.Params
	tr, err := model.NewTrainer(devs[0], model.Shape(*cfg.Shape()), model.TrainOptions{
		Batch: 1, Seq: testSeq, Accum: 1, Ranks: n, Precision: gpu.BF16,
		LR: p.LR, Beta1: p.Betas[0], Beta2: p.Betas[1], Eps: p.Eps, WeightDecay: p.WeightDecay, ClipNorm: cfg.GradientClipping,
		Schedule: func(step int64) float64 { return cfg.LR(int(step - 1)) }, Seed: testSeed, Init: init,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Free()
	data, err := model.NewSampler(testTokens, testSeq, testSeed)
	if err != nil {
		t.Fatal(err)
	}
	var res tierRun
	for range steps {
		r, err := tr.Step(data)
		if err != nil {
			t.Fatal(err)
		}
		res.losses = append(res.losses, r.Loss)
	}
	if res.params, err = tr.Resident().ReadParams(tr.Stream()); err != nil {
		t.Fatal(err)
	}
	if res.master, err = tr.Master(); err != nil {
		t.Fatal(err)
	}
	return res
}

// sameAsTrainer checks an engine run's params, master weights and losses
// bit for bit against model.Trainer's.
func sameAsTrainer(t *testing.T, got, want tierRun) {
	t.Helper()
	if m, d := diff(got.params, want.params); m != 0 {
		t.Errorf("params: %d elements differ from model.Trainer (max |diff| %g)", m, d)
	}
	if m, d := diff(got.master, want.master); m != 0 {
		t.Errorf("master: %d elements differ from model.Trainer (max |diff| %g)", m, d)
	}
	for i := range got.losses {
		if got.losses[i] != want.losses[i] {
			t.Errorf("step %d: loss %v, model.Trainer %v", i+1, got.losses[i], want.losses[i])
			break
		}
	}
}

// TestLlamaEquivalence: tiny Llama (grouped-query attention, untied head)
// and Qwen2 (biases, tied head) models train 20 steps on 2 devices at
// stage 0 with nothing offloaded, and at stage 3 with params and
// optimizer state on NVMe, and end with params, master weights and losses
// bit-identical to model.Trainer with Ranks = 2, the resident run. Why it
// holds, as for GPT-2 (TestEquivalence, TestTierEquivalence): the same
// ops on the same bytes in the same order, gradients summed in rank
// order, the same cpuadam kernel, shards moved between tiers unchanged.
func TestLlamaEquivalence(t *testing.T) {
	nvmetest.Require(t)
	const n = 2
	for _, sh := range []struct{ name, js string }{{"llama", llamaShapeJSON}, {"qwen2", qwen2ShapeJSON}} {
		t.Run(sh.name, func(t *testing.T) {
			want := runLlamaTrainer(t, llamaConfig(sh.js, 0, n, "none", "none", ""), n, testSteps)
			if want.losses[testSteps-1] >= want.losses[0] {
				t.Errorf("model.Trainer: loss did not go down: %v", want.losses)
			}
			t.Logf("%s: model.Trainer loss %.4f -> %.4f in %d steps", sh.name, want.losses[0], want.losses[testSteps-1], testSteps)
			runs := []struct {
				name string
				js   string
			}{
				{"stage0", llamaConfig(sh.js, 0, n, "none", "none", "")},
				{"stage3/param-nvme/opt-nvme", llamaConfig(sh.js, 3, n, "nvme", "nvme", nvmetest.Dir(t))},
			}
			for _, run := range runs {
				t.Run(run.name, func(t *testing.T) {
					got := runLlamaEngine(t, run.js, n, testSteps)
					sameAsTrainer(t, got, want)
					if run.name == "stage0" {
						return
					}
					var moved [4]int64 // shard.Link order: NVMe->host first, host->NVMe last
					for _, st := range got.stats {
						if st.Tier == nil {
							t.Fatal("stage 3 on NVMe: no tier stats")
						}
						for l, b := range st.Tier.LinkBytes {
							moved[l] += b
						}
					}
					// The state starts on NVMe and is read from it; the
					// default host budget then holds all of this tiny
					// model's (write-back caching: nothing need go back
					// before a checkpoint), so writes are not required.
					if moved[0] == 0 {
						t.Errorf("stage 3 on NVMe: %d B read from NVMe, %d B written in %d steps", moved[0], moved[3], testSteps)
					}
				})
			}
		})
	}
}
