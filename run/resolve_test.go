package run_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/run"
)

// TestResolveIsTheRunsConfig: a request (a config file with "auto" keys,
// the values that fill them, the devices and the steps) resolves to the
// config with those values, the one the run writes to its config.json; a
// resume of that run resolves to the same config; a request the command
// line would refuse is an *run.InputError naming the flag.
func TestResolveIsTheRunsConfig(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "ds.json")
	const js = `{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2},
	  "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
	  "strata": {"model": "tiny", "seq_len": 32, "seed": 1}}`
	if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	devices, steps, micro, lr := 2, 3, 2, 3e-3
	req := run.ConfigRequest{ConfigPath: path, Devices: &devices, Steps: &steps, MicroBatch: &micro, LR: &lr, Backend: "cpu"}
	cfg, err := run.Resolve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Strata.Devices != 2 || cfg.Strata.Steps != 3 || cfg.TrainMicroBatchSizePerGPU != 2 || cfg.Optimizer.Params.LR != 3e-3 {
		t.Fatalf("resolved config %s: want 2 devices, 3 steps, micro-batch 2, lr 0.003", cfg.JSON())
	}
	out := filepath.Join(dir, "out")
	if _, err := run.Train(ctx, run.Options{Config: cfg, Out: out}, nil); err != nil {
		t.Fatal(err)
	}
	written, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(written) != string(cfg.JSON())+"\n" {
		t.Fatalf("config.json of the run:\n%s\nwant the resolved config:\n%s", written, cfg.JSON())
	}

	m, ckDir, _, err := run.ResolveResume(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	again, err := run.Resolve(ctx, run.ConfigRequest{Resume: m, ResumeDir: ckDir})
	if err != nil {
		t.Fatal(err)
	}
	if d := run.ConfigDiff(cfg.JSON(), again.JSON()); d != "" || again.Strata.Steps != 3 {
		t.Fatalf("the resumed run's config differs from the run's: %s", d)
	}

	zero := 0
	for _, bad := range []struct {
		req  run.ConfigRequest
		flag string
	}{
		{run.ConfigRequest{LR: &lr}, "--lr fills"},
		{run.ConfigRequest{ConfigPath: path, Steps: &zero}, "--steps 0"},
		{run.ConfigRequest{ConfigPath: path, Backend: "tpu"}, "--backend \"tpu\""},
	} {
		_, err := run.Resolve(ctx, bad.req)
		var ie *run.InputError
		if !errors.As(err, &ie) || !strings.Contains(err.Error(), bad.flag) {
			t.Errorf("Resolve(%+v): %v, want an InputError naming %s", bad.req, err, bad.flag)
		}
	}
}
