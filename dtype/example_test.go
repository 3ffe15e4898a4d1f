package dtype_test

import (
	"fmt"

	"github.com/strata-ai/strata/dtype"
)

// Example parses a dtype by the name a DeepSpeed or PyTorch user writes,
// sizes an array of it, and rounds a float32 to it and back.
func Example() {
	d, err := dtype.Parse("bfloat16")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d, d.Size(), d.Bytes(1024))

	src := []float32{1, 1.001, 3.14159}
	bits := make([]uint16, len(src))
	dtype.Narrow(d, bits, src)
	back := make([]float32, len(src))
	dtype.Widen(d, back, bits)
	fmt.Println(back)

	// Q8 has no fixed element size: 8192 one-byte codes and 32 fp32 scales.
	fmt.Println(dtype.Q8.Bytes(8192))
	// Output:
	// bf16 2 2048
	// [1 1 3.140625]
	// 8320
}
