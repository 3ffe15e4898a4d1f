package cpuadam

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-ai/strata/internal/bf16"
)

// The kernels of every ISA must give the same bits as the Go reference
// (ULP bound 0): they round every operation where the reference rounds
// it, use a fused multiply-add exactly where it calls fma32, and VSQRTPS
// and VDIVPS are correctly rounded like math.Sqrt (rounded to float32)
// and float32 division. NaNs compare equal to NaNs whatever their payload
// (x86 propagates the payload of the first NaN operand, and operand order
// is not part of the contract).

// vectorISAs are the ISAs under test besides the reference.
func vectorISAs(t testing.TB) []ISA {
	var out []ISA
	for _, i := range []ISA{ISAAVX2, ISAAVX512} {
		if i.Supported() {
			out = append(out, i)
		} else {
			t.Logf("isa %v not supported by this CPU or build; not tested", i)
		}
	}
	return out
}

// requireVectorISAs returns the vector ISAs under test, and skips a test
// that compares them with the reference when there are none: it would
// compare nothing. The reason says whether the build or the CPU lacks them.
func requireVectorISAs(t *testing.T) []ISA {
	t.Helper()
	isas := vectorISAs(t)
	if len(isas) == 0 {
		if !vectorBuild {
			t.Skip("no vector ISA in this build: only the Go reference exists")
		}
		t.Skip("no vector ISA on this CPU (neither AVX2 nor AVX-512): only the Go reference runs")
	}
	return isas
}

const (
	guardLen  = 32         // elements of guard band on each side
	sentinel  = 0x7fc0dead // fp32 NaN that no kernel produces
	sentinelH = 0x7fde     // bf16 NaN pattern for uint16 guard bands
)

// guarded is a slice at a chosen byte offset from a 64-byte boundary,
// between guard bands of sentinels.
type guardedF32 struct {
	buf []float32
	lo  int
	n   int
}

func newGuardedF32(n, offElems int) *guardedF32 {
	buf := make([]float32, n+2*guardLen+32)
	a := uintptr(unsafe.Pointer(&buf[0]))
	base := int((64-a%64)%64/4) + 16 // 64-byte aligned, at least 16 elements in
	lo := base + offElems
	for i := range buf {
		buf[i] = math.Float32frombits(sentinel)
	}
	return &guardedF32{buf: buf, lo: lo, n: n}
}

func (g *guardedF32) s() []float32 { return g.buf[g.lo : g.lo+g.n : g.lo+g.n] }

func (g *guardedF32) check(t testing.TB, what string) {
	t.Helper()
	for i, f := range g.buf {
		if (i < g.lo || i >= g.lo+g.n) && math.Float32bits(f) != sentinel {
			t.Fatalf("%s: write past the end at index %d (slice %d..%d): %#x", what, i-g.lo, 0, g.n, math.Float32bits(f))
		}
	}
}

type guardedU16 struct {
	buf []uint16
	lo  int
	n   int
}

func newGuardedU16(n, offElems int) *guardedU16 {
	buf := make([]uint16, n+2*guardLen+64)
	a := uintptr(unsafe.Pointer(&buf[0]))
	base := int((64-a%64)%64/2) + 32
	lo := base + offElems
	for i := range buf {
		buf[i] = sentinelH
	}
	return &guardedU16{buf: buf, lo: lo, n: n}
}

func (g *guardedU16) s() []uint16 { return g.buf[g.lo : g.lo+g.n : g.lo+g.n] }

func (g *guardedU16) check(t testing.TB, what string) {
	t.Helper()
	for i, h := range g.buf {
		if (i < g.lo || i >= g.lo+g.n) && h != sentinelH {
			t.Fatalf("%s: write past the end at index %d (slice 0..%d): %#x", what, i-g.lo, g.n, h)
		}
	}
}

