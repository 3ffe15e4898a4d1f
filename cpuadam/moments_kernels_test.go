package cpuadam

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-ai/strata/internal/bf16"
)

// The kernels for narrow moments against refNarrow, bit for bit, as
// kernels_test.go checks the fp32 ones: NaNs compare equal whatever their
// payload, and so do the m codes of a block whose scale is NaN, up to
// their sign (the NaN code's sign is the NaN's, which is a payload
// matter).

const sentinelB = 0xa5 // guard byte for int8 codes

type guardedU8 struct {
	buf []uint8
	lo  int
	n   int
}

func newGuardedU8(n, offElems int) *guardedU8 {
	buf := make([]uint8, n+2*guardLen+128)
	a := uintptr(unsafe.Pointer(&buf[0]))
	base := int((64-a%64)%64) + 64
	lo := base + offElems
	for i := range buf {
		buf[i] = sentinelB
	}
	return &guardedU8{buf: buf, lo: lo, n: n}
}

func (g *guardedU8) s() []uint8 { return g.buf[g.lo : g.lo+g.n : g.lo+g.n] }

func (g *guardedU8) check(t testing.TB, what string) {
	t.Helper()
	for i, b := range g.buf {
		if (i < g.lo || i >= g.lo+g.n) && b != sentinelB {
			t.Fatalf("%s: write past the end at index %d (slice 0..%d): %#x", what, i-g.lo, g.n, b)
		}
	}
}

// narrowIn is the input of one narrow step: param and gradients as in
// state, the moments in their stored form.
type narrowIn struct {
	param, grad []float32
	gradH       []uint16
	m, v        Moment
}

// cloneMoment is a copy of mo in fresh slices.
func cloneMoment(mo Moment) Moment {
	c := Moment{Second: mo.Second}
	switch {
	case mo.BF16 != nil:
		c.BF16 = append([]uint16{}, mo.BF16...)
	case mo.Codes != nil:
		c.Codes = append([]uint8{}, mo.Codes...)
		c.Scales = append([]float32{}, mo.Scales...)
	default:
		c.F32 = append([]float32{}, mo.F32...)
	}
	return c
}

// newMoment is a zero moment of n elements in precision mo (int8 and bf16
// whatever n: the kernels do not look at MinQuantElems).
func newMoment(mo Moments, n int, second bool) Moment {
	switch mo {
	case MomentsBF16:
		return Moment{BF16: make([]uint16, n), Second: second}
	case MomentsInt8:
		return Moment{Codes: make([]uint8, n), Scales: make([]float32, quantBlocks(n)), Second: second}
	}
	return Moment{F32: make([]float32, n), Second: second}
}

// narrowFrom is s with its moments stored in precision mo: encoded from
// s.m, s.v, or (raw) with random bf16 bits or codes and random scales.
func narrowFrom(r *rand.Rand, mo Moments, s state, raw bool) narrowIn {
	n := len(s.param)
	in := narrowIn{param: s.param, grad: s.grad, gradH: s.gradH, m: newMoment(mo, n, false), v: newMoment(mo, n, true)}
	if !raw {
		in.m.Encode(s.m)
		in.v.Encode(s.v)
		return in
	}
	for _, x := range []Moment{in.m, in.v} {
		for i := range x.BF16 {
			x.BF16[i] = bf16.FromFloat32(float32(r.NormFloat64() * math.Ldexp(1, -r.IntN(30))))
		}
		for i := range x.Codes {
			x.Codes[i] = uint8(r.Uint32())
		}
		for i := range x.Scales {
			x.Scales[i] = float32(math.Ldexp(r.Float64(), -r.IntN(40)))
		}
	}
	return in
}

// narrowOffsets are the elements' offsets of each slice from a 64-byte
// boundary.
type narrowOffsets struct{ param, grad, out, m, v, ms, vs int }

// refNarrowOf is refNarrow's result on copies of in.
func refNarrowOf(c config, p Params, in narrowIn) Shard {
	n := len(in.param)
	s := Shard{Param: clone(in.param), M: cloneMoment(in.m), V: cloneMoment(in.v)}
	if c.gradBF16 {
		s.Grad16 = in.gradH
	} else {
		s.Grad = in.grad
	}
	if c.out {
		s.Out = make([]uint16, n)
	}
	k := makeConsts(p)
	refNarrow(&k, p.Mode, s)
	return s
}

