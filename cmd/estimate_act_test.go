package cmd

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
)

type estimateActJSON struct {
	Activations struct {
		Micro   int `json:"micro_batch"`
		Seq     int `json:"seq"`
		Configs []struct {
			Name        string           `json:"name"`
			DeviceBytes int64            `json:"device_bytes"`
			HostBytes   int64            `json:"host_bytes"`
			Terms       map[string]int64 `json:"terms"`
		} `json:"configs"`
		Stages []struct {
			Stage      int              `json:"stage"`
			Model      int64            `json:"model_state_bytes"`
			Working    int64            `json:"working_set_bytes"`
			TotalBytes map[string]int64 `json:"total_bytes"`
		} `json:"stages"`
		Fit *struct {
			Fits   bool   `json:"fits"`
			Stage  int    `json:"stage"`
			Config string `json:"config"`
			Bytes  int64  `json:"bytes"`
		} `json:"fit"`
	} `json:"activations"`
}

// TestEstimateActivations: `strata estimate --model gpt-7b` (and
// llama-3-8b) at batch 1 × 2048 tokens prints each device's activations
// without checkpointing, with it and with cpu_checkpointing, each term
// named, as estimate.Activations computes them (what the engine
// measures: TestActivationPeakMatchesEstimate), and, given a budget, which
// configuration fits: on 8 devices in 80 GiB stage 1 without checkpointing
// for both; on one device in 80 GiB nothing for gpt-7b (16Ψ alone is 99
// GiB at every stage; stage 0 has no working set); with the optimizer and
// params on the host at stage 3 on one device, gpt-7b at micro-batch 8
// fits only with checkpointing.
func TestEstimateActivations(t *testing.T) {
	for _, c := range []struct {
		args             []string
		fits             bool
		stage            int
		config, contains string
	}{
		{[]string{"--model", "gpt-7b", "--devices", "8"}, true, 1, "none", "fits in 80.00 GiB per device: stage 1 with no activation checkpointing"},
		{[]string{"--model", "llama-3-8b", "--devices", "8"}, true, 1, "none", "fits in 80.00 GiB per device: stage 1"},
		{[]string{"--model", "gpt-7b"}, false, 0, "cpu_checkpointing", "nothing fits in 80.00 GiB per device: the least is stage 0"},
		{[]string{"--model", "gpt-7b", "--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu", "--batch", "8"}, true, 3, "checkpointing", "fits in 80.00 GiB per device: stage 3 with activation checkpointing ("},
	} {
		args := append([]string{"estimate", "--seq", "2048", "--hbm", "80GiB"}, c.args...)
		out, _, err := run(t, append(args, "--json")...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var doc estimateActJSON
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		a := doc.Activations
		shape, _ := model.Lookup(c.args[1])
		micro := 1
		if c.args[len(c.args)-2] == "--batch" {
			micro = 8
		}
		if a.Micro != micro || a.Seq != 2048 || len(a.Configs) != 3 {
			t.Fatalf("%v: activations %+v", args, a)
		}
		for i, want := range []model.ActivationOptions{{DType: gpu.BF16}, {DType: gpu.BF16, Checkpoint: shape.Layers},
			{DType: gpu.BF16, Checkpoint: shape.Layers, Offload: true}} {
			e := estimate.Activations(shape, micro, 2048, want)
			if got := a.Configs[i]; got.DeviceBytes != e.DeviceBytes() || got.HostBytes != e.HostInputBytes || len(got.Terms) != len(e.AllTerms()) {
				t.Errorf("%v: %s: %d bytes per device, %d on the host, %d terms; estimate.Activations %d, %d, %d",
					args, got.Name, got.DeviceBytes, got.HostBytes, len(got.Terms), e.DeviceBytes(), e.HostInputBytes, len(e.AllTerms()))
			}
		}
		none, ck, cpu := a.Configs[0].DeviceBytes, a.Configs[1].DeviceBytes, a.Configs[2].DeviceBytes
		if !(8*ck < none && cpu < ck) {
			t.Errorf("%v: activations %d without checkpointing, %d with, %d with cpu_checkpointing", args, none, ck, cpu)
		}
		if f := a.Fit; f == nil || f.Fits != c.fits || f.Stage != c.stage || f.Config != c.config {
			t.Errorf("%v: fit %+v, want fits %t at stage %d with %s", args, f, c.fits, c.stage, c.config)
		}
		for _, st := range a.Stages {
			for i, k := range a.Configs {
				if st.TotalBytes[k.Name] != st.Model+st.Working+a.Configs[i].DeviceBytes {
					t.Errorf("%v: stage %d %s: total %d is not model state + working set + activations", args, st.Stage, k.Name, st.TotalBytes[k.Name])
				}
			}
		}
		text, _, err := run(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"activations per device", "none", "checkpointing", "cpu_checkpointing", "saved block inputs in host memory",
			model.TermBlocks, model.TermWorkSet, model.TermLossChunk, estimate.RestoredInputTerm, c.contains} {
			if !strings.Contains(text, want) {
				t.Errorf("%v: the table lacks %q:\n%s", args, want, text)
			}
		}
		t.Logf("%v: %s", c.args, strings.SplitN(text[strings.Index(text, "activations per device,"):], "\n\n", 2)[0])
	}
}

// TestTrainCheckpointingSummary: `strata train` of the small model at
// stage 3 on 2 devices with the activation_checkpointing block has the
// losses of the same run without it, bit for bit, and summary.json's
// per-device activation_peak_bytes at most half; each within 5 % of what
// `strata estimate --config` prints for that config.
func TestTrainCheckpointingSummary(t *testing.T) {
	const base = `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95]}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
  %s
  "strata": {"model": "small", "devices": 2, "seq_len": 128, "seed": 3}
}`
	var peaks []int64
	var lossRuns [][]float64
	for _, block := range []string{"", `"activation_checkpointing": {"partition_activations": true, "contiguous_memory_optimization": true},`} {
		cfg := writeFile(t, "small.json", strings.Replace(base, "%s", block, 1))
		dir := t.TempDir()
		_, stderr, err := run(t, "train", "--config", cfg, "--steps", "3", "--out", dir, "--no-progress")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if block != "" && !strings.Contains(stderr, "note: accepted but not used (Strata does without them: config/README.md): activation_checkpointing.partition_activations, activation_checkpointing.contiguous_memory_optimization\n") {
			t.Errorf("no notice of partition_activations:\n%s", stderr)
		}
		var sum struct {
			PerDevice []struct {
				Peak     int64   `json:"activation_peak_bytes"`
				Estimate int64   `json:"activation_estimate_bytes"`
				Ratio    float64 `json:"ratio_activation_estimate"`
			} `json:"per_device"`
		}
		b, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
		if err := json.Unmarshal(b, &sum); err != nil || len(sum.PerDevice) != 2 {
			t.Fatalf("summary.json: %v: %s", err, b)
		}
		out, _, err := run(t, "estimate", "--config", cfg, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var est estimateActJSON
		if err := json.Unmarshal([]byte(out), &est); err != nil {
			t.Fatal(err)
		}
		want := est.Activations.Configs[0].DeviceBytes
		if block != "" {
			want = est.Activations.Configs[1].DeviceBytes
		}
		for _, d := range sum.PerDevice {
			if r := float64(d.Peak) / float64(want); math.Abs(r-1) > 0.05 || d.Estimate != want {
				t.Errorf("activation peak %d, strata estimate %d (%.4f), summary's estimate %d", d.Peak, want, r, d.Estimate)
			}
		}
		peaks = append(peaks, sum.PerDevice[0].Peak)
		lossRuns = append(lossRuns, losses(t, dir))
	}
	if 2*peaks[1] > peaks[0] {
		t.Errorf("activation peak %d with checkpointing, %d without: more than half", peaks[1], peaks[0])
	}
	for i := range lossRuns[0] {
		if lossRuns[0][i] != lossRuns[1][i] {
			t.Errorf("step %d: loss %v with checkpointing, %v without", i+1, lossRuns[1][i], lossRuns[0][i])
		}
	}
	t.Logf("small, stage 3, 2 devices: activation peak %d without checkpointing, %d with (%.3f)", peaks[0], peaks[1], float64(peaks[1])/float64(peaks[0]))
}

// TestEstimateBatchOverflow: a micro-batch whose activation sizes pass
// int64 (gpt-7b at 10^11 × 2048 tokens printed negative sizes and exited
// 0) is a usage error: exit 2, one line naming the flag, nothing on stdout;
// from a config the line names the config's key. So is an --align that
// wraps the model state's sizes (they printed as 0 B).
func TestEstimateBatchOverflow(t *testing.T) {
	cfg := writeFile(t, "cfg.json", `{"train_micro_batch_size_per_gpu": 2000000000, "strata": {"model": "gpt-7b", "seq_len": 2048}}`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"estimate", "--model", "gpt-7b", "--batch", "100000000000", "--seq", "2048"}, "strata estimate: --batch 100000000000 × --seq 2048 tokens a micro-batch: the activation sizes pass 2^63 bytes"},
		{[]string{"estimate", "--model", "gpt-7b", "--batch", "100000000000", "--seq", "2048", "--json"}, "strata estimate: --batch 100000000000 × --seq 2048 tokens"},
		{[]string{"estimate", "--config", cfg}, "strata estimate: train_micro_batch_size_per_gpu 2000000000 × strata.seq_len 2048 tokens"},
		// The model state's padding: 0 B per device before.
		{[]string{"estimate", "--model", "gpt-7b", "--align", "4611686018427387904"}, "strata estimate: --align 4611686018427387904 on --devices 1: the model state's sizes pass 2^63 bytes"},
	} {
		var out, errOut, line strings.Builder
		path, err := execute(append([]string{"strata"}, c.args...), &out, &errOut)
		if st := printError(path, err, &line); st != 2 {
			t.Errorf("%q: exit status %d, want 2 (%v)\n%s", c.args, st, err, out.String())
			continue
		}
		if l := line.String(); strings.Count(l, "\n") != 1 || !strings.HasPrefix(l, c.want) || out.Len() != 0 {
			t.Errorf("%q: got %q (stdout %q), want one line %q...", c.args, l, out.String(), c.want)
		}
	}
}
