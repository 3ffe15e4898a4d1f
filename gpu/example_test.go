package gpu_test

import (
	"fmt"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
)

// Example multiplies two 2×2 matrices through the gpu interfaces, on a
// device of the CPU backend: allocate against the budget, copy in, run a
// kernel on a stream, copy out, and synchronize before reading the result.
func Example() {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	var dev gpu.Device = devs[0]
	s := dev.DefaultStream()
	tag := gpu.Tag{Kind: gpu.Workspace, Purpose: "example"}

	var bufs [3]gpu.Buffer
	for i := range bufs {
		if bufs[i], err = dev.Alloc(4, gpu.F32, tag); err != nil {
			fmt.Println(err)
			return
		}
		defer dev.Free(bufs[i])
	}
	a, b, c := bufs[0], bufs[1], bufs[2]
	dev.CopyHostToDevice(s, a, 0, dtype.Bytes([]float32{1, 2, 3, 4}))
	dev.CopyHostToDevice(s, b, 0, dtype.Bytes([]float32{5, 6, 7, 8}))
	dev.Ops().Gemm(s, false, false, 2, 2, 2, 1, a, b, 0, c) // c = a·b, row-major

	out := make([]float32, 4)
	dev.CopyDeviceToHost(s, dtype.Bytes(out), c, 0)
	if err := s.Synchronize(); err != nil {
		fmt.Println(err)
		return
	}
	// Each 16-byte buffer takes the CPU backend's 64-byte granularity.
	fmt.Println(out, dev.MemStats().InUseByKind[gpu.Workspace], "bytes in use")
	// Output: [19 22 43 50] 192 bytes in use
}
