package cpuadam

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// exactFMA32 is a*b+c computed exactly with big.Float and rounded once to
// float32 (Float32 rounds to nearest even, subnormals included).
func exactFMA32(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(2000).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetPrec(2000).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetPrec(2000).SetFloat64(float64(c)))
	f, _ := x.Float32()
	if f == 0 {
		// big.Float has no signed zero from a sum; IEEE: exact zero sum is
		// +0 unless both addends are -0.
		p := float64(a) * float64(b)
		if math.Signbit(p) && math.Signbit(float64(c)) && c == 0 && p == 0 {
			return float32(math.Copysign(0, -1))
		}
		if x.Sign() != 0 { // underflowed to zero: keep the sign of the value
			if x.Sign() < 0 {
				return float32(math.Copysign(0, -1))
			}
			return 0
		}
		return 0
	}
	return f
}

// TestFMA32 checks fma32 against exact arithmetic on random operands,
// operands chosen to make the exact sum a near-tie (where a double
// rounding through float64 would go wrong), and subnormal results.
func TestFMA32(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	check := func(a, b, c float32) {
		t.Helper()
		if math.IsInf(float64(a)*float64(b)+float64(c), 0) || math.IsNaN(float64(a)*float64(b)+float64(c)) {
			return
		}
		got, want := fma32(a, b, c), exactFMA32(a, b, c)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%#x, %#x, %#x) = %#x, want %#x", math.Float32bits(a), math.Float32bits(b), math.Float32bits(c),
				math.Float32bits(got), math.Float32bits(want))
		}
	}
	for range 100000 {
		a := math.Float32frombits(r.Uint32())
		b := math.Float32frombits(r.Uint32())
		c := math.Float32frombits(r.Uint32())
		check(a, b, c)
		// Same magnitude: cancellation.
		check(a, b, -float32(float64(a)*float64(b)))
		// c exactly a float32 tie away from the product, plus a tiny term
		// below float64's precision: the case double rounding gets wrong.
		x := float32(1 + r.Float64())
		tie := math.Float32frombits(math.Float32bits(x)&^0x1fff | 0x1000) // 24-bit mantissa midpoint not representable
		check(1+0x1p-23, x, tie*0x1p-30)
		check(x, 1+0x1p-23, float32(math.Ldexp(1, -60)))
		check(x, x, -math.Float32frombits(r.Uint32()&0x807fffff)) // subnormal addend
		check(math.Float32frombits(r.Uint32()&0x807fffff|0x00800000), 0x1p-20, math.Float32frombits(r.Uint32()&0x807fffff))
	}
	// Hand-made double-rounding case: a*b = 1 + 2^-24 + 2^-70 exactly
	// would round to 1+2^-24 in float64 then to 1 in float32 (tie to even);
	// the correct result is 1+2^-23.
	a := float32(1 + 0x1p-12)
	b := float32(1 + 0x1p-12)
	// (1+2^-12)^2 = 1 + 2^-11 + 2^-24; add c = -2^-11 + 2^-70 scaled into float32.
	check(a, b, float32(-0x1p-11+0x1p-47))
	check(a, b, -0x1p-11)
}

// pytorchAdamW is a float64 transcription of torch.optim.AdamW's
// single-tensor step (torch/optim/adamw.py, _single_tensor_adamw with
// amsgrad=False, maximize=False), and of torch.optim.Adam with
// weight_decay for AdamL2:
//
//	param.mul_(1 - lr * weight_decay)                  # AdamW only
//	grad = grad.add(param, alpha=weight_decay)         # Adam (L2) only
//	exp_avg.lerp_(grad, 1 - beta1)
//	exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//	bias_correction1 = 1 - beta1 ** step
//	bias_correction2 = 1 - beta2 ** step
//	step_size = lr / bias_correction1
//	denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//	param.addcdiv_(exp_avg, denom, value=-step_size)
//
// with the gradient multiplied by GradScale first (what dividing by the
// loss scale and multiplying by the clip coefficient does).
func pytorchAdamW(p Params, param, grad, m, v []float64) {
	bc1 := 1 - math.Pow(p.Beta1, float64(p.Step))
	bc2 := 1 - math.Pow(p.Beta2, float64(p.Step))
	for i := range param {
		g := grad[i] * p.GradScale
		if p.Mode == AdamW {
			param[i] *= 1 - p.LR*p.WeightDecay
		} else {
			g += p.WeightDecay * param[i]
		}
		m[i] += (g - m[i]) * (1 - p.Beta1)
		v[i] = v[i]*p.Beta2 + (1-p.Beta2)*g*g
		denom := math.Sqrt(v[i])/math.Sqrt(bc2) + p.Eps
		param[i] += -(p.LR / bc1) * m[i] / denom
	}
}

