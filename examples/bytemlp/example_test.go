package bytemlp_test

import (
	"fmt"
	"log"

	"github.com/strata-ai/strata/examples/bytemlp"
)

// Example shows the model's layout: three chunks, the units the engine
// shards, gathers, offloads and checkpoints.
func Example() {
	m, err := bytemlp.New(16, 64)
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range m.Layout().Chunks {
		fmt.Printf("%s: %d params in %d tensors\n", c.Name, c.Len, len(c.Tensors))
	}
	// Output:
	// embedding: 4096 params in 1 tensors
	// hidden: 1088 params in 2 tensors
	// head: 16640 params in 2 tensors
}
