package run_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/run"
)

// tinyConfig is a run of the tiny model, ZeRO stage 2 on 2 CPU devices,
// for steps steps.
func tinyConfig(steps int) *config.Config {
	const js = `{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
	  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 1}}`
	cfg, err := config.Parse([]byte(js), "tiny.json", config.Options{LookupShape: func(name string) (config.Shape, error) {
		s, err := model.Lookup(name)
		return config.Shape(s), err
	}})
	if err != nil {
		panic(err)
	}
	cfg.Strata.Steps = steps
	return cfg
}

// Train a tiny model 3 steps into a run directory, then resume it from
// its last checkpoint to step 5.
func ExampleTrain() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "strata-run-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	res, err := run.Train(ctx, run.Options{Config: tinyConfig(3), Out: dir}, nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("trained steps %d-%d, checkpoint %s\n", res.Start+1, res.Last, filepath.Base(res.Checkpoint))

	// The directory's latest checkpoint; the run goes on to 5 steps.
	m, ck, err := checkpoint.ReadManifest(filepath.Join(dir, "checkpoints"))
	if err != nil {
		panic(err)
	}
	res, err = run.Train(ctx, run.Options{Config: tinyConfig(5), Out: dir, Resume: &run.Resume{Manifest: m, Dir: ck}},
		func(st run.Step) error {
			fmt.Printf("step %d\n", st.Step)
			return nil
		})
	if err != nil {
		panic(err)
	}
	fmt.Printf("trained steps %d-%d, checkpoint %s\n", res.Start+1, res.Last, filepath.Base(res.Checkpoint))
	for _, name := range []string{"run.json", "config.json", "steps.jsonl", "summary.json", "model.safetensors"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// trained steps 1-3, checkpoint step-00000003
	// step 4
	// step 5
	// trained steps 4-5, checkpoint step-00000005
}

// Resolve the config of a run as `strata train --config ds.json --lr
// 0.003 --steps 20 --devices 2` does: the flags fill the file's "auto"
// values and decide the device count and the steps.
func ExampleResolve() {
	dir, err := os.MkdirTemp("", "strata-resolve-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "ds.json")
	const js = `{"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
	  "zero_optimization": {"stage": 3}, "strata": {"model": "tiny", "seq_len": 32}}`
	if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
		panic(err)
	}
	lr, steps, devices := 3e-3, 20, 2
	cfg, err := run.Resolve(context.Background(), run.ConfigRequest{ConfigPath: path, LR: &lr, Steps: &steps, Devices: &devices})
	if err != nil {
		panic(err)
	}
	fmt.Println(cfg.Optimizer.Params.LR, cfg.Strata.Steps, cfg.Strata.Devices, cfg.TrainMicroBatchSizePerGPU, cfg.GradientAccumulationSteps)
	// Output: 0.003 20 2 4 1
}
