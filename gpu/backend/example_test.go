package backend_test

import (
	"fmt"

	"github.com/strata-ai/strata/gpu/backend"
)

// ExampleOpen opens two devices of the CPU backend by name, each with a
// 64 MiB budget, as `strata train --backend cpu --devices 2` does, and
// closes them when done.
func ExampleOpen() {
	d, err := backend.Open("cpu", 2, 64<<20, true)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	fmt.Println(d.Backend, len(d.Devs), len(d.Comms))
	for _, dev := range d.Devs {
		fmt.Println(dev.Name(), dev.MemStats().BudgetBytes>>20, "MiB")
	}
	// Output:
	// cpu 2 2
	// cpu:0 64 MiB
	// cpu:1 64 MiB
}