// TestReferenceAgainstPyTorch runs 1000 steps of the float32 reference and
// of the float64 transcription of PyTorch from the same start, with the
// same float32 gradients (noisy, with a drift, a loss-scale changing over
// time and some elements with tiny gradients where eps matters).
//
// Tolerances, and why: each float32 step rounds param once per operation
// (about 3 roundings of |p| ~ 1, i.e. ≤ 1.5 ulp(p) ≈ 1.8e-7); the errors
// add over 1000 steps at worst linearly, so |Δparam| ≤ 1000 × 1.5 ulp(p)
// ≈ 1.8e-4 × max(1, |p|); we assert 2e-4 × max(1, |p|). m and v are
// contracting averages (factor beta1, beta2), so their relative error
// stays below a few ulp / (1 - beta): 1e-5 for m (1 - beta1 = 0.1, plus
// cancellation: we measure m relative to the scale of g, where the L2
// term wd×p carries param's own error, bounded relative to max(1, |p|)) and 5e-4
// for v (1 - beta2 = 0.001; the bound is 2 ulp × 1000 ≈ 2.4e-4).
func TestReferenceAgainstPyTorch(t *testing.T) {
	for _, mode := range []Mode{AdamW, AdamL2} {
		const n, steps = 512, 1000
		r := rand.New(rand.NewPCG(11, uint64(mode)))
		p32, m32, v32 := make([]float32, n), make([]float32, n), make([]float32, n)
		p64, m64, v64 := make([]float64, n), make([]float64, n), make([]float64, n)
		g32, g64 := make([]float32, n), make([]float64, n)
		scale := make([]float64, n)
		for i := range n {
			p32[i] = float32(r.NormFloat64())
			p64[i] = float64(p32[i])
			scale[i] = math.Pow(10, float64(r.IntN(8)-6))
		}
		p := Params{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Mode: mode}
		var maxDP, maxDM, maxDV float64
		for step := int64(1); step <= steps; step++ {
			p.Step = step
			p.GradScale = 1 / math.Pow(2, float64(step%5)) // a changing loss scale
			for i := range n {
				g32[i] = float32((r.NormFloat64() + 0.3) * scale[i] * math.Pow(2, float64(step%5)))
				g64[i] = float64(g32[i])
			}
			refStepF32(p, p32, g32, m32, v32, nil)
			pytorchAdamW(p, p64, g64, m64, v64)
			for i := range n {
				maxDP = max(maxDP, math.Abs(float64(p32[i])-p64[i])/max(1, math.Abs(p64[i])))
				maxDM = max(maxDM, math.Abs(float64(m32[i])-m64[i])/(scale[i]+p.WeightDecay*max(1, math.Abs(p64[i]))))
				if v64[i] > 0 {
					maxDV = max(maxDV, math.Abs(float64(v32[i])-v64[i])/v64[i])
				}
			}
		}
		t.Logf("%v: max |Δparam| %.3g (relative to max(1,|p|)), |Δm|/scale %.3g, |Δv|/v %.3g", mode, maxDP, maxDM, maxDV)
		if maxDP > 2e-4 || maxDM > 1e-5 || maxDV > 5e-4 {
			t.Fatalf("%v: reference drifted from PyTorch: param %.3g (bound 2e-4), m %.3g (1e-5), v %.3g (5e-4)", mode, maxDP, maxDM, maxDV)
		}
	}
}
