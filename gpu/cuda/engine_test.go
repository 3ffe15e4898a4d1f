package cuda_test

import (
	"fmt"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cuda"
	"github.com/strata-ai/strata/internal/units"
)

// TestEngineNoAllocsAfterStep1: the engine on two logical ranks of one
// GPU, stage 3 with params and optimizer state in host RAM, without and
// with activation checkpointing and cpu_checkpointing (the saved inputs
// through the tier store's HBM slots), allocates and frees no device
// memory after its first step (cuMemAlloc, cuMemFree and the
// stream-ordered pool's cuMemAllocAsync, cuMemFreeAsync: the summary's
// DeviceAllocsAfterStep1), and its pinned pools are registered with the
// GPU (cuMemHostRegister): the only pageable copies are the model's own
// (token ids up, losses down), logged.
func TestEngineNoAllocsAfterStep1(t *testing.T) {
	b := newBackend(t, 2, 512*units.MiB)
	for _, ckpt := range []string{"", `"activation_checkpointing": {"cpu_checkpointing": true},`} {
		t.Run(fmt.Sprintf("ckpt=%v", ckpt != ""), func(t *testing.T) {
			js := `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95]}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0, ` + ckpt + `
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000,
    "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": {"n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 256, "max_seq_len": 64}, "devices": 2, "seq_len": 64, "seed": 7}
}`
			engineNoAllocs(t, b, js)
		})
	}
}

func engineNoAllocs(t *testing.T, b *cuda.Backend, js string) {
	t.Helper()
	cfg, err := config.Parse([]byte(js), "test.json", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, b.Devices(), b.Comms(), engine.Options{OptimizerThreads: 2, HostRegistrar: b.HostRegistrar()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := e.Run(t.Context(), 4, nil); err != nil {
		t.Fatal(err)
	}
	sum := e.Summary()
	for _, d := range sum.PerDevice {
		t.Logf("%s: driver %+v, after step 1 %d; pageable %d B up, %d B down of %d B up, %d B down",
			d.Device, d.Driver, d.DeviceAllocsAfterStep1, d.Moved.HostToDevicePageable, d.Moved.DeviceToHostPageable, d.Moved.HostToDevice, d.Moved.DeviceToHost)
		if d.DeviceAllocsAfterStep1 != 0 {
			t.Errorf("%s: %d device allocations and frees after step 1", d.Device, d.DeviceAllocsAfterStep1)
		}
	}
	for _, h := range sum.HostRegistration {
		t.Logf("registration %+v", h)
		if h.Outcome != report.RegistrationOK {
			t.Errorf("pinned %s not registered: %s", h.Pool, h.Error)
		}
	}
}
