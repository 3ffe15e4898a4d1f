package cmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// qloraConfig is a LoRA run of the tiny model with its base offloaded to
// host RAM in base_dtype %s, at the default
// stage3_param_persistence_threshold (1e5: above every chunk).
const qloraConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 5, "lora": {"r": 2, "alpha": 4, "target_modules": "all-linear", "base_dtype": %q}}
}`

// TestQLoRASmallModelAgrees: strata.lora.base_dtype nf4 on the tiny
// model, every chunk under the default persistence threshold, is what
// `strata estimate` says and train does: the base's nf4 codes in host
// RAM (the estimate's param bytes there, the tier store's measured homes
// equal to the estimate's), only the adapters filed as persistent in the
// summary, "nf4" named at start-up, and losses that are not the bf16
// base's. With a bf16 base every chunk stays on the devices, and the
// summary's tiers line says so rather than "params in host".
func TestQLoRASmallModelAgrees(t *testing.T) {
	type summary struct {
		PerDevice []struct {
			EstimateBytes   int64 `json:"estimate_bytes"`
			PersistentBytes int64 `json:"persistent_bytes"`
		} `json:"per_device"`
		Tier struct {
			HostHomeBytes int64 `json:"host_home_bytes"`
		} `json:"tier"`
	}
	type estimateJSON struct {
		Stages []struct {
			DeviceBytes int64                       `json:"device_bytes"`
			HostBytes   int64                       `json:"host_bytes"`
			PerRank     map[string]map[string]int64 `json:"per_rank"`
		} `json:"stages"`
	}
	dir := t.TempDir()
	run := func(base string) (stderr string, sum summary, est estimateJSON, loss []float64) {
		t.Helper()
		cfg := writeFile(t, base+".json", strings.Replace(qloraConfig, "%q", `"`+base+`"`, 1))
		out, errOut, err := runApp(t, "estimate", "--config", cfg, "--json")
		if err != nil {
			t.Fatalf("estimate %s: %v\n%s", base, err, errOut)
		}
		if err := json.Unmarshal([]byte(out), &est); err != nil || len(est.Stages) != 1 {
			t.Fatalf("estimate --json %s: %v\n%s", base, err, out)
		}
		runDir := filepath.Join(dir, base)
		stdout, stderr, err := runApp(t, trainArgs(cfg, "--steps", "3", "--out", runDir)...)
		stderr = stdout + stderr
		if err != nil {
			t.Fatalf("train %s: %v\n%s", base, err, stderr)
		}
		b, err := os.ReadFile(filepath.Join(runDir, "summary.json"))
		if err != nil || json.Unmarshal(b, &sum) != nil || len(sum.PerDevice) != 2 {
			t.Fatalf("summary.json: %v\n%s", err, b)
		}
		return stderr, sum, est, losses(t, runDir)
	}
	nf4Err, nf4, nf4Est, nf4Loss := run("nf4")
	bfErr, _, _, bfLoss := run("bf16")

	if !strings.Contains(nf4Err, "strata.lora.base_dtype nf4: the frozen base's param shards are stored in nf4 in host RAM") {
		t.Errorf("train does not say the base is stored in nf4:\n%s", nf4Err)
	}
	if !strings.Contains(nf4Err, "tiers: params in host") {
		t.Errorf("the summary's tiers line:\n%s", nf4Err)
	}
	st := nf4Est.Stages[0]
	// tiny at r 2 on all-linear: two adapter chunks of 1,024 params, the
	// only chunks kept gathered (2·1024·(N−1)/N bytes each).
	const adapterPersistent = 2 * 2 * 1024 * (2 - 1) / 2
	for i, d := range nf4.PerDevice {
		if d.PersistentBytes != adapterPersistent {
			t.Errorf("device %d: persistent %d bytes, want %d (the adapters only; the base is in host RAM)", i, d.PersistentBytes, adapterPersistent)
		}
		if d.EstimateBytes != st.DeviceBytes {
			t.Errorf("device %d: the summary's estimate %d bytes, strata estimate's %d", i, d.EstimateBytes, st.DeviceBytes)
		}
	}
	if p := st.PerRank["param"]["host"]; p == 0 {
		t.Errorf("strata estimate puts no param bytes in host RAM: %v", st.PerRank["param"])
	}
	if nf4.Tier.HostHomeBytes != st.HostBytes {
		t.Errorf("host homes measured %d bytes, strata estimate %d", nf4.Tier.HostHomeBytes, st.HostBytes)
	}
	if slices.Equal(nf4Loss, bfLoss) {
		t.Errorf("losses %v with the nf4 base are the bf16 base's: it was not quantized", nf4Loss)
	}
	for _, want := range []string{"every chunk has fewer than stage3_param_persistence_threshold 100000 params and stays gathered on the devices",
		"tiers: params on the devices (offload_param host: every chunk stays gathered"} {
		if !strings.Contains(bfErr, want) {
			t.Errorf("the bf16 base run does not say %q:\n%s", want, bfErr)
		}
	}
}
