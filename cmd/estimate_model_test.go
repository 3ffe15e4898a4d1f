package cmd

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/model"
)

// estimateShapeLlama is a Llama shape (grouped-query attention, an untied
// head) that is no built-in one: what the estimate counts can only come
// from the directory it is given.
var estimateShapeLlama = model.Shape{Arch: model.ArchLlama, Layers: 3, Dim: 48, Heads: 4, KVHeads: 2, FFN: 96, Vocab: 300, MaxSeq: 64, RopeTheta: 10000, NormEps: 1e-5}

// TestEstimateModelHFDir: `strata estimate --model HF_DIR` reads the
// directory's config.json as train --init does (it was refused: "unknown
// shape"), and its Ψ is the model's parameter count; with a --config that
// names no model, --model gives the shape (the config the rest).
func TestEstimateModelHFDir(t *testing.T) {
	s := estimateShapeLlama
	dir := filepath.Join(t.TempDir(), "llama-test")
	writeHFModel(t, dir, s, 1)
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	doc := estimateJSON(t, "--model", dir, "--devices", "2")
	if doc.Params != l.ParamCount() || doc.Params != s.ParamCount() {
		t.Errorf("estimate --model %s: Ψ = %d, the model has %d", dir, doc.Params, l.ParamCount())
	}
	if len(doc.Stages) != 4 || doc.Stages[3].DeviceBytes <= 0 {
		t.Errorf("estimate --model HF_DIR: stages %+v", doc.Stages)
	}
	cfg := writeFile(t, "ds.json", `{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": "auto"}}`)
	doc = estimateJSON(t, "--config", cfg, "--model", dir)
	if doc.Params != l.ParamCount() || len(doc.Stages) != 1 || doc.Stages[0].Stage != 3 {
		t.Errorf("estimate --config (no strata.model) --model HF_DIR: Ψ = %d, stages %+v; want %d at stage 3", doc.Params, doc.Stages, l.ParamCount())
	}
}

// TestEstimateModelRun: `strata estimate --model RUN` takes the shape a
// Strata run records: its checkpoint's manifest (a run directory with
// checkpoints, a step directory), or the config.json of a run that saved
// none.
func TestEstimateModelRun(t *testing.T) {
	cfg := writeFile(t, "run.json", strings.Replace(dataConfig, `"model": "tiny"`, `"model": "tiny-llama"`, 1))
	want, err := model.Lookup("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	saved, plain := t.TempDir(), t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "1", "--out", saved, "--save-every", "1"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "1", "--out", plain); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	step, err := filepath.Glob(filepath.Join(saved, "checkpoints", "step*"))
	if err != nil || len(step) == 0 {
		t.Fatalf("no checkpoint in %s (%v)", saved, err)
	}
	for _, path := range []string{saved, step[0], plain} {
		if doc := estimateJSON(t, "--model", path); doc.Params != want.ParamCount() {
			t.Errorf("estimate --model %s: Ψ = %d, the run trains tiny-llama (%d)", path, doc.Params, want.ParamCount())
		}
	}
	_, _, err = runApp(t, "estimate", "--model", filepath.Join(t.TempDir(), "none"))
	if err == nil || !strings.Contains(err.Error(), "neither a named shape") || exitCode(err) != 2 {
		t.Errorf("estimate --model MISSING: %v", err)
	}
}

// TestEstimateConfigWithoutModel: a DeepSpeed config without strata.model
// (DeepSpeed's own ZeRO-3 example) and no --model is refused in one line,
// exit status 2, saying how to name the model: it estimated the built-in
// tiny (35,712 parameters) without a word.
func TestEstimateConfigWithoutModel(t *testing.T) {
	cfg := filepath.Join("..", "testdata", "configs", "ds_zero3_offload.json")
	var stdout, stderr bytes.Buffer
	code := printError("estimate", Run([]string{"strata", "estimate", "--config", cfg}, &stdout, &stderr), &stderr)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if code != 2 || stdout.Len() != 0 || len(lines) != 1 || !strings.Contains(lines[0], "names no model (strata.model): give --model") {
		t.Errorf("estimate --config without strata.model: exit %d, stdout %q, stderr:\n%s", code, stdout.String(), stderr.String())
	}
	// --params still estimates Ψ alone from it.
	if doc := estimateJSON(t, "--config", cfg, "--params", "1B"); doc.Params != 1e9 {
		t.Errorf("estimate --config --params 1B: Ψ = %d", doc.Params)
	}
	// And a named shape gives it its model.
	if doc := estimateJSON(t, "--config", cfg, "--model", "small"); doc.Params == 35712 {
		t.Errorf("estimate --config --model small estimated tiny")
	}
}

// exitCode is the exit status Main gives err.
func exitCode(err error) int { return printError("", err, &bytes.Buffer{}) }
