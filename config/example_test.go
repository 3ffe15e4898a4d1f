package config_test

import (
	"fmt"

	"github.com/strata-ai/strata/config"
)

// ExampleParse reads a DeepSpeed config for two devices: the gradient
// accumulation steps are derived from the batch sizes, and the learning
// rate follows the warmup schedule.
func ExampleParse() {
	data := []byte(`{
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
    "warmup_num_steps": 10, "warmup_type": "linear"}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}
}`)
	cfg, err := config.Parse(data, "ds_config.json", config.Options{Devices: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("accumulation steps:", cfg.GradientAccumulationSteps)
	fmt.Println("stage:", cfg.ZeRO.Stage, "optimizer on:", cfg.ZeRO.OffloadOptimizer.Device)
	// Update k runs with the scheduler's rate of iteration k-1, as in DeepSpeed.
	fmt.Printf("lr of updates 0, 5, 20: %.2g %.2g %.2g\n", cfg.LR(0), cfg.LR(5), cfg.LR(20))
	// Output:
	// accumulation steps: 2
	// stage: 2 optimizer on: cpu
	// lr of updates 0, 5, 20: 0 0.00012 0.0003
}

// ExampleParse_error shows the message of a misspelled key: the file, the
// line and column, and the key that was meant.
func ExampleParse_error() {
	data := []byte(`{
  "train_micro_batch_size_per_gp": 4
}`)
	_, err := config.Parse(data, "ds_config.json", config.Options{})
	fmt.Println(err)
	// Output:
	// config: ds_config.json:2:3: unknown key "train_micro_batch_size_per_gp"; did you mean "train_micro_batch_size_per_gpu"?
}