// runNarrowCase runs one step of isa's kernel on guarded copies of in and
// compares it with want (refNarrowOf).
func runNarrowCase(t testing.TB, isa ISA, c config, p Params, in narrowIn, want Shard, off narrowOffsets) {
	t.Helper()
	n := len(in.param)
	var checks []func()
	what := fmt.Sprintf("%v %v moments=%v n=%d %+v", isa, c, in.m.Precision(), n, off)
	f32 := func(x []float32, o int, name string) []float32 {
		g := newGuardedF32(len(x), o)
		copy(g.s(), x)
		checks = append(checks, func() { g.check(t, what+" "+name) })
		return g.s()
	}
	u16 := func(x []uint16, o int, name string) []uint16 {
		g := newGuardedU16(len(x), o)
		copy(g.s(), x)
		checks = append(checks, func() { g.check(t, what+" "+name) })
		return g.s()
	}
	u8 := func(x []uint8, o int, name string) []uint8 {
		g := newGuardedU8(len(x), o)
		copy(g.s(), x)
		checks = append(checks, func() { g.check(t, what+" "+name) })
		return g.s()
	}
	moment := func(mo Moment, o, os int, name string) Moment {
		g := Moment{Second: mo.Second}
		if mo.BF16 != nil {
			g.BF16 = u16(mo.BF16, o, name)
		} else {
			g.Codes = u8(mo.Codes, o, name+" codes")
			g.Scales = f32(mo.Scales, os, name+" scales")
		}
		return g
	}
	s := Shard{Param: f32(in.param, off.param, "param"), M: moment(in.m, off.m, off.ms, "m"), V: moment(in.v, off.v, off.vs, "v")}
	if c.gradBF16 {
		s.Grad16 = u16(in.gradH, off.grad, "grad")
	} else {
		s.Grad = f32(in.grad, off.grad, "grad")
	}
	if c.out {
		s.Out = u16(make([]uint16, n), off.out, "out")
	}
	k := makeConsts(p)
	isa.adamShard(&k, p.Mode, s)
	for _, check := range checks {
		check()
	}
	compareShards(t, what, s, want)
}

// compareShards fails unless got and want hold the same bits (NaNs aside).
func compareShards(t testing.TB, what string, got, want Shard) {
	t.Helper()
	for i := range want.Param {
		if !sameF32(got.Param[i], want.Param[i]) {
			t.Fatalf("%s: param[%d] = %#x, want %#x", what, i, math.Float32bits(got.Param[i]), math.Float32bits(want.Param[i]))
		}
		if want.Out != nil && !sameBF16(got.Out[i], want.Out[i]) {
			t.Fatalf("%s: out[%d] = %#x, want %#x", what, i, got.Out[i], want.Out[i])
		}
	}
	for _, mv := range []struct {
		name      string
		got, want Moment
	}{{"m", got.M, want.M}, {"v", got.V, want.V}} {
		g, w := mv.got, mv.want
		for i := range w.BF16 {
			if !sameBF16(g.BF16[i], w.BF16[i]) {
				t.Fatalf("%s: %s[%d] = %#x, want %#x", what, mv.name, i, g.BF16[i], w.BF16[i])
			}
		}
		for b := range w.Scales {
			if !sameF32(g.Scales[b], w.Scales[b]) {
				t.Fatalf("%s: %s scale %d = %#x, want %#x", what, mv.name, b, math.Float32bits(g.Scales[b]), math.Float32bits(w.Scales[b]))
			}
		}
		for i := range w.Codes {
			gc, wc := g.Codes[i], w.Codes[i]
			if sc := w.Scales[i/QuantBlock]; sc != sc {
				gc, wc = gc&0x7f, wc&0x7f
			}
			if gc != wc {
				t.Fatalf("%s: %s code %d = %#x, want %#x (scale %g)", what, mv.name, i, g.Codes[i], w.Codes[i], w.Scales[i/QuantBlock])
			}
		}
	}
}

var narrowMoments = []Moments{MomentsBF16, MomentsInt8}

