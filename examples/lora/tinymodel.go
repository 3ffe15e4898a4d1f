package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/run"
)

// pretrainConfig: the named shape "tiny" (GPT-2 over a byte vocabulary of
// 256, 36k params), fully trained on the text file %q, in host RAM.
const pretrainConfig = `{
  "train_micro_batch_size_per_gpu": 8,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0}},
  "zero_optimization": {"stage": 0},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 32, "steps": 150, "seed": 1, "data": %q}
}`

// writeTinyModel makes a base model to fine-tune where no model hub can be
// reached: "tiny" trained from scratch on English pangrams under work,
// exported as a Hugging Face directory (fp32, as save_pretrained writes
// it) to work/base.
func writeTinyModel(ctx context.Context, work string) (string, error) {
	text := filepath.Join(work, "pretrain.txt")
	pangrams := "the quick brown fox jumps over the lazy dog. sphinx of black quartz, judge my vow. "
	if err := os.WriteFile(text, []byte(strings.Repeat(pangrams, 200)), 0o644); err != nil {
		return "", err
	}
	cfg, err := config.Parse(fmt.Appendf(nil, pretrainConfig, text), "pretrain.json", config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		return "", err
	}
	res, err := run.Train(ctx, run.Options{Config: cfg, Out: filepath.Join(work, "pretrain")}, nil)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(work, "base")
	_, err = checkpoint.Export(ctx, res.Checkpoint, dir, checkpoint.ExportOptions{Format: checkpoint.FormatHF})
	return dir, err
}
