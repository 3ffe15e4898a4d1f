package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/run"
)

// TestGenerate trains "tiny" on a sentence in a run directory, then
// generates from the run: greedy decoding continues the sentence, and the
// same seed samples the same text twice.
func TestGenerate(t *testing.T) {
	ctx, work := t.Context(), t.TempDir()
	text := filepath.Join(work, "train.txt")
	if err := os.WriteFile(text, []byte(strings.Repeat("sphinx of black quartz, judge my vow. ", 300)), 0o644); err != nil {
		t.Fatal(err)
	}
	js := fmt.Sprintf(`{"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 32, "steps": 120, "seed": 1, "data": %q}}`, text)
	cfg, err := config.Parse([]byte(js), "train.json", config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "run")
	if _, err := run.Train(ctx, run.Options{Config: cfg, Out: out}, nil); err != nil {
		t.Fatal(err)
	}
	var greedy bytes.Buffer
	res, err := generate(ctx, out, "sphinx of ", false, infer.GenOptions{MaxNewTokens: 12}, &greedy)
	if err != nil {
		t.Fatal(err)
	}
	if greedy.String() != "black quartz" || res.Generated != 12 {
		t.Errorf("greedy: %q (%d tokens), want \"black quartz\"", greedy.String(), res.Generated)
	}
	var a, b bytes.Buffer
	for _, w := range []*bytes.Buffer{&a, &b} {
		if _, err := generate(ctx, out, "judge ", false, infer.GenOptions{MaxNewTokens: 16, Temperature: 1, Seed: 7}, w); err != nil {
			t.Fatal(err)
		}
	}
	if a.String() != b.String() || a.Len() == 0 {
		t.Errorf("sampled with one seed: %q then %q", a.String(), b.String())
	}
}
