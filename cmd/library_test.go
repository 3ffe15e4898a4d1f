package cmd

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
)

// TestCustomModelCheckpoint: the commands and a checkpoint of a model a Go
// program defines (docs/library.md). inspect names the model, export writes
// its weights under its own tensor names and refuses a Hugging Face
// directory, and train --init refuses it, saying why.
func TestCustomModelCheckpoint(t *testing.T) {
	l, err := model.CustomLayout("mlp", []model.Chunk{
		{Name: "in", Tensors: []model.Tensor{{Name: "w1", Shape: []int{8, 4}}, {Name: "b1", Shape: []int{8}}}},
		{Name: "out", Tensors: []model.Tensor{{Name: "w2", Shape: []int{4, 8}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.NewState(l, 2, 1, 1, checkpoint.MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := checkpoint.SaveWith(dir, st, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	out, _, err := run(t, "inspect", dir)
	if err != nil || !strings.Contains(out, "model         mlp (custom") {
		t.Errorf("inspect: %v\n%s", err, out)
	}
	w := filepath.Join(t.TempDir(), "w.safetensors")
	if out, _, err := run(t, "export", dir, w); err != nil || !strings.Contains(out, "(72 params)") {
		t.Errorf("export: %v\n%s", err, out)
	}
	if _, _, err := hf.Import(w, l, hf.ImportOptions{}); err != nil {
		t.Errorf("import of the export: %v", err)
	}
	if _, _, err := run(t, "export", "--format", "hf", dir, filepath.Join(t.TempDir(), "hf")); err == nil || !strings.Contains(err.Error(), "a Hugging Face config.json cannot describe") {
		t.Errorf("export --format hf: %v", err)
	}
	if _, _, err := run(t, "train", "--init", dir, "--steps", "1"); err == nil || !strings.Contains(err.Error(), `a checkpoint of "mlp", a model a Go program defines`) {
		t.Errorf("train --init: %v", err)
	}
}
