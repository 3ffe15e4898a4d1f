package cpuadam

import (
	"fmt"
	"testing"
)

// BenchmarkStep times one step per ISA and variant on the pool. The small
// size stays in cache (kernel compute speed); the large one streams from
// memory (see `strata bench adam` for the roofline ratio). b.SetBytes
// counts the bytes per parameter the bench counts (28, 26, +2).
func BenchmarkStep(b *testing.B) {
	for _, n := range []int{1 << 14, 1 << 24} {
		for _, isa := range allISAs(b) {
			for _, c := range []config{{false, false, AdamW}, {true, false, AdamW}, {false, true, AdamW}} {
				b.Run(fmt.Sprintf("n=%d/%v/gradBF16=%v/out=%v", n, isa, c.gradBF16, c.out), func(b *testing.B) {
					o, err := New(Options{Threads: 1, ISA: isa})
					if err != nil {
						b.Fatal(err)
					}
					defer o.Close()
					param, grad, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
					gradH := make([]uint16, n)
					var out []uint16
					bytes := 28
					if c.out {
						out, bytes = make([]uint16, n), bytes+2
					}
					if c.gradBF16 {
						bytes -= 2
					}
					p := Params{LR: 1e-3, Beta1: .9, Beta2: .999, Eps: 1e-8, WeightDecay: .01, Step: 1, GradScale: 1}
					b.SetBytes(int64(n * bytes))
					for b.Loop() {
						if c.gradBF16 {
							o.StepBF16(p, param, gradH, m, v, out)
						} else {
							o.StepF32(p, param, grad, m, v, out)
						}
					}
				})
			}
		}
	}
}
