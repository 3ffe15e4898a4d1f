package gputest_test

import (
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/gpu/gputest"
)

// newCPU is a backend's constructor as Run takes it: fresh devices of the
// CPU backend, each with a 64 MiB budget, and one Comm per device.
func newCPU(t *testing.T, devices int) ([]gpu.Device, []gpu.Comm) {
	devs, comms, err := cpu.New(cpu.Options{Devices: devices, HBMBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return cpu.Devices(devs), comms
}

// ExampleRun shows how a backend's tests run the suite: a test function
// hands Run the backend's constructor, as gpu/cpu's TestConformance does.
// Run needs the *testing.T of a running test, so this example has no
// Output line: go test compiles it but does not run it.
func ExampleRun() {
	testConformance := func(t *testing.T) {
		gputest.Run(t, newCPU)
	}
	_ = testConformance // in a backend's _test.go: func TestConformance(t *testing.T)
}
