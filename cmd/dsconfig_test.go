package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// A plain DeepSpeed config (no strata section) with train_batch_size 16 =
// micro 4 × accumulation 2 × 2 devices, run with --devices 2, trains, and
// equals the run whose config says strata.devices 2, bit for bit: the flag
// decides the device count, as DeepSpeed's launcher does. Without the flag
// the batch error names where each factor came from.
func TestDevicesFlagDecides(t *testing.T) {
	const batch = `"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2`
	plain := writeFile(t, "plain.json", `{`+batch+`, "zero_optimization": {"stage": 2}}`)
	withDevices := writeFile(t, "devices.json", `{`+batch+`, "zero_optimization": {"stage": 2}, "strata": {"devices": 2}}`)
	a, b := t.TempDir(), t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", plain, "--devices", "2", "--steps", "3", "--no-progress", "--out", a); err != nil {
		t.Fatalf("plain config with --devices 2: %v\n%s", err, stderr)
	}
	if _, stderr, err := runApp(t, "train", "--config", withDevices, "--steps", "3", "--no-progress", "--out", b); err != nil {
		t.Fatalf("strata.devices 2: %v\n%s", err, stderr)
	}
	for _, f := range []string{"model.safetensors", "config.json"} {
		x, errA := os.ReadFile(filepath.Join(a, f))
		y, errB := os.ReadFile(filepath.Join(b, f))
		if errA != nil || errB != nil || !bytes.Equal(x, y) {
			t.Errorf("%s differs between --devices 2 and strata.devices 2 (%v, %v)", f, errA, errB)
		}
	}
	if la, lb := losses(t, a), losses(t, b); len(la) != 3 || len(lb) != 3 || la[2] != lb[2] {
		t.Errorf("losses differ: %v vs %v", la, lb)
	}
	_, _, err := runApp(t, "train", "--config", plain, "--steps", "1")
	if err == nil || !strings.Contains(err.Error(), "devices 1 = 8 (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps from "+plain+"; devices 1 is the default (no --devices, no strata.devices))") {
		t.Errorf("without --devices: %v", err)
	}
	// estimate: the same flag decides there (the config names no model:
	// --model does).
	out, _, err := runApp(t, "estimate", "--config", plain, "--model", "tiny", "--devices", "2")
	if err != nil || !strings.Contains(out, "N = 2 devices") {
		t.Errorf("estimate --devices 2: %v\n%s", err, out)
	}
}

