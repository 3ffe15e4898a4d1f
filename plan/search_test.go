package plan

import (
	"strings"
	"testing"

	"github.com/strata-ai/strata/shard"
)

// TestComputePlacement: the compute is measured in the first placement
// that fits without NVMe, else the narrow state's, else the first.
func TestComputePlacement(t *testing.T) {
	mk := func(fits bool, opt, params shard.Tier, moments string) Prediction {
		return Prediction{Config: Config{Optimizer: opt, Params: params, Moments: moments}, Fits: fits}
	}
	fits := []Prediction{
		mk(false, shard.HBM, shard.HBM, fp32State),
		mk(true, shard.NVMe, shard.Host, fp32State),
		mk(true, shard.NVMe, shard.Host, NarrowMoments),
		mk(true, shard.Host, shard.Host, NarrowMoments),
	}
	if got := computePlacement(fits, 1); got != 3 {
		t.Errorf("host placement fits: got %d, want 3", got)
	}
	if got := computePlacement(fits[:3], 1); got != 2 {
		t.Errorf("NVMe only: got %d, want the narrow one, 2", got)
	}
	if got := computePlacement(fits[:2], 1); got != 1 {
		t.Errorf("one NVMe placement: got %d, want 1", got)
	}
}

// TestFitCountsCPUDevicesInRAM: on the CPU backend the devices' memory is
// host RAM, so a placement fits only if its devices and its host state
// fit the RAM together (a gpt-2b placement that fit the host's state
// alone was killed by the kernel at 24 GB).
func TestFitCountsCPUDevicesInRAM(t *testing.T) {
	in := inputs(t, "gpt2")
	in.NVMePath = ""
	preds, err := Fit(in)
	if err != nil {
		t.Fatal(err)
	}
	var host Prediction
	for _, pr := range preds {
		if pr.Name == "stage 3, params and optimizer on host" {
			host = pr
		}
	}
	in.HostBytes = host.HostBytes + host.DeviceBytes/2 // the host state fits, not the devices beside it
	for _, shared := range []bool{false, true} {
		in.SharedCores = shared
		preds, err := Fit(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, pr := range preds {
			if pr.Name != host.Name {
				continue
			}
			if pr.Fits == shared || shared && !strings.Contains(pr.Short, "of it the CPU backend's device memory") {
				t.Errorf("shared cores %v: fits %v, short %q", shared, pr.Fits, pr.Short)
			}
		}
	}
}