func sameF32(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

func sameBF16(a, b uint16) bool {
	return a == b || (bf16.ToFloat32(a) != bf16.ToFloat32(a) && bf16.ToFloat32(b) != bf16.ToFloat32(b))
}

// config is one combination of the kernel's variants.
type config struct {
	gradBF16, out bool
	mode          Mode
}

func allConfigs() []config {
	var cs []config
	for _, g := range []bool{false, true} {
		for _, o := range []bool{false, true} {
			for _, m := range []Mode{AdamW, AdamL2} {
				cs = append(cs, config{g, o, m})
			}
		}
	}
	return cs
}

func (c config) String() string {
	return fmt.Sprintf("gradBF16=%v out=%v mode=%v", c.gradBF16, c.out, c.mode)
}

func randParams(r *rand.Rand, mode Mode) Params {
	return Params{
		LR: math.Pow(10, -1-3*r.Float64()), Beta1: 0.8 + 0.19*r.Float64(), Beta2: 0.99 + 0.0099*r.Float64(),
		Eps: math.Pow(10, -10+4*r.Float64()), WeightDecay: 0.1 * r.Float64(), Step: 1 + r.Int64N(5000),
		GradScale: math.Pow(2, float64(r.IntN(31)-15)) * (0.5 + r.Float64()), Mode: mode,
	}
}

// state is inputs of one step.
type state struct {
	param, grad, m, v []float32
	gradH             []uint16
}

func randState(r *rand.Rand, n int) state {
	s := state{make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]uint16, n)}
	for i := range n {
		s.param[i] = float32(r.NormFloat64())
		s.grad[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-4)))
		s.gradH[i] = bf16.FromFloat32(s.grad[i])
		s.m[i] = float32(r.NormFloat64() * 1e-2)
		s.v[i] = float32(math.Abs(r.NormFloat64()) * 1e-4)
	}
	return s
}

// offsets of each slice from a 64-byte boundary, in elements.
type offsets struct{ param, grad, m, v, out int }

// runCase runs one step with isa on guarded copies of s and compares with
// the reference.
func runCase(t testing.TB, isa ISA, c config, p Params, s state, off offsets) {
	t.Helper()
	n := len(s.param)
	want := state{clone(s.param), nil, clone(s.m), clone(s.v), nil}
	var wantOut []uint16
	if c.out {
		wantOut = make([]uint16, n)
	}
	k := makeConsts(p)
	if c.gradBF16 {
		refBF16(&k, p.Mode, want.param, s.gradH, want.m, want.v, wantOut)
	} else {
		refF32(&k, p.Mode, want.param, s.grad, want.m, want.v, wantOut)
	}

	gp, gm, gv := newGuardedF32(n, off.param), newGuardedF32(n, off.m), newGuardedF32(n, off.v)
	copy(gp.s(), s.param)
	copy(gm.s(), s.m)
	copy(gv.s(), s.v)
	var gg *guardedF32
	var gh *guardedU16
	if c.gradBF16 {
		gh = newGuardedU16(n, off.grad)
		copy(gh.s(), s.gradH)
	} else {
		gg = newGuardedF32(n, off.grad)
		copy(gg.s(), s.grad)
	}
	var gout *guardedU16
	var out []uint16
	if c.out {
		gout = newGuardedU16(n, off.out)
		out = gout.s()
	}
	ks := isa
	if c.gradBF16 {
		ks.adamBF16(&k, p.Mode, gp.s(), gh.s(), gm.s(), gv.s(), out)
	} else {
		ks.adamF32(&k, p.Mode, gp.s(), gg.s(), gm.s(), gv.s(), out)
	}
	what := fmt.Sprintf("%v %v n=%d %+v", isa, c, n, off)
	gp.check(t, what+" param")
	gm.check(t, what+" m")
	gv.check(t, what+" v")
	if gg != nil {
		gg.check(t, what+" grad")
	} else {
		gh.check(t, what+" grad")
	}
	if gout != nil {
		gout.check(t, what+" out")
	}
	for i := range n {
		if !sameF32(gp.s()[i], want.param[i]) || !sameF32(gm.s()[i], want.m[i]) || !sameF32(gv.s()[i], want.v[i]) {
			t.Fatalf("%s: element %d: got p,m,v %x %x %x want %x %x %x (inputs p %g g %g m %g v %g)", what, i,
				math.Float32bits(gp.s()[i]), math.Float32bits(gm.s()[i]), math.Float32bits(gv.s()[i]),
				math.Float32bits(want.param[i]), math.Float32bits(want.m[i]), math.Float32bits(want.v[i]),
				s.param[i], s.grad[i], s.m[i], s.v[i])
		}
		if c.out && !sameBF16(out[i], wantOut[i]) {
			t.Fatalf("%s: element %d: bf16 out %#x want %#x", what, i, out[i], wantOut[i])
		}
	}
}

