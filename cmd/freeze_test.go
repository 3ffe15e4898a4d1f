package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type estimateDoc struct {
	FrozenChunks []int `json:"frozen_chunks"`
	FrozenParams int64 `json:"frozen_params"`
	Params       int64 `json:"params"`
	Stages       []struct {
		Stage       int   `json:"stage"`
		DeviceBytes int64 `json:"device_bytes"`
		HostBytes   int64 `json:"host_bytes"`
		NVMeBytes   int64 `json:"nvme_bytes"`
		FrozenSaved *struct {
			HBM  int64 `json:"hbm"`
			Host int64 `json:"host"`
			NVMe int64 `json:"nvme"`
		} `json:"frozen_saved_bytes"`
	} `json:"stages"`
}

func estimateJSON(t *testing.T, args ...string) estimateDoc {
	t.Helper()
	out, stderr, err := runApp(t, append([]string{"estimate", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("estimate %v: %v\n%s", args, err, stderr)
	}
	var doc estimateDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("estimate --json printed %q: %v", out, err)
	}
	return doc
}

// TestEstimateFreeze: `strata estimate --freeze` (and strata.freeze in
// --config) counts the frozen chunks at their params only: every stage's
// bytes are those without freezing less exactly what it reports as not
// kept, per device, on the host and on NVMe; the text names the frozen
// chunks and writes the formula on Ψₜ. Patterns that match nothing, or
// part of a chunk, or a parameter count without tensor names are refused.
func TestEstimateFreeze(t *testing.T) {
	for _, offload := range [][]string{{}, {"--offload-optimizer", "cpu"}, {"--offload-optimizer", "nvme", "--offload-param", "nvme"}} {
		args := append([]string{"--model", "tiny", "--devices", "2"}, offload...)
		all := estimateJSON(t, args...)
		frozen := estimateJSON(t, append(args, "--freeze", "wte,wpe")...)
		if frozen.FrozenParams != 256*32+64*32 || len(frozen.FrozenChunks) != 1 || frozen.FrozenChunks[0] != 0 || all.FrozenParams != 0 {
			t.Fatalf("%v: frozen chunks %v, %d params (without --freeze %d)", offload, frozen.FrozenChunks, frozen.FrozenParams, all.FrozenParams)
		}
		for i, s := range frozen.Stages {
			a := all.Stages[i]
			if s.FrozenSaved == nil {
				if s.DeviceBytes != 0 { // stages the offload refuses have no figures
					t.Errorf("%v stage %d: no frozen_saved_bytes", offload, s.Stage)
				}
				continue
			}
			f := *s.FrozenSaved
			if a.DeviceBytes-s.DeviceBytes != f.HBM || a.HostBytes-s.HostBytes != f.Host || a.NVMeBytes-s.NVMeBytes != f.NVMe || f.HBM+f.Host+f.NVMe == 0 {
				t.Errorf("%v stage %d: device %d -> %d, host %d -> %d, nvme %d -> %d; reported not kept %+v",
					offload, s.Stage, a.DeviceBytes, s.DeviceBytes, a.HostBytes, s.HostBytes, a.NVMeBytes, s.NVMeBytes, f)
			}
		}
	}
	out, _, err := runApp(t, "estimate", "--model", "tiny", "--devices", "2", "--freeze", "w?e", "--freeze", "h.0.")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"frozen: embeddings, block 0 (", "2Ψ/N + 14Ψₜ/N", "not kept, frozen"} {
		if !strings.Contains(out, want) {
			t.Errorf("estimate --freeze does not say %q:\n%s", want, out)
		}
	}
	cfg := writeFile(t, "freeze.json", `{"train_micro_batch_size_per_gpu": 1, "strata": {"model": "tiny", "devices": 2, "freeze": ["w?e", "h.0."]}}`)
	fromConfig := estimateJSON(t, "--config", cfg, "--stage", "3")
	byFlag := estimateJSON(t, "--model", "tiny", "--devices", "2", "--stage", "3", "--persistence-threshold", "100000", "--freeze", "w?e,h.0.")
	if fromConfig.FrozenParams != byFlag.FrozenParams || fromConfig.Stages[0].DeviceBytes != byFlag.Stages[0].DeviceBytes || fromConfig.FrozenParams == 0 {
		t.Errorf("strata.freeze in --config: %+v; --freeze: %+v", fromConfig, byFlag)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "gpt2", "--freeze", "wte"}, `chunk "embeddings": the patterns match wte but not wpe`},
		{[]string{"--model", "tiny", "--freeze", "embed_tokens"}, `pattern "embed_tokens" matches no tensor of tiny (its tensors are named like wte, wpe, h.0.ln_1.weight`},
		{[]string{"--params", "1B", "--freeze", "wte"}, "give --model or --config, not --params"},
		{[]string{"--model", "tiny", "--freeze", "w?e,h.,ln_f"}, "freezes every chunk of tiny"},
	} {
		_, _, err := runApp(t, append([]string{"estimate"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("estimate %v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestTrainFreeze: `strata train` with strata.freeze prints which chunks
// are frozen (a note, and the summary's line with what they do not keep)
// and writes the same figures to summary.json; the loss still goes down.
func TestTrainFreeze(t *testing.T) {
	cfg := writeFile(t, "freeze.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95]}},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 3, "freeze": ["w?e", "ln_f"]}
}`)
	dir := t.TempDir()
	stdout, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "12", "--out", dir, "--no-progress")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "note: strata.freeze: embeddings, ln_f frozen (10304 of 35712 params)") {
		t.Errorf("no note of the frozen chunks:\n%s", stderr)
	}
	if !strings.Contains(stdout, "frozen: embeddings, ln_f (") || !strings.Contains(stdout, "not kept: optimizer state (master, m, v) ") {
		t.Errorf("the summary does not report the frozen chunks:\n%s", stdout)
	}
	var sum struct {
		Frozen struct {
			Chunks         []string `json:"chunks"`
			Params         int64    `json:"params"`
			OptimizerBytes int64    `json:"optimizer_state_saved_bytes"`
			GradBytes      int64    `json:"grad_saved_bytes"`
			HostBytes      int64    `json:"saved_host_bytes"`
		} `json:"frozen"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatalf("summary.json: %v: %s", err, b)
	}
	// Each rank's shard of the embeddings (10240 params: 5120 each) and
	// of ln_f (64: 32, aligned to 64): master, m, v 12 B each, a bf16
	// gradient shard on the device and its copy on the host.
	const shards = 2 * (5120 + 64)
	f := sum.Frozen
	if f.Params != 10304 || len(f.Chunks) != 2 || f.OptimizerBytes != 12*shards || f.GradBytes != 4*shards || f.HostBytes != 14*shards {
		t.Errorf("summary.json frozen: %+v", f)
	}
	if l := losses(t, dir); !(l[len(l)-1] < l[0]) {
		t.Errorf("loss did not go down: %v", l)
	}
}
