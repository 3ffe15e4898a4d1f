package config

import (
	"fmt"
	"math"
)

// The static loss_scale's range, [2^-100, 2^100] (internal/lossscale's
// MinStatic and MaxStatic), the same ceiling as the dynamic scale's start
// (initial_scale_power 0 to 100). Outside it fp16 holds no gradient a
// model has: above 2^100 every gradient larger than 65504·2^-100 ≈ 5e-26
// overflows fp16 (every step is skipped); below 2^-100 every one smaller
// than 2^-24·2^100 ≈ 7.6e22 flushes to zero (2^-24 is fp16's smallest
// subnormal). Both stay normal in fp32, where the scale and its
// reciprocal are used.
const staticScaleRange = "want 0 (dynamic scaling) or a static scale from 2^-100 to 2^100 (7.9e-31 to 1.3e+30): " +
	"outside it fp16 holds no real gradient, every step would overflow or every gradient flush to zero; " +
	"DeepSpeed's default is 0 (dynamic, from 2^16)"

// minScaleAbove says what is wrong when MinLossScale is above the scale a
// run starts at ("" when nothing is): with dynamic scaling the scale only
// halves down to min_loss_scale, so a minimum above 2^InitialScalePower
// would raise the scale at the first overflow. A static loss_scale never
// moves and min_loss_scale does not apply to it; it is checked only when
// static is true (the file writes min_loss_scale beside a static scale).
func (f FP16) minScaleAbove(static bool) string {
	if !(f.MinLossScale > 0) || f.InitialScalePower < 0 || f.InitialScalePower > 100 {
		return "" // reported by the keys' own checks
	}
	switch start := math.Ldexp(1, f.InitialScalePower); {
	case f.LossScale == 0 && f.MinLossScale > start:
		return fmt.Sprintf("%g is above the initial scale 2^%d = %g (initial_scale_power): the dynamic scale only halves down to min_loss_scale; lower min_loss_scale or raise initial_scale_power",
			f.MinLossScale, f.InitialScalePower, start)
	case f.LossScale > 0 && static && f.MinLossScale > f.LossScale:
		return fmt.Sprintf("%g is above the static loss_scale %g: a static scale never moves, so min_loss_scale does not apply; remove min_loss_scale, or set loss_scale 0 for dynamic scaling",
			f.MinLossScale, f.LossScale)
	}
	return ""
}
