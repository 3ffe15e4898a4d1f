package cpuadam

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/fp16"
)

// f16Case is one fp16 step: the Go ISA's (binary16 widened and rounded by
// internal/fp16 around the fp32 reference) against isa's (F16C in the
// kernel), bit for bit, with guard bands around param, grad and out.
func f16Case(t *testing.T, isa ISA, mo Moments, gradF16 bool, p Params, s state, gh []uint16, off offsets) {
	t.Helper()
	n := len(s.param)
	k := makeConsts(p)
	shardOf := func(param []float32, grad []float32, g16 []uint16, m, v Moment, out []uint16) Shard {
		sh := Shard{Param: param, M: m, V: v, Out: out, F16: true}
		if gradF16 {
			sh.Grad16 = g16
		} else {
			sh.Grad = grad
		}
		return sh
	}
	mw, vw := newMoment(mo, n, false), newMoment(mo, n, true)
	mw.Encode(s.m)
	vw.Encode(s.v)
	want := shardOf(clone(s.param), clone(s.grad), append([]uint16(nil), gh...), cloneMoment(mw), cloneMoment(vw), make([]uint16, n))
	ISAGo.adamShard(&k, p.Mode, want)

	gp, gg, g16, gout := newGuardedF32(n, off.param), newGuardedF32(n, off.grad), newGuardedU16(n, off.grad), newGuardedU16(n, off.out)
	copy(gp.s(), s.param)
	copy(gg.s(), s.grad)
	copy(g16.s(), gh)
	got := shardOf(gp.s(), gg.s(), g16.s(), cloneMoment(mw), cloneMoment(vw), gout.s())
	isa.adamShard(&k, p.Mode, got)
	what := fmt.Sprintf("%v %v gradF16=%v n=%d %+v", isa, mo, gradF16, n, off)
	gp.check(t, what+" param")
	gg.check(t, what+" grad")
	g16.check(t, what+" grad16")
	gout.check(t, what+" out")
	for i := range n {
		if !sameF32(got.Param[i], want.Param[i]) || got.Out[i] != want.Out[i] && !(isNaN16(got.Out[i]) && isNaN16(want.Out[i])) {
			t.Fatalf("%s: element %d: param %#x out %#x, want %#x %#x (param %g grad %g)", what, i,
				math.Float32bits(got.Param[i]), got.Out[i], math.Float32bits(want.Param[i]), want.Out[i], s.param[i], s.grad[i])
		}
	}
	compareShards(t, what, got, want)
}

func isNaN16(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

// TestF16Kernels: fp16 mixed precision's host update (Shard.F16: binary16
// gradients, binary16 new params) on AVX-512 and AVX2 (F16C in the
// kernels) gives the Go reference's bits for every length 0..260, both
// moment precisions the kernels take (int8's go through Go), fp32 and
// fp16 gradients, misaligned slices, the non-temporal path of out, and
// params at fp16's edges: ties between two binary16 values, subnormals,
// values that round past 65504 to Inf, NaN.
func TestF16Kernels(t *testing.T) {
	isas := requireVectorISAs(t)
	r := rand.New(rand.NewPCG(16, 17))
	edges := []float32{65504, 65519.99, 65520, -65520, 1e5, float32(math.Ldexp(1, -24)), float32(math.Ldexp(1, -25)),
		float32(math.Ldexp(3, -26)), 1 + 1.0/2048, 1 + 3.0/2048, float32(math.NaN()), float32(math.Inf(-1)), 0}
	lens := make([]int, 0, 270)
	for n := 0; n <= 260; n++ {
		lens = append(lens, n)
	}
	lens = append(lens, 2*QuantBlock, 3*QuantBlock+1, 4*QuantBlock+45, 5*QuantBlock-1)
	for _, n := range lens {
		s := randState(r, n)
		gh := make([]uint16, n)
		for i := range n {
			if r.IntN(5) == 0 {
				s.param[i] = edges[r.IntN(len(edges))]
			}
			gh[i] = fp16.FromFloat32(s.grad[i])
			if r.IntN(9) == 0 {
				gh[i] = uint16(r.Uint32()) // any pattern: subnormals, Inf, NaN
			}
			s.gradH[i] = bf16.FromFloat32(s.grad[i])
		}
		for _, mo := range []Moments{MomentsF32, MomentsBF16, MomentsInt8} {
			for _, gradF16 := range []bool{true, false} {
				p := randParams(r, []Mode{AdamW, AdamL2}[n%2])
				off := offsets{param: n % 16, grad: (n * 3) % 32, out: (n * 7) % 32}
				if !gradF16 {
					off.grad %= 16
				}
				for _, isa := range isas {
					f16Case(t, isa, mo, gradF16, p, s, gh, off)
					if isa == ISAAVX512 && n%5 == 0 {
						old := outNTMinLen
						outNTMinLen = 1
						f16Case(t, isa, mo, gradF16, p, s, gh, off)
						outNTMinLen = old
					}
				}
			}
		}
	}
}