func clone(s []float32) []float32 { return append([]float32(nil), s...) }

// TestKernelsAllLengthsAllMisalignments: every ISA against the reference,
// bit for bit, for every length 0..257, every variant, and every
// misalignment of each slice within a 64-byte line (each slice walks
// through all its offsets while the others take other offsets), with guard
// bands around every slice.
func TestKernelsAllLengthsAllMisalignments(t *testing.T) {
	isas := requireVectorISAs(t)
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 257; n++ {
		s := randState(r, n)
		for ci, c := range allConfigs() {
			p := randParams(r, c.mode)
			for o := range 32 {
				// o%16 walks each fp32 slice through its 16 offsets, o each
				// bf16 slice through its 32; the multipliers decorrelate them.
				off := offsets{param: o % 16, grad: (o*3 + ci) % 16, m: (o*5 + 1) % 16, v: (o*7 + 2) % 16, out: (o*11 + ci) % 32}
				if c.gradBF16 {
					off.grad = (o*3 + ci) % 32
				}
				if o >= 16 && n > 40 && n%7 != 0 {
					continue // long lengths: the 16 fp32 offsets suffice except on every 7th
				}
				for _, isa := range isas {
					runCase(t, isa, c, p, s, off)
					if isa == ISAAVX512 && c.out {
						// The non-temporal path for out, from any length.
						old := outNTMinLen
						outNTMinLen = 1
						runCase(t, isa, c, p, s, off)
						outNTMinLen = old
					}
				}
			}
		}
	}
}

// TestKernelsSpecialValues feeds NaN, ±Inf, ±0, subnormals and extremes.
func TestKernelsSpecialValues(t *testing.T) {
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(1), math.Float32frombits(0x807fffff),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-20, 1e20, 1, -1}
	isas := requireVectorISAs(t)
	r := rand.New(rand.NewPCG(3, 4))
	n := 203
	for round := range 40 {
		s := randState(r, n)
		for i := range n {
			if r.IntN(3) == 0 {
				s.param[i] = specials[r.IntN(len(specials))]
			}
			if r.IntN(3) == 0 {
				s.grad[i] = specials[r.IntN(len(specials))]
				s.gradH[i] = bf16.FromFloat32(s.grad[i])
			}
			if r.IntN(4) == 0 {
				s.m[i] = specials[r.IntN(len(specials))]
			}
			if r.IntN(4) == 0 {
				s.v[i] = float32(math.Abs(float64(specials[r.IntN(len(specials))])))
			}
		}
		for _, c := range allConfigs() {
			p := randParams(r, c.mode)
			if round%2 == 0 {
				p.GradScale = 1
			}
			for _, isa := range isas {
				runCase(t, isa, c, p, s, offsets{round % 16, round % 7, 3, 5, round % 32})
			}
		}
	}
}

// TestBF16RoundingAllPatterns: the fused bf16 output of every ISA agrees
// with internal/bf16 (PyTorch's round to nearest even, NaN stays NaN with
// its sign) on every bf16 pattern and on the values around each rounding
// tie.
func TestBF16RoundingAllPatterns(t *testing.T) {
	var xs []float32
	for h := 0; h < 1<<16; h += 3 {
		b := uint32(h) << 16
		xs = append(xs, math.Float32frombits(b), math.Float32frombits(b|0x8000), math.Float32frombits(b|0x7fff),
			math.Float32frombits(b|0x8001), math.Float32frombits(b|0x18000))
	}
	n := len(xs)
	// lr = 0 and wd = 0: param is left as it is, so out must be its bf16.
	p := Params{LR: 0, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1, GradScale: 1}
	for _, isa := range append(vectorISAs(t), ISAGo) {
		param := clone(xs)
		out := make([]uint16, n)
		k := makeConsts(p)
		isa.adamF32(&k, AdamW, param, make([]float32, n), make([]float32, n), make([]float32, n), out)
		for i, x := range xs {
			want := bf16.FromFloat32(x)
			if x != x {
				// NaN param: 0*NaN stays NaN but x86 may quiet it; the
				// bf16 must be a NaN of the same sign.
				if h := out[i]; bf16.ToFloat32(h) == bf16.ToFloat32(h) || h>>15 != want>>15 {
					t.Fatalf("%v: NaN %#x gave bf16 %#x", isa, math.Float32bits(x), h)
				}
				continue
			}
			if out[i] != want {
				t.Fatalf("%v: bf16(%#x) = %#x, want %#x", isa, math.Float32bits(x), out[i], want)
			}
		}
	}
}

