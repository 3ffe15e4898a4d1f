package run

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/model"
)

// DemoSteps is the length of the demonstration (DemoConfig).
const DemoSteps = 60

// DemoConfig is the run of `strata train` without --config: the small
// model (0.86M params), ZeRO stage 3 on 2 devices, linear warmup then decay.
func DemoConfig(steps int) *config.Config {
	cfg := config.Default()
	s, _ := model.Lookup("small")
	cfg.ResolveModel(config.Shape(s))
	cfg.Strata.Model.Name = "small" // so that config.json and checkpoints read back as this shape
	cfg.ZeRO.Stage = 3
	cfg.ZeRO.Stage3ParamPersistenceThreshold = 1000 // shard every chunk but ln_f
	cfg.Optimizer.Params.LR = 2e-3
	cfg.Optimizer.Params.Betas = [2]float64{0.9, 0.95}
	cfg.Scheduler = config.Scheduler{Type: "WarmupDecayLR", Params: config.SchedulerParams{
		WarmupMinLR: 2e-4, WarmupMaxLR: 2e-3, WarmupNumSteps: min(8, steps/4+1), WarmupType: "linear", TotalNumSteps: steps}}
	cfg.GradientClipping = 1
	cfg.Strata.SeqLen = 64
	cfg.Strata.Steps = steps
	cfg.StepsPerPrint = 10
	return cfg
}

// ResumeConfig is the config a run resumed from the checkpoint m (in
// dir) goes on with: the one it was saved with, for devices devices when
// not 0 (the global batch and the micro-batch stay; a batch the devices do
// not split is refused saying how to go on).
func ResumeConfig(m *checkpoint.Manifest, dir string, devices int) (*config.Config, error) {
	if len(m.Config) == 0 {
		return nil, fmt.Errorf("train: --resume %s: the checkpoint holds no config; pass --config", dir)
	}
	saved := []byte(m.Config)
	if devices > 0 {
		saved = forDevices(saved, devices)
	}
	cfg, err := config.Parse(saved, filepath.Join(dir, "manifest.json"), config.Options{LookupShape: model.LookupConfigShape})
	if err != nil {
		return nil, resumeDevicesError(m, dir, devices, err)
	}
	return cfg, nil
}

// forDevices rewrites a saved (resolved) config for n devices: the global
// batch and the micro-batch stay, gradient_accumulation_steps is left for
// the config to derive (train_batch_size / (micro × n)), and strata.devices
// (the most the config allows) becomes n. A config that does not decode is
// returned as is, for Parse to report.
func forDevices(saved []byte, n int) []byte {
	var m map[string]any
	if json.Unmarshal(saved, &m) != nil {
		return saved
	}
	delete(m, "gradient_accumulation_steps")
	if st, ok := m["strata"].(map[string]any); ok {
		st["devices"] = n
	}
	b, err := json.Marshal(m)
	if err != nil {
		return saved
	}
	return b
}

// resumeDevicesError explains a checkpoint's config that does not fit the
// --devices of the resumed run: the saved batch, the new device count, and
// how to go on (the checkpoint itself reshards to any device count).
func resumeDevicesError(m *checkpoint.Manifest, dir string, n int, err error) error {
	if n == 0 || n == m.Devices {
		return fmt.Errorf("train: --resume: %w", err)
	}
	var saved struct {
		Train int `json:"train_batch_size"`
		Micro int `json:"train_micro_batch_size_per_gpu"`
	}
	if json.Unmarshal(m.Config, &saved) != nil || saved.Micro < 1 || saved.Train%(saved.Micro*n) == 0 {
		return fmt.Errorf("train: --resume: %w", err)
	}
	return fmt.Errorf("train: --resume %s: the run was saved on %d devices with train_batch_size %d (micro-batch %d); on --devices %d that global batch does not split: %d is not a multiple of micro-batch %d × %d devices. "+
		"The checkpoint reshards to any device count: pick --devices so that %d × devices divides %d, or pass --config with a batch for %d devices (a different global batch changes the run)",
		dir, m.Devices, saved.Train, saved.Micro, n, saved.Train, saved.Micro, n, saved.Micro, saved.Train, n)
}
