package engine

import (
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
)

// TestResolveMaster: an unset master is the remainder for a bf16 training
// engine with the optimizer on NVMe, and fp32 for an engine of another
// precision (Options.Precision fp16 with a bf16 config), for an inference
// engine and with the optimizer in host RAM; a written one is kept.
func TestResolveMaster(t *testing.T) {
	nvme := config.Default()
	nvme.ZeRO.Stage = 3
	nvme.ZeRO.OffloadOptimizer.Device = config.DeviceNVMe
	host := config.Default()
	host.ZeRO.Stage = 2
	host.ZeRO.OffloadOptimizer.Device = config.DeviceCPU
	fp32 := *nvme
	fp32.Strata.OptimizerState.Master = config.MasterFP32
	for _, c := range []struct {
		name string
		cfg  *config.Config
		opts Options
		want string
	}{
		{"nvme bf16", nvme, Options{Precision: gpu.BF16}, config.MasterBF16Remainder},
		{"nvme fp16 engine", nvme, Options{Precision: gpu.F16}, config.MasterFP32},
		{"nvme inference", nvme, Options{Precision: gpu.BF16, Inference: true}, config.MasterFP32},
		{"host bf16", host, Options{Precision: gpu.BF16}, config.MasterFP32},
		{"nvme written fp32", &fp32, Options{Precision: gpu.BF16}, config.MasterFP32},
	} {
		got := resolveMaster(c.cfg, c.opts)
		if got.MasterFormat() != c.want {
			t.Errorf("%s: master %q, want %q", c.name, got.MasterFormat(), c.want)
		}
		if c.cfg.Strata.OptimizerState.Master != "" && c.cfg != &fp32 {
			t.Errorf("%s: the caller's config was changed", c.name)
		}
	}
}