// TestNarrowKernelsAllLengths: every ISA against refNarrow, bit for bit,
// for both narrow precisions, every variant, every length 0..600 and
// lengths around blocks and vectors further out, with the slices at
// walking misalignments between guard bands; AVX-512 also with the
// non-temporal output.
func TestNarrowKernelsAllLengths(t *testing.T) {
	isas := requireVectorISAs(t)
	lens := []int{}
	for n := 0; n <= 600; n++ {
		lens = append(lens, n)
	}
	for _, b := range []int{3, 4, 16, 17} {
		for _, d := range []int{-17, -16, -9, -8, -7, -1, 0, 1, 7, 8, 9, 15, 16} {
			lens = append(lens, b*QuantBlock+d)
		}
	}
	r := rand.New(rand.NewPCG(21, 22))
	for li, n := range lens {
		s := randState(r, n)
		for _, mo := range narrowMoments {
			in := narrowFrom(r, mo, s, li%3 == 2)
			for ci, c := range allConfigs() {
				p := randParams(r, c.mode)
				want := refNarrowOf(c, p, in)
				tries := 1
				if n < 64 || li%16 == 0 {
					tries = 4
				}
				for o := range tries {
					o += li + ci
					off := narrowOffsets{param: o % 16, grad: (o*3 + 1) % 16, out: (o * 5) % 32, m: (o*7 + 2) % 32,
						v: (o*11 + 3) % 32, ms: (o * 13) % 16, vs: (o*3 + 5) % 16}
					if mo == MomentsInt8 {
						off.m, off.v = (o*7+2)%64, (o*11+3)%64
					}
					if c.gradBF16 {
						off.grad = (o*3 + 1) % 32
					}
					for _, isa := range isas {
						runNarrowCase(t, isa, c, p, in, want, off)
						if isa == ISAAVX512 && c.out {
							old := outNTMinLen
							outNTMinLen = 1
							if o%2 == 1 {
								off.out &^= 15 // int8 streams only a 32-byte aligned out
							}
							runNarrowCase(t, isa, c, p, in, want, off)
							outNTMinLen = old
						}
					}
				}
			}
		}
	}
}

// TestNarrowKernelsSpecialValues: NaN, ±Inf, ±0, subnormals and extremes
// in params, gradients and moments; int8 blocks whose stored scale is 0,
// subnormal, huge, Inf or NaN, and blocks whose new moments are all zero
// (scale 0, divisor 1) or -0.
func TestNarrowKernelsSpecialValues(t *testing.T) {
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(1), math.Float32frombits(0x807fffff),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-20, 1e20, 1, -1}
	isas := requireVectorISAs(t)
	r := rand.New(rand.NewPCG(23, 24))
	n := 5*QuantBlock + 45
	for round := range 24 {
		s := randState(r, n)
		for i := range n {
			if r.IntN(5) == 0 {
				s.param[i] = specials[r.IntN(len(specials))]
			}
			if r.IntN(7) == 0 {
				s.grad[i] = specials[r.IntN(len(specials))]
				s.gradH[i] = bf16.FromFloat32(s.grad[i])
			}
			if r.IntN(9) == 0 {
				s.m[i] = specials[r.IntN(len(specials))]
			}
			if r.IntN(9) == 0 {
				s.v[i] = float32(math.Abs(float64(specials[r.IntN(len(specials))])))
			}
		}
		// Block 1: zero gradients and moments (new moments all zero);
		// block 2 on even rounds: -0 moments and gradients.
		for i := QuantBlock; i < 2*QuantBlock; i++ {
			s.grad[i], s.gradH[i], s.m[i], s.v[i] = 0, 0, 0, 0
		}
		if round%2 == 0 {
			nz := float32(math.Copysign(0, -1))
			for i := 2 * QuantBlock; i < 3*QuantBlock; i++ {
				s.grad[i], s.gradH[i], s.m[i], s.v[i] = nz, 0x8000, nz, nz
			}
		}
		for _, mo := range narrowMoments {
			in := narrowFrom(r, mo, s, false)
			for b := range in.m.Scales {
				if r.IntN(3) == 0 {
					in.m.Scales[b] = float32(math.Abs(float64(specials[r.IntN(len(specials))])))
				}
				if r.IntN(3) == 0 {
					in.v.Scales[b] = float32(math.Abs(float64(specials[r.IntN(len(specials))])))
				}
			}
			if round%4 == 1 && in.m.Codes != nil {
				for i := range in.m.Codes {
					in.m.Codes[i], in.v.Codes[i] = uint8(r.Uint32()), uint8(r.Uint32())
				}
			}
			for _, c := range allConfigs() {
				p := randParams(r, c.mode)
				if round%2 == 0 {
					p.GradScale = 1
				}
				want := refNarrowOf(c, p, in)
				for _, isa := range isas {
					runNarrowCase(t, isa, c, p, in, want, narrowOffsets{round % 16, round % 7, round % 32, 3, 5, 1, 2})
				}
			}
		}
	}
}

