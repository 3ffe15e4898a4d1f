package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// saveTinyCheckpoint writes a 2-rank checkpoint of the tiny model whose
// master weights are the model's seeded initialisation, and returns the
// directory and those weights.
func saveTinyCheckpoint(t *testing.T) (string, [][]float32) {
	t.Helper()
	shape, _ := model.Lookup("tiny")
	l, err := model.NewLayout(shape)
	if err != nil {
		t.Fatal(err)
	}
	const devices = 2
	st, err := checkpoint.NewState(l, devices, 3, 64, checkpoint.MixedPrecisionStates)
	if err != nil {
		t.Fatal(err)
	}
	st.Step = 7
	init := l.Init(1)
	k := st.StateIndex(shard.Master)
	for c, full := range init {
		n := st.Chunks[c].ShardElems
		for r := 0; r < devices; r++ {
			part := make([]float32, n)
			if lo := r * n; lo < len(full) {
				copy(part, full[lo:min(lo+n, len(full))])
			}
			copy(st.Shard(r, c, k), dtype.Bytes(part))
		}
	}
	dir := t.TempDir()
	if err := checkpoint.Save(dir, st); err != nil {
		t.Fatal(err)
	}
	return dir, init
}

func TestExportAndInspect(t *testing.T) {
	dir, init := saveTinyCheckpoint(t)

	out, _, err := run(t, "inspect", "--json", dir)
	if err != nil {
		t.Fatalf("inspect checkpoint: %v\n%s", err, out)
	}
	if !json.Valid([]byte(out)) || !strings.Contains(out, `"step": 7`) {
		t.Fatalf("inspect --json of the checkpoint printed:\n%s", out)
	}

	file := filepath.Join(t.TempDir(), "tiny.safetensors")
	if out, _, err = run(t, "export", dir, file); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	shape, _ := model.Lookup("tiny")
	l, _ := model.NewLayout(shape)
	got, _, err := hf.Import(file, l, hf.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for c := range init {
		for i := range init[c] {
			if got[c][i] != init[c][i] {
				t.Fatalf("chunk %d element %d: exported %v, checkpoint held %v", c, i, got[c][i], init[c][i])
			}
		}
	}
	out, _, err = run(t, "inspect", file)
	if err != nil || !strings.Contains(out, "wte") {
		t.Fatalf("inspect safetensors: %v\n%s", err, out)
	}

	hf := filepath.Join(t.TempDir(), "hf.safetensors")
	if _, _, err = run(t, "export", "--names", "hf", "--dtype", "bf16", dir, hf); err != nil {
		t.Fatal(err)
	}
	if out, _, _ = run(t, "inspect", hf); !strings.Contains(out, "h.0.attn.c_attn.weight") || !strings.Contains(out, "BF16") {
		t.Fatalf("hf export lacks GPT-2 names or bf16:\n%s", out)
	}
}

func TestExportInspectBadInput(t *testing.T) {
	dir, _ := saveTinyCheckpoint(t)
	// Corrupt one byte of a rank file: inspect and export must both refuse, naming the file.
	files, _ := filepath.Glob(filepath.Join(dir, "step-*", "rank-*.safetensors"))
	if len(files) == 0 {
		t.Fatal("no rank files written")
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x40
	if err := os.WriteFile(files[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"inspect", dir}, {"export", dir, filepath.Join(t.TempDir(), "x.safetensors")}} {
		_, _, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), filepath.Base(files[0])) {
			t.Errorf("%v with a flipped byte: err = %v, want one naming %s", args, err, filepath.Base(files[0]))
		}
	}
	for _, args := range [][]string{
		{"inspect"},
		{"inspect", "/does/not/exist"},
		{"export", dir},
		{"export", "--names", "gpt", dir, "x.safetensors"},
		{"export", "--dtype", "fp8", dir, "x.safetensors"},
	} {
		if _, _, err := run(t, args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

func TestTrainOutWritesWeights(t *testing.T) {
	dir := t.TempDir()
	if out, _, err := run(t, "train", "--steps", "2", "--out", dir, "--no-progress"); err != nil {
		t.Fatalf("train: %v\n%s", err, out)
	}
	shape, _ := model.Lookup("small") // the demonstration's model
	l, _ := model.NewLayout(shape)
	chunks, hdr, err := hf.Import(filepath.Join(dir, "model.safetensors"), l, hf.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) != len(l.Chunks) {
		t.Fatalf("imported %d chunks, layout has %d", len(chunks), len(l.Chunks))
	}
	if step := hdr.Metadata["step"]; step != "2" {
		t.Errorf("metadata step = %q, want 2", step)
	}
	// Trained weights differ from the initialisation (strata.seed defaults to 1).
	init := l.InitChunk(config.DefaultSeed, 1)
	same := true
	for i := range init {
		if init[i] != chunks[1][i] {
			same = false
			break
		}
	}
	if same {
		t.Error("exported block 0 equals its initialisation: were the trained weights written?")
	}
}
