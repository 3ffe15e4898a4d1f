package cpu_test

import (
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/gpu/gputest"
	"github.com/strata-ai/strata/internal/units"
)

func newBackend(t *testing.T, devices int) ([]gpu.Device, []gpu.Comm) {
	devs, comms, err := cpu.New(cpu.Options{Devices: devices, HBMBytes: 64 * units.MiB, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	return cpu.Devices(devs), comms
}

func TestConformance(t *testing.T) { gputest.Run(t, newBackend) }
