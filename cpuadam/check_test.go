package cpuadam

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestMomentCheck: what the encoder and the Step kernels (this CPU's best
// ISA) write always passes Moment.Check, over every kind of block (zeros,
// -0, subnormals, wide ranges, a short last block); each way a stored
// block can be wrong is named with its block and elements.
func TestMomentCheck(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	gen := []func(i int) float32{
		func(int) float32 { return 0 },
		func(int) float32 { return float32(math.Copysign(0, -1)) },
		func(int) float32 { return float32(r.NormFloat64()) * 1e-40 }, // subnormal
		func(int) float32 { return float32(r.NormFloat64()) * float32(math.Ldexp(1, r.IntN(80)-40)) },
		func(i int) float32 {
			if i%300 == 0 {
				return 1e20
			}
			return float32(r.NormFloat64()) * 1e-30
		},
	}
	for _, n := range []int{4096, 4097, 5000, 70001} {
		for g, f := range gen {
			x := make([]float32, n)
			for i := range x {
				x[i] = f(i)
			}
			for _, second := range []bool{false, true} {
				v := x
				if second {
					v = make([]float32, n)
					for i, e := range x {
						v[i] = float32(math.Abs(float64(e)))
					}
				}
				mo := MomentsInt8.View(n, make([]byte, MomentsInt8.Bytes(n)), second)
				mo.Encode(v)
				if err := mo.Check(); err != nil {
					t.Fatalf("n %d generator %d second %v: the encoder's block refused: %v", n, g, second, err)
				}
			}
		}
		// The kernels' own stores, over a few steps.
		param, grad := make([]float32, n), make([]float32, n)
		for i := range param {
			param[i] = float32(r.NormFloat64())
		}
		s := narrowShard(MomentsInt8, param, grad, make([]float32, n), make([]float32, n), nil)
		for step := 1; step <= 5; step++ {
			for i := range grad {
				grad[i] = float32(r.NormFloat64()) * float32(math.Ldexp(1, r.IntN(40)-30))
				if i%1000 < 256 && step == 2 {
					grad[i] = 0 // whole zero blocks of gradient
				}
			}
			Step(Params{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: int64(step), GradScale: 1, Mode: AdamW}, s)
			if err := s.M.Check(); err != nil {
				t.Fatalf("n %d step %d: the kernel's m refused: %v", n, step, err)
			}
			if err := s.V.Check(); err != nil {
				t.Fatalf("n %d step %d: the kernel's v refused: %v", n, step, err)
			}
		}
	}
	// fp32 and bf16 moments have nothing to check.
	if err := MomentsF32.View(8, make([]byte, 32), false).Check(); err != nil {
		t.Fatal(err)
	}

	const n = 4184 // 17 blocks, the last short
	for _, c := range []struct {
		second bool
		edit   func(mo Moment)
		want   string
	}{
		{false, func(mo Moment) { mo.Scales[16] = float32(math.NaN()) }, "int8 m block 16 (elements 4096-4183): scale NaN is not finite"},
		{true, func(mo Moment) { mo.Scales[0] = float32(math.Inf(-1)) }, "int8 v block 0 (elements 0-255): scale -Inf is not finite"},
		{true, func(mo Moment) { mo.Scales[1] = float32(math.Copysign(0, -1)) }, "int8 v block 1 (elements 256-511): scale -0 is negative"},
		{false, func(mo Moment) { mo.Scales[0] = 0x1p81 }, "int8 m block 0 (elements 0-255): scale 2.4178516e+24 is above 2^80"},
		{false, func(mo Moment) { mo.Scales[1] = 0 }, "int8 m block 1 (elements 256-511): scale 0 with nonzero codes"},
		{true, func(mo Moment) { mo.Codes[5] = 0xff }, "int8 v block 0 (elements 0-255): scale 1 with a largest code of 0xff, not 1.0's 0xf8"},
		{false, func(mo Moment) {
			for i := 256; i < 512; i++ {
				mo.Codes[i] &= 0xbf // the top exponent bit cleared: no code of 1.0
			}
		}, "int8 m block 1 (elements 256-511): scale 1 with a largest code of"},
	} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.Float64())
		}
		for i := 0; i < n; i += QuantBlock {
			x[i] = 1 // every block's scale 1
		}
		mo := MomentsInt8.View(n, make([]byte, MomentsInt8.Bytes(n)), c.second)
		mo.Encode(x)
		if err := mo.Check(); err != nil {
			t.Fatal(err)
		}
		c.edit(mo)
		if err := mo.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}
