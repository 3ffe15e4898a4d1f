package config_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
)

func tinyShape(name string) (config.Shape, error) {
	return config.Shape{Name: name, Layers: 4, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64}, nil
}

// TestActivationCheckpointing: the presence of the block turns
// checkpointing on (every block unless number_checkpoints says how many),
// cpu_checkpointing is read, DeepSpeed's other knobs of the block are
// accepted with a notice of what Strata does instead when set, and the
// printed config parses back to the same run; bad values are one error
// each, at their key.
func TestActivationCheckpointing(t *testing.T) {
	opts := config.Options{LookupShape: tinyShape}
	off, err := config.Parse([]byte(`{"train_micro_batch_size_per_gpu": 1}`), "a.json", opts)
	if err != nil {
		t.Fatal(err)
	}
	if off.ActivationCheckpointing != nil || off.CheckpointedBlocks(4) != 0 || off.ActivationsFP32() {
		t.Errorf("without the block: %+v, %d blocks, fp32 %t", off.ActivationCheckpointing, off.CheckpointedBlocks(4), off.ActivationsFP32())
	}
	for _, c := range []struct {
		block   string
		blocks  int
		cpu     bool
		notices []string
	}{
		{`{}`, 4, false, nil},
		{`{"number_checkpoints": 2, "cpu_checkpointing": true}`, 2, true, nil},
		{`{"partition_activations": true, "contiguous_memory_optimization": true, "synchronize_checkpoint_boundary": true, "profile": true, "number_checkpoints": null}`, 4, false,
			[]string{"partition_activations", "contiguous_memory_optimization", "synchronize_checkpoint_boundary", "profile"}},
		{`{"partition_activations": false}`, 4, false, nil},
	} {
		js := `{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "activation_checkpointing": ` + c.block + `, "strata": {"activation_dtype": "fp32"}}`
		cfg, err := config.Parse([]byte(js), "a.json", opts)
		if err != nil {
			t.Fatalf("%s: %v", c.block, err)
		}
		if cfg.CheckpointedBlocks(4) != c.blocks || cfg.ActivationCheckpointing.CPUCheckpointing != c.cpu || !cfg.ActivationsFP32() {
			t.Errorf("%s: %d blocks, cpu %t, fp32 %t", c.block, cfg.CheckpointedBlocks(4), cfg.ActivationCheckpointing.CPUCheckpointing, cfg.ActivationsFP32())
		}
		var got []string
		for _, n := range cfg.Ignored() {
			if k, ok := strings.CutPrefix(n, "activation_checkpointing."); ok {
				got = append(got, k[:strings.Index(k, " ")])
			}
		}
		if !reflect.DeepEqual(got, c.notices) {
			t.Errorf("%s: notices about %q, want %q", c.block, got, c.notices)
		}
		back, err := config.Parse(cfg.JSON(), "printed", opts)
		if err != nil {
			t.Fatalf("%s: printed config: %v\n%s", c.block, err, cfg.JSON())
		}
		if !reflect.DeepEqual(back.ActivationCheckpointing, cfg.ActivationCheckpointing) || back.Strata.ActivationDType != "fp32" {
			t.Errorf("%s: printed and parsed back: %+v, %q", c.block, back.ActivationCheckpointing, back.Strata.ActivationDType)
		}
	}
	for _, c := range []struct{ js, want string }{
		{`"activation_checkpointing": {"number_checkpoints": 5}`, "activation_checkpointing.number_checkpoints: 5 is more than the model's 4 blocks"},
		{`"activation_checkpointing": {"number_checkpoints": 0}`, "activation_checkpointing.number_checkpoints: 0 must be at least 1"},
		{`"activation_checkpointing": {"cpu_checkpointing": "yes"}`, "activation_checkpointing.cpu_checkpointing: want true or false"},
		{`"activation_checkpointing": true`, "activation_checkpointing: want an object"},
		{`"activation_checkpointing": {"cpu_checkpoint": true}`, `unknown key "activation_checkpointing.cpu_checkpoint"; did you mean "activation_checkpointing.cpu_checkpointing"?`},
		{`"strata": {"activation_dtype": "fp16"}`, `strata.activation_dtype: "fp16" is not "bf16" or "fp32"`},
	} {
		_, err := config.Parse([]byte(`{"train_micro_batch_size_per_gpu": 1, `+c.js+`}`), "bad.json", opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.js, err, c.want)
		}
	}
}
