package engine

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// heapShapeJSON is a gpt2-like model big enough that every kernel splits
// its work over the workers (an MLP activation of 128×512 values is four
// elementwise chunks) and the attention runs on whole 128-token tiles.
const heapShapeJSON = `{"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "max_seq_len": 128}`

// TestStepHeapAllocs: after step 2, a training step on the CPU backend
// allocates (almost) nothing on the Go heap: the kernels' temporaries
// (widened bf16 rows, GEMM panels, attention tiles, elementwise results)
// are kept by the devices from step to step (gpu/cpu/pool.go). In a fresh
// process garbage lands on fresh pages, each a minor fault, so a step that
// makes hundreds of MB of it pays for them in system time. Workers are
// fixed at 4 so that the kernels split their work as on a larger machine,
// whatever GOMAXPROCS is.
//
// What remains is the step's bookkeeping (the enqueued ops' closures, the
// splits' goroutines, the model's buffer views, the collectives' rounds):
// about 33 kB a step on one device (59 kB with the gonum GEMM), 150-530 kB
// at stage 2 on two (GOMAXPROCS 2). The bounds leave room for pieces that
// first run at once after step 2 (beside the collectives, or under the race
// detector) and take buffers of their own: a device keeps as many as were
// held at once.
// Before the devices kept them, a step took 10.7 MB, 47 MB and 8.7 MB of
// these three runs.
func TestStepHeapAllocs(t *testing.T) {
	const warm, measured = 2, 4
	for _, c := range []struct {
		s        runSpec
		maxBytes uint64
	}{
		{runSpec{stage: 0, n: 1, micro: 1, accum: 1, clip: 1}, 512 << 10},
		{runSpec{stage: 2, n: 2, micro: 1, accum: 2, clip: 1}, 1 << 20},
		{runSpec{stage: 0, n: 1, micro: 1, accum: 1, clip: 1, fp32: true}, 512 << 10},
	} {
		s := c.s
		t.Run(s.String(), func(t *testing.T) {
			js := strings.Replace(s.configJSON(), testShapeJSON, heapShapeJSON, 1)
			js = strings.Replace(js, fmt.Sprintf(`"seq_len": %d`, testSeq), `"seq_len": 128`, 1)
			cdevs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20, Workers: 4})
			if err != nil {
				t.Fatal(err)
			}
			opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2}
			if s.fp32 {
				opts.Precision = gpu.F32
			}
			e, err := startEngine(t, testConfig(t, js), cpu.Devices(cdevs), comms, opts)
			if err != nil {
				t.Fatal(err)
			}
			trainFor(t, e, warm)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range measured {
				if _, err := e.Step(); err != nil {
					t.Fatal(err)
				}
			}
			runtime.ReadMemStats(&after)
			perStep := (after.TotalAlloc - before.TotalAlloc) / measured
			t.Logf("%d B of Go heap a step (%d objects), GOMAXPROCS %d", perStep, (after.Mallocs-before.Mallocs)/measured, runtime.GOMAXPROCS(0))
			if perStep > c.maxBytes {
				t.Errorf("a step after step %d allocates %d B of Go heap, want at most %d", warm, perStep, c.maxBytes)
			}
		})
	}
}