// DeepSpeed's documented ZeRO-3 offload and ZeRO-Infinity (NVMe) example
// configs, every optimizer, scheduler, batch and clipping value "auto", run
// as written (the NVMe one with its nvme_path pointed at a scratch
// directory); the values Strata chose are listed in one notice and written
// to the run's config.json, and the flags fill them.
func TestDeepSpeedAutoExamples(t *testing.T) {
	offload := filepath.Join("..", "testdata", "configs", "ds_zero3_offload.json")
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "configs", "ds_zero_infinity_nvme.json"))
	if err != nil {
		t.Fatal(err)
	}
	nvmeDir := nvmetest.Dir(t)
	infinity := writeFile(t, "infinity.json", strings.ReplaceAll(string(raw), `"/local_nvme"`, `"`+nvmeDir+`"`))
	for _, tc := range []struct {
		name, path string
		flags      []string
		lr         float64
		micro      int
		warmup     int
		total      int
	}{
		{"zero3 offload, defaults", offload, nil, 1e-3, 4, 0, 0},
		{"zero3 offload, --warmup-steps 0 (the default, said)", offload, []string{"--warmup-steps", "0"}, 1e-3, 4, 0, 0},
		{"zero-infinity, flags", infinity, []string{"--lr", "3e-4", "--micro-batch", "2", "--warmup-steps", "1"}, 3e-4, 2, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			args := append([]string{"train", "--config", tc.path, "--steps", "2", "--no-progress", "--out", out}, tc.flags...)
			_, stderr, err := runApp(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			if n := strings.Count(stderr, `note: "auto" values filled in`); n != 1 {
				t.Errorf("%d notices of the \"auto\" values, want 1:\n%s", n, stderr)
			}
			b, err := os.ReadFile(filepath.Join(out, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Micro     int     `json:"train_micro_batch_size_per_gpu"`
				Train     int     `json:"train_batch_size"`
				Clip      float64 `json:"gradient_clipping"`
				Optimizer struct {
					Params struct {
						LR    float64    `json:"lr"`
						Betas [2]float64 `json:"betas"`
						Eps   float64    `json:"eps"`
					} `json:"params"`
				} `json:"optimizer"`
				Scheduler struct {
					Params struct {
						MaxLR  float64 `json:"warmup_max_lr"`
						Warmup int     `json:"warmup_num_steps"`
						Total  int     `json:"total_num_steps"`
					} `json:"params"`
				} `json:"scheduler"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			p, s := got.Optimizer.Params, got.Scheduler.Params
			if got.Micro != tc.micro || got.Train != tc.micro || got.Clip != 1 || p.LR != tc.lr || p.Betas != [2]float64{0.9, 0.999} || p.Eps != 1e-8 ||
				s.MaxLR != tc.lr || s.Warmup != tc.warmup || s.Total != tc.total {
				t.Errorf("config.json does not hold the chosen values: %+v\n%s", got, b)
			}
			if len(losses(t, out)) != 2 {
				t.Errorf("not 2 steps trained")
			}
		})
	}
}

// A flag that disagrees with a value the file writes out is refused.
func TestAutoFlagConflict(t *testing.T) {
	cfg := writeFile(t, "lr.json", `{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}`)
	_, _, err := runApp(t, "train", "--config", cfg, "--lr", "0.001", "--steps", "1")
	if err == nil || !strings.Contains(err.Error(), `optimizer.params.lr: 0.01 in `+cfg+`, but --lr 0.001: write "auto"`) {
		t.Errorf("got %v", err)
	}
}

// Resuming on a device count that does not split the saved global batch
// says what differs and how to go on, not a position inside manifest.json;
// a count that does split it reshards and trains on.
func TestResumeOtherDevices(t *testing.T) {
	cfg := writeFile(t, "r.json", `{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}, "strata": {"devices": 2}}`)
	run := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--steps", "2", "--save-every", "2", "--no-progress", "--out", run); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	_, _, err := runApp(t, "train", "--resume", run, "--devices", "3", "--steps", "3", "--no-progress", "--out", t.TempDir())
	if err == nil || strings.Contains(err.Error(), "manifest.json:") || !strings.Contains(err.Error(), "saved on 2 devices with train_batch_size 16") ||
		!strings.Contains(err.Error(), "pick --devices so that 2 × devices divides 16") {
		t.Errorf("resume on 3 devices: %v", err)
	}
	if _, stderr, err := runApp(t, "train", "--resume", run, "--devices", "4", "--steps", "3", "--no-progress", "--out", t.TempDir()); err != nil {
		t.Errorf("resume on 4 devices (resharded): %v\n%s", err, stderr)
	}
}

// inspect, export and train --resume accept the same forms of a
// checkpoint: a run's --out directory, its checkpoints/, a step directory,
// and a manifest.json.
func TestCheckpointPathForms(t *testing.T) {
	run := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--steps", "2", "--save-every", "2", "--no-progress", "--out", run); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	step := filepath.Join(run, "checkpoints", "step-00000002")
	for _, p := range []string{run, filepath.Join(run, "checkpoints"), step, filepath.Join(step, "manifest.json")} {
		out, _, err := runApp(t, "inspect", "--json", p)
		var got struct {
			Dir string `json:"dir"`
		}
		if err != nil || json.Unmarshal([]byte(out), &got) != nil || filepath.Clean(got.Dir) != step {
			t.Errorf("inspect %s: %v, dir %q\n%s", p, err, got.Dir, out)
		}
		dst := filepath.Join(t.TempDir(), "m.safetensors")
		if _, _, err := runApp(t, "export", p, dst); err != nil {
			t.Errorf("export %s: %v", p, err)
		}
		if _, stderr, err := runApp(t, "train", "--resume", p, "--steps", "3", "--no-progress", "--out", t.TempDir()); err != nil {
			t.Errorf("train --resume %s: %v\n%s", p, err, stderr)
		}
	}
}

// A CPU-backend hbm_bytes the host cannot hold is refused before training
// starts, saying what to lower.
func TestTrainHostRAM(t *testing.T) {
	cfg := writeFile(t, "big.json", `{"train_micro_batch_size_per_gpu": 2, "strata": {"devices": 2, "hbm_bytes": "1024TiB"}}`)
	out := t.TempDir()
	_, _, err := runApp(t, "train", "--config", cfg, "--steps", "1", "--out", out)
	if err == nil || !strings.Contains(err.Error(), "lower strata.hbm_bytes to at most") {
		t.Errorf("got %v", err)
	}
	if _, serr := os.Stat(filepath.Join(out, "config.json")); serr == nil {
		t.Error("the refused run wrote config.json: it started")
	}
}
