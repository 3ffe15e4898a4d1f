package cpu_test

import (
	"fmt"
	"sync"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
)

// ExampleNew makes two in-process devices and all-reduces a buffer across
// them: each rank calls the collective on a stream of its own device, on a
// goroutine of its own, and the sum, added in rank order, is the same on
// both.
func ExampleNew() {
	devs, comms, err := cpu.New(cpu.Options{Devices: 2, HBMBytes: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	results := make([][]float32, len(devs))
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for r, dev := range devs {
		buf, err := dev.Alloc(3, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "sum"})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer dev.Free(buf)
		x := float32(r + 1)
		results[r] = []float32{x, 10 * x, 100 * x}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := dev.DefaultStream()
			dev.CopyHostToDevice(s, buf, 0, dtype.Bytes(results[r]))
			comms[r].AllReduce(s, buf, gpu.Sum)
			dev.CopyDeviceToHost(s, dtype.Bytes(results[r]), buf, 0)
			errs[r] = s.Synchronize()
		}()
	}
	wg.Wait()
	for r, got := range results {
		fmt.Println(devs[r].Name(), got, errs[r])
	}
	// Output:
	// cpu:0 [3 30 300] <nil>
	// cpu:1 [3 30 300] <nil>
}
