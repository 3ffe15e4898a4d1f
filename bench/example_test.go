package bench_test

import (
	"fmt"

	"github.com/strata-ai/strata/bench"
	"github.com/strata-ai/strata/cpuadam"
)

// ExampleRunAdam runs `strata bench adam` as a library call, on a tiny
// step: 8,192 parameters with bf16 gradients and int8 moments, timed once.
// The timings vary from run to run; what was measured does not.
func ExampleRunAdam() {
	o := bench.AdamOptions{Params: 8192, GradBF16: true, BF16Out: true,
		Moments: cpuadam.MomentsInt8, Rounds: 1}
	r, err := bench.RunAdam(o.WithDefaults()) // one thread by default
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Params, "params;", r.Grad, "grad;", r.Moments, "moments;", r.Master, "master")
	fmt.Printf("%.2f bytes per param, %d round, %d thread\n", r.BytesPerParam, r.Rounds, r.Threads)
	fmt.Println("timed:", r.StepSeconds > 0)
	// Output:
	// 8192 params; bf16 grad; int8 moments; fp32 master
	// 16.06 bytes per param, 1 round, 1 thread
	// timed: true
}
