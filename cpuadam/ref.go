package cpuadam

import (
	"math"

	"github.com/strata-ai/strata/internal/bf16"
)

// consts are the per-step scalars, computed once in float64 and rounded to
// float32 for the kernels.
type consts struct {
	gradScale, beta1, oneMinusBeta1, beta2, oneMinusBeta2 float32
	stepSize, invSqrtBC2, eps, decay, l2                  float32
}

func makeConsts(p Params) consts {
	bc1 := 1 - math.Pow(p.Beta1, float64(p.Step))
	bc2 := 1 - math.Pow(p.Beta2, float64(p.Step))
	c := consts{
		gradScale: float32(p.GradScale), beta1: float32(p.Beta1), oneMinusBeta1: float32(1 - p.Beta1),
		beta2: float32(p.Beta2), oneMinusBeta2: float32(1 - p.Beta2),
		stepSize: float32(p.LR / bc1), invSqrtBC2: float32(1 / math.Sqrt(bc2)), eps: float32(p.Eps), decay: 1,
	}
	if p.Mode == AdamW {
		c.decay = float32(1 - p.LR*p.WeightDecay)
	} else {
		c.l2 = float32(p.WeightDecay)
	}
	return c
}

func refStepF32(p Params, param, grad, m, v []float32, out []uint16) {
	c := makeConsts(p)
	for i := range param {
		refOne(&c, i, param, grad[i], m, v, out)
	}
}

func refStepBF16(p Params, param []float32, grad []uint16, m, v []float32, out []uint16) {
	c := makeConsts(p)
	for i := range param {
		refOne(&c, i, param, bf16.ToFloat32(grad[i]), m, v, out)
	}
}

func refOne(c *consts, i int, param []float32, g float32, m, v []float32, out []uint16) {
	x := param[i]
	g = g*c.gradScale + c.l2*x
	mi := c.beta1*m[i] + c.oneMinusBeta1*g
	vi := c.beta2*v[i] + c.oneMinusBeta2*g*g
	x = x*c.decay - c.stepSize*mi/(float32(math.Sqrt(float64(vi)))*c.invSqrtBC2+c.eps)
	m[i], v[i], param[i] = mi, vi, x
	if out != nil {
		out[i] = bf16.FromFloat32(x)
	}
}