// TestNarrowKernelsRoundingTies steers the new moments onto the int8
// maps' rounding ties, their neighbours and the subnormal boundary: with
// beta1 = beta2 = 0 and grad scale 1 the new m is the gradient and the new
// v its square, and a block holding ±1 (m) or 2 (v: 4) has a power-of-two
// scale, so the ratios are exact.
func TestNarrowKernelsRoundingTies(t *testing.T) {
	isas := requireVectorISAs(t)
	var gs []float32
	for e := -20; e <= 0; e++ {
		for f := 0; f < 16; f++ {
			x := float32(math.Ldexp(1+float64(f)/16, e)) // f odd: a tie of m's 3 fraction bits
			gs = append(gs, x, -x, math.Nextafter32(x, 0), math.Nextafter32(x, 2))
		}
	}
	for k := 0; k < 9; k++ {
		x := float32(math.Ldexp(float64(k)+0.5, -17)) // m's subnormal ties
		gs = append(gs, x, -math.Nextafter32(x, 0), math.Nextafter32(x, 1))
	}
	// v's ties: squares (5/4)², and (2k+1)·2^-34 for 2k+1 in {1, 9} (subnormal).
	gs = append(gs, 1.25, 0x1p-17, 3*0x1p-17, float32(math.Ldexp(1, -15)), math.Nextafter32(0x1p-15, 0))
	n := len(gs) + QuantBlock - len(gs)%QuantBlock + 37
	grad := make([]float32, n)
	for i := range grad {
		grad[i] = gs[i%len(gs)]
		if i%QuantBlock == 0 {
			grad[i] = 2 // the block's largest |m|: scale 2, v's 4
		}
	}
	r := rand.New(rand.NewPCG(25, 26))
	s := randState(r, n)
	s.grad = grad
	for i := range grad {
		s.gradH[i] = bf16.FromFloat32(grad[i])
	}
	p := Params{LR: 1e-3, Beta1: 0, Beta2: 0, Eps: 1e-8, Step: 3, GradScale: 1}
	in := narrowFrom(r, MomentsInt8, s, false)
	for _, c := range allConfigs() {
		if c.gradBF16 {
			continue // bf16 gradients would round the ties away
		}
		p.Mode = c.mode
		want := refNarrowOf(c, p, in)
		for _, isa := range isas {
			runNarrowCase(t, isa, c, p, in, want, narrowOffsets{})
		}
	}
}

// fuzzNarrow is FuzzKernels' part for narrow moments: the moments' bits
// come raw from the fuzzer (bf16 patterns, codes, scales), NaN and Inf
// included.
func fuzzNarrow(t *testing.T, c config, p Params, s state, mw, vw []uint32, variant uint8, step uint16) {
	n := len(s.param)
	for _, mo := range narrowMoments {
		in := narrowIn{param: s.param, grad: s.grad, gradH: s.gradH, m: newMoment(mo, n, false), v: newMoment(mo, n, true)}
		for i := range n {
			if mo == MomentsBF16 {
				in.m.BF16[i], in.v.BF16[i] = uint16(mw[i]>>16), uint16(vw[i]>>16)
			} else {
				in.m.Codes[i], in.v.Codes[i] = uint8(mw[i]), uint8(vw[i])
			}
		}
		for b := range in.m.Scales {
			in.m.Scales[b], in.v.Scales[b] = math.Float32frombits(mw[b*QuantBlock]), math.Float32frombits(vw[b*QuantBlock])
		}
		want := refNarrowOf(c, p, in)
		for _, isa := range vectorISAs(t) {
			o := int(variant) + int(step)
			runNarrowCase(t, isa, c, p, in, want, narrowOffsets{o % 16, int(step) % 16, o % 32, o % 31, o % 29, o % 15, o % 13})
		}
	}
}
