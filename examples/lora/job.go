package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/run"
	"github.com/strata-ai/strata/source"
)

// loraConfig: LoRA r 8 on every linear of the base, ZeRO stage 3, the
// frozen base and the adapters' optimizer state on NVMe (%[1]q), trained
// on the text file %[2]q.
const loraConfig = `{
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0}},
  "zero_optimization": {"stage": 3,
    "offload_param": {"device": "nvme", "nvme_path": %[1]q},
    "offload_optimizer": {"device": "nvme", "nvme_path": %[1]q}},
  "strata": {"devices": 1, "seq_len": 32, "steps": 60, "seed": 1, "data": %[2]q,
    "lora": {"r": 8, "alpha": 16, "target_modules": ["all-linear"]}}
}`

// job is the whole fine-tuning job: open the base, estimate, train with
// LoRA on NVMe, evaluate, generate, export (PEFT adapter, merged model).
func job(ctx context.Context, base, text, nvme, out string, w io.Writer) error {
	m, err := source.Probe(ctx, base, source.Options{}) // 1. open
	if err != nil {
		return err
	}
	cfg, err := m.ParseConfig(fmt.Appendf(nil, loraConfig, nvme, text), "lora.json", config.Options{})
	if err != nil {
		return err
	}
	est, err := estimate.FromConfig(cfg, m.Shape) // 2. estimate
	if err != nil {
		return err
	}
	stage, _, dev, _ := est.Activations.Fit()
	fmt.Fprintf(w, "estimate: %d KiB a device at stage %d\n", dev>>10, stage)
	if err := m.Open(ctx); err != nil { // 3. train
		return err
	}
	defer m.Close()
	var first, last float64
	res, err := run.Train(ctx, run.Options{Config: cfg, Out: out, Init: m.Weights(), Source: m.Source}, func(s run.Step) error {
		if s.Step == 1 {
			first = s.Loss
		}
		last = s.Loss
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "trained: loss %.2f -> %.2f\n", first, last)
	lm, err := infer.Open(ctx, out, infer.Options{}) // 4. evaluate
	if err != nil {
		return err
	}
	defer lm.Close()
	if err := lm.Load(ctx, model.DecoderOptions{Capacity: 64}); err != nil {
		return err
	}
	ids := lm.Tokenizer.Encode("pack my box with five dozen liquor jugs.", false)
	ev, err := infer.Evaluate(ctx, lm, infer.EvalInput{Tokens: ids}, infer.EvalOptions{Seq: 32})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "held-out perplexity %.1f\n", ev.PPL)
	prompt := infer.PromptIDs(lm.Tokenizer, "pack my ", true) // 5. generate
	var gen []byte
	if _, err := infer.Generate(ctx, lm, prompt, infer.GenOptions{MaxNewTokens: 12}, func(t infer.Token) error {
		gen = append(gen, t.Text...)
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(w, "generated %q\n", gen)
	for _, o := range []checkpoint.ExportOptions{{Format: checkpoint.FormatPEFT}, {Format: checkpoint.FormatHF, Merge: true}} {
		x, err := checkpoint.Export(ctx, res.Checkpoint, filepath.Join(out, string(o.Format)), o) // 6. export
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "exported %s: %d files\n", x.Format, len(x.Files))
	}
	return nil
}