func TestSumSquaresAndNonFinite(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	lens := []int{}
	for n := 0; n <= 257; n++ {
		lens = append(lens, n)
	}
	lens = append(lens, sumBlockLen-1, sumBlockLen, sumBlockLen+1, 3*sumBlockLen+17)
	for _, n := range lens {
		for _, off := range []int{0, 1, 5, 15} {
			g := newGuardedF32(n, off)
			gh := newGuardedU16(n, off*2+1)
			x, xh := g.s(), gh.s()
			var exact float64
			for i := range x {
				x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-4)))
				xh[i] = bf16.FromFloat32(x[i])
				exact += float64(x[i]) * float64(x[i])
			}
			want := sumSquares(ISAGo, x, nil)
			wantH := sumSquares(ISAGo, nil, xh)
			// Against a plain sequential float64 sum: n roundings at most.
			if math.Abs(want-exact) > float64(n)*0x1p-52*exact {
				t.Fatalf("n=%d: sum of squares %v, plain sum %v", n, want, exact)
			}
			for _, isa := range vectorISAs(t) {
				ks := isa
				if got := sumSquares(ks, x, nil); got != want {
					t.Fatalf("%v n=%d off=%d: sum of squares %v, reference %v", isa, n, off, got, want)
				}
				if got := sumSquares(ks, nil, xh); got != wantH {
					t.Fatalf("%v n=%d off=%d: bf16 sum of squares %v, reference %v", isa, n, off, got, wantH)
				}
				if ks.maxAbsF32(x) != maxAbsGoF32(x) || ks.maxAbsBF16(xh) != maxAbsGoBF16(xh) {
					t.Fatalf("%v n=%d: max abs differs", isa, n)
				}
				g.check(t, "sumsq")
				gh.check(t, "sumsq bf16")
			}
			if n > 64 || n == 0 {
				continue
			}
			// NonFinite: every position, Inf and NaN of both signs.
			for pos := range n {
				for _, bad := range []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001} {
					old, oldH := x[pos], xh[pos]
					x[pos], xh[pos] = math.Float32frombits(bad), uint16(bad>>16)|uint16(bad&1)
					for _, isa := range append(vectorISAs(t), ISAGo) {
						ks := isa
						if ks.maxAbsF32(x) < 0x7f800000 || ks.maxAbsBF16(xh) < 0x7f800000 {
							t.Fatalf("%v n=%d: %#x at %d not seen", isa, n, bad, pos)
						}
						if s := sumSquares(ks, x, nil); !math.IsInf(s, 1) && !math.IsNaN(s) {
							t.Fatalf("%v: sum of squares %v with %#x", isa, s, bad)
						}
					}
					x[pos], xh[pos] = old, oldH
				}
			}
			for _, isa := range append(vectorISAs(t), ISAGo) {
				ks := isa
				if ks.maxAbsF32(x) >= 0x7f800000 || ks.maxAbsBF16(xh) >= 0x7f800000 {
					t.Fatalf("%v n=%d: finite data reported non-finite", isa, n)
				}
			}
		}
	}
	// The largest finite values cannot overflow the float64 sum.
	big := []float32{math.MaxFloat32, -math.MaxFloat32, math.MaxFloat32}
	if s := SumSquares(big); math.IsInf(s, 0) || NonFinite(big) {
		t.Fatalf("max float32 values: sum %v, non-finite %v", s, NonFinite(big))
	}
}

func TestR4W3SameBits(t *testing.T) {
	isas := requireVectorISAs(t)
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 100, 257} {
		s := randState(r, n)
		want := []([]float32){clone(s.param), clone(s.grad), clone(s.m), clone(s.v)}
		r4w3Go(want[0], want[1], want[2], want[3])
		for _, isa := range isas {
			got := []([]float32){clone(s.param), clone(s.grad), clone(s.m), clone(s.v)}
			isa.r4w3(got[0], got[1], got[2], got[3])
			for a := range got {
				for i := range n {
					if !sameF32(got[a][i], want[a][i]) {
						t.Fatalf("%v n=%d array %d element %d: %v want %v", isa, n, a, i, got[a][i], want[a][i])
					}
				}
			}
		}
	}
}
