package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
)

// DeepSpeed's fp16 config as its docs write it ("enabled": true,
// initial_scale_power 16, an fp16 block with every key) trains as written:
// fp16 in summary.json, each step's loss_scale in steps.jsonl (2^16, no
// overflow in 4 steps of the demo model), the scale on the progress line.
func TestTrainFP16Config(t *testing.T) {
	out := t.TempDir()
	cfg := filepath.Join("..", "testdata", "configs", "ds_fp16.json")
	_, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "4", "--no-progress", "--out", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "scale 65536") {
		t.Errorf("the progress line does not show the loss scale:\n%s", stderr)
	}
	b, err := os.ReadFile(filepath.Join(out, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i, l := range lines {
		var s struct {
			Scale   float64 `json:"loss_scale"`
			Skipped bool    `json:"skipped"`
		}
		if err := json.Unmarshal([]byte(l), &s); err != nil || s.Scale != 65536 || s.Skipped {
			t.Errorf("steps.jsonl line %d: %s (%v)", i+1, l, err)
		}
	}
	var sum struct {
		Precision string `json:"precision"`
		Skipped   *int   `json:"skipped_steps"`
	}
	b, err = os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil || json.Unmarshal(b, &sum) != nil || sum.Precision != "fp16" || sum.Skipped == nil || *sum.Skipped != 0 || len(lines) != 4 {
		t.Errorf("summary.json precision %q skipped %v (%v), %d steps", sum.Precision, sum.Skipped, err, len(lines))
	}
}

// An fp16 run whose scale halves down to min_loss_scale (2^40, far past
// fp16's range, hysteresis 1, the minimum 2^37) skips steps 1-3 for real
// overflows and stops at step 4 with one error naming the step and the
// scale; the checkpoint of step 3 is intact (every file verifies) and
// records the scale and the skipped steps.
func TestTrainFP16MinScale(t *testing.T) {
	out := t.TempDir()
	cfg := writeFile(t, "fp16.json", `{"train_micro_batch_size_per_gpu": 2,
  "fp16": {"enabled": true, "initial_scale_power": 40, "hysteresis": 1, "min_loss_scale": 137438953472},
  "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}`)
	_, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "8", "--no-progress", "--out", out, "--save-every", "1")
	if err == nil || !strings.Contains(err.Error(), "step 4: fp16 gradients overflow at loss scale 1.37438953472e+11, which is fp16.min_loss_scale") {
		t.Fatalf("got %v, want the min_loss_scale error of step 4\n%s", err, stderr)
	}
	m, files, err := checkpoint.Verify(filepath.Join(out, "checkpoints"))
	if err != nil || m.Step != 3 || len(files) == 0 {
		t.Fatalf("last checkpoint: step %v, %d files, %v; want step 3, intact", m, len(files), err)
	}
	if f := m.FP16; f == nil || f.SkippedSteps != 3 || f.Scaler.Scale != 137438953472 {
		t.Fatalf("checkpoint fp16 record %+v, want 3 skipped, scale 2^37", f)
	}
}

// An fp16 run none of whose steps updated the weights ends with one error
// (exit status 1) naming the cause and the key to change, after writing
// its outputs: every step overflowed (initial_scale_power 100: the
// default hysteresis 2 spends step 1, steps 2-6 halve it to 2^95; a static
// loss_scale 1e30) or every gradient flushed to zero (a static loss_scale 1e-30).
func TestTrainFP16NoUpdate(t *testing.T) {
	for _, c := range []struct{ fp16, want string }{
		{`"initial_scale_power": 100`, "strata train: fp16: all 6 steps overflowed and were skipped (loss scale 1.26765e+30 at the first, 3.96141e+28 now): no update reached the weights; lower fp16.initial_scale_power"},
		{`"loss_scale": 1e30`, "strata train: fp16: all 6 steps overflowed at the static fp16.loss_scale 1e+30 and were skipped"},
		{`"loss_scale": 1e-30`, "strata train: fp16: every gradient of 6 of the 6 steps flushed to zero at loss scale 1e-30 (a gradient norm of 0): no update reached the weights; raise fp16.loss_scale"},
	} {
		out := t.TempDir()
		cfg := writeFile(t, "fp16.json", `{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true, `+c.fp16+`}}`)
		_, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "6", "--no-progress", "--out", out)
		var line bytes.Buffer
		if code := printError("train", err, &line); code != 1 || !strings.HasPrefix(line.String(), c.want) {
			t.Errorf("%s: exit %d %q, want 1 and %q\n%s", c.fp16, code, line.String(), c.want, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "model.safetensors")); err != nil {
			t.Errorf("%s: the run's weights were not written: %v", c.fp16, err)
		}
	}
}
