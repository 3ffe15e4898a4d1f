package cpu

import "math"

// expShift sets each x of row to float32(exp(float64(x) - shift)) and
// returns the float64 sum of the new values, added in index order: the
// softmax's exponentials. exp is attnExp, not math.Exp: the same float64
// evaluation inlined (math.Exp's call was a third of the attention's
// non-GEMM time), within 1e-15 relative of math.Exp, so the fp32 results
// are math.Exp's rounded except where the float64 lies within ~1e-15 of a
// rounding boundary (attn_exp_test.go counts them).
func expShift(row []float32, shift float64) float64 {
	var sum float64
	for j, x := range row {
		p := float32(attnExp(float64(x) - shift))
		row[j] = p
		sum += float64(p)
	}
	return sum
}

// attnExp is e^x in float64 for the softmax: x = (32m + j)·ln2/32 + r,
// |r| ≤ ln2/64 (Cody–Waite, ln2/32 in two parts, m and j from rounding
// x·32/ln2 with the 1.5·2⁵² shifter), e^x = 2^m · 2^(j/32) · e^r, with
// 2^(j/32) from a table of math.Exp2 and e^r by its Taylor series to r⁶
// (remainder below 4e-18 relative), evaluated in Estrin's order to keep
// the dependency chain short. Outside [-708, 709] (the fp32 result is 0
// or +Inf long before) and for NaN it is math.Exp.
func attnExp(x float64) float64 {
	const (
		invL    = 32 / math.Ln2
		lHi     = 0.021660849393811077   // ln2/32 rounded to 32 bits of mantissa: n·lHi is exact
		lLo     = -1.312785960212839e-12 // ln2/32 - lHi
		shifter = 0x1.8p52
	)
	if !(x >= -708 && x <= 709) {
		return math.Exp(x)
	}
	t := x*invL + shifter
	k := int64(math.Float64bits(t) - math.Float64bits(shifter)) // n, as t's mantissa holds it
	n := t - shifter
	r := (x - n*lHi) - n*lLo
	r2 := r * r
	p := (1 + r) + r2*((0.5+r*(1.0/6))+r2*((1.0/24+r*(1.0/120))+r2*(1.0/720)))
	return p * exp2Table[k&31] * math.Float64frombits(uint64(k>>5+1023)<<52)
}

// exp2Table[j] = 2^(j/32).
var exp2Table = func() (t [32]float64) {
	for j := range t {
		t[j] = math.Exp2(float64(j) / 32)
	}
	return t
}()
