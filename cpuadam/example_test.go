package cpuadam_test

import (
	"fmt"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
)

// Example runs the first AdamW step of four fp32 master weights on a pool
// of two goroutines and writes the new params as bf16 in the same pass.
// On the first step Adam moves each weight by about lr against the sign of
// its gradient.
func Example() {
	opt, err := cpuadam.New(cpuadam.Options{Threads: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer opt.Close()

	param := []float32{1, -1, 0.5, 2}
	grad := []float32{0.5, -0.25, 1, -2}
	m := make([]float32, len(param))
	v := make([]float32, len(param))
	out := make([]uint16, len(param))

	fmt.Println("grad sum of squares:", opt.SumSquares(grad))
	p := cpuadam.Params{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1, GradScale: 1, Mode: cpuadam.AdamW}
	opt.StepF32(p, param, grad, m, v, out)

	bf16 := make([]float32, len(out))
	dtype.Widen(dtype.BF16, bf16, out)
	fmt.Printf("fp32 master: %.3f\n", param)
	fmt.Printf("bf16 params: %.3f\n", bf16)
	// Output:
	// grad sum of squares: 5.3125
	// fp32 master: [0.900 -0.900 0.400 2.100]
	// bf16 params: [0.898 -0.898 0.400 2.094]
}
