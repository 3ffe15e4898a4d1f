package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestJob runs the whole job on the tiny base it makes: the LoRA run over
// NVMe learns the new sentence, generation continues it, and both exports
// are written.
func TestJob(t *testing.T) {
	ctx, work := t.Context(), t.TempDir()
	base, err := writeTinyModel(ctx, work)
	if err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(work, "train.txt")
	if err := os.WriteFile(text, bytes.Repeat([]byte("pack my box with five dozen liquor jugs. "), 300), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	run := filepath.Join(work, "run")
	if err := job(ctx, base, text, nvmetest.Dir(t), run, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`trained: loss ([0-9.]+) -> ([0-9.]+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no loss line:\n%s", out.String())
	}
	first, _ := strconv.ParseFloat(m[1], 64)
	last, _ := strconv.ParseFloat(m[2], 64)
	if last > first/4 {
		t.Errorf("LoRA over NVMe: loss %v -> %v, want it to fall fourfold:\n%s", first, last, out.String())
	}
	if !bytes.Contains(out.Bytes(), []byte(`generated "box with`)) {
		t.Errorf("generation does not continue the trained sentence:\n%s", out.String())
	}
	for _, f := range []string{"peft/adapter_model.safetensors", "peft/adapter_config.json", "hf/config.json", "hf/model.safetensors"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Errorf("export: %v", err)
		}
	}
}
