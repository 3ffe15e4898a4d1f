package engine

import (
	"fmt"
	"testing"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// BenchmarkStep measures one optimizer step of the "small" model (0.86M
// params, global batch 4 rows of 64 tokens) under each stage on 2 devices,
// next to its anchor, model.Trainer with Ranks = 2 on one device (the same
// arithmetic, no sharding, no overlap). Compare ns/op side by side:
//
//	go test ./engine -run '^$' -bench Step -benchtime 10x
func BenchmarkStep(b *testing.B) {
	const js = `{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95]}},
 "bf16": {"enabled": true}, "zero_optimization": {"stage": %d, "stage3_param_persistence_threshold": 1000, "offload_optimizer": {"device": %q}},
 "strata": {"model": {"n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 256, "max_seq_len": 256}, "devices": 2, "seq_len": 64}}`
	tokens := data.SyntheticCorpus(syntheticCorpusBytes)
	b.Run("anchor-trainer", func(b *testing.B) {
		devs, _, _ := cpu.New(cpu.Options{Devices: 1})
		s, _ := model.Lookup("small")
		tr, err := model.NewTrainer(devs[0], s, model.TrainOptions{Batch: 2, Seq: 64, Ranks: 2, Precision: gpu.BF16, Beta2: 0.95})
		if err != nil {
			b.Fatal(err)
		}
		defer tr.Free()
		data, _ := model.NewSampler(tokens, 64, 1)
		for b.Loop() {
			if _, err := tr.Step(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	for stage := 0; stage <= 3; stage++ {
		for _, off := range []string{"none", "cpu"} {
			if stage == 0 && off == "cpu" {
				continue
			}
			b.Run(fmt.Sprintf("stage%d-N2-opt-%s", stage, off), func(b *testing.B) {
				cfg := testConfig(b, fmt.Sprintf(js, stage, off))
				devs, comms, _ := cpu.New(cpu.Options{Devices: 2})
				e, err := startEngine(b, cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(tokens)})
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if _, err := e.Step(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
