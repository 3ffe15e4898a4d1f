package cpuadam

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/strata-ai/strata/internal/bf16"
)

// BenchmarkStep times one step per ISA and variant on the pool. The small
// size stays in cache (kernel compute speed); the large one streams from
// memory (see `strata bench adam` for the roofline ratio). b.SetBytes
// counts the bytes per parameter the bench counts (28, 26, +2).
//
// The inputs are real values (randState: params, gradients, moments), all
// written before any timing and shared by the variants of one size (b.Loop
// times only the loop): fresh
// slices that were never written are backed by the kernel's shared zero
// page, whose reads hit one cached page and say nothing of memory speed.
func BenchmarkStep(b *testing.B) {
	for _, n := range []int{1 << 14, 1 << 24} {
		inputs := sync.OnceValues(func() (state, []uint16) { // made by the first variant run (-bench may select none)
			s := randState(rand.New(rand.NewPCG(1, uint64(n))), n)
			out := make([]uint16, n)
			bf16.FromFloat32s(out, s.param) // written too: its first store would fault pages in
			return s, out
		})
		for _, isa := range allISAs(b) {
			for _, c := range []config{{false, false, AdamW}, {true, false, AdamW}, {false, true, AdamW}} {
				b.Run(fmt.Sprintf("n=%d/%v/gradBF16=%v/out=%v", n, isa, c.gradBF16, c.out), func(b *testing.B) {
					o, err := New(Options{Threads: 1, ISA: isa})
					if err != nil {
						b.Fatal(err)
					}
					defer o.Close()
					s, out := inputs()
					checkWritten(b, s, out)
					var out16 []uint16
					bytes := 28
					if c.out {
						out16, bytes = out, bytes+2
					}
					if c.gradBF16 {
						bytes -= 2
					}
					p := Params{LR: 1e-3, Beta1: .9, Beta2: .999, Eps: 1e-8, WeightDecay: .01, Step: 1, GradScale: 1}
					b.SetBytes(int64(n * bytes))
					for b.Loop() {
						if c.gradBF16 {
							o.StepBF16(p, s.param, s.gradH, s.m, s.v, out16)
						} else {
							o.StepF32(p, s.param, s.grad, s.m, s.v, out16)
						}
					}
				})
			}
		}
	}
}

// checkWritten fails the benchmark when an input holds a zero at any of
// the elements it samples, one per 4 KiB: a slice allocated and never
// written reads zero everywhere, and the benchmark must not time one.
// (randState's values are never exactly zero.)
func checkWritten(b *testing.B, s state, out []uint16) {
	b.Helper()
	f32 := map[string][]float32{"param": s.param, "grad": s.grad, "m": s.m, "v": s.v}
	for name, x := range f32 {
		for i := 0; i < len(x); i += 1024 {
			if x[i] == 0 {
				b.Fatalf("%s[%d] = 0: the inputs must be written before timing", name, i)
			}
		}
	}
	u16 := map[string][]uint16{"gradH": s.gradH, "out": out}
	for name, x := range u16 {
		for i := 0; i < len(x); i += 2048 {
			if x[i] == 0 {
				b.Fatalf("%s[%d] = 0: the inputs must be written before timing", name, i)
			}
		}
	}
}

// BenchmarkStepMoments times Step per ISA and moment precision (fp32
// gradients, no output) in cache and streaming; b.SetBytes counts the
// bytes of `strata bench adam` (28, 20 and 16.0625 per parameter).
func BenchmarkStepMoments(b *testing.B) {
	for _, n := range []int{1 << 14, 1 << 24} {
		inputs := sync.OnceValue(func() state { return randState(rand.New(rand.NewPCG(2, uint64(n))), n) })
		for _, isa := range allISAs(b) {
			for _, mo := range []Moments{MomentsF32, MomentsBF16, MomentsInt8} {
				b.Run(fmt.Sprintf("n=%d/%v/%v", n, isa, mo), func(b *testing.B) {
					o, err := New(Options{Threads: 1, ISA: isa})
					if err != nil {
						b.Fatal(err)
					}
					defer o.Close()
					s := inputs()
					sh := narrowShard(mo, s.param, s.grad, s.m, s.v, nil)
					p := Params{LR: 1e-3, Beta1: .9, Beta2: .999, Eps: 1e-8, WeightDecay: .01, Step: 1, GradScale: 1}
					b.SetBytes(int64(float64(n) * (12 + 4*float64(mo.Bytes(n))/float64(n))))
					for b.Loop() {
						o.Step(p, sh)
					}
				})
			}
		}
	}
}
