package cuda_test

import (
	"errors"
	"fmt"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cuda"
)

// ExampleNew opens one logical device on the first GPU with a 256 MiB
// budget, copies a vector to it and back, and closes the backend. On a
// machine without a CUDA driver or GPU, New returns an error wrapping
// ErrNoDriver. The example has no Output line: go test compiles it but
// does not run it, since the machines that run the tests have no GPU.
func ExampleNew() {
	b, err := cuda.New(cuda.Options{Devices: 1, HBMBytes: 256 << 20})
	if errors.Is(err, cuda.ErrNoDriver) {
		fmt.Println("no GPU here:", err)
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	dev := b.Devices()[0]
	s := dev.DefaultStream()
	buf, err := dev.Alloc(4, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "example"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Free(buf)
	in, out := []float32{1, 2, 3, 4}, make([]float32, 4)
	dev.CopyHostToDevice(s, buf, 0, dtype.Bytes(in))
	dev.CopyDeviceToHost(s, dtype.Bytes(out), buf, 0)
	if err := s.Synchronize(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(dev.Name(), out, b.Collectives())
}
