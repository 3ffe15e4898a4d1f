package cpuadam

import (
	"math"

	"github.com/strata-ai/strata/internal/bf16"
)

// kconsts are the per-step scalars, computed once in float64 and rounded
// once to float32 (see the package doc). Each row is one scalar broadcast
// to 8 lanes, so the AVX2 kernel takes them as 32-byte memory operands and
// the AVX-512 kernel broadcasts lane 0 of each row; the row order is part of
// the assembly contract (offsets k* in adam_amd64.s).
type kconsts struct {
	row [kRows][8]float32
}

const (
	kGradScale  = iota // gs
	kBeta1             // b1
	kOneMinusB1        // 1 - beta1
	kBeta2             // b2
	kOneMinusB2        // 1 - beta2
	kNegStep           // -lr / (1 - beta1^t)
	kInvSqrtBC2        // 1 / sqrt(1 - beta2^t)
	kEps               // eps
	kDecay             // 1 - lr*wd (AdamW) or 1 (AdamL2)
	kL2                // wd (AdamL2) or 0 (AdamW)
	kI7FFF             // integer 0x7fff (bf16 rounding bias)
	kI1                // integer 1
	kI40               // integer 0x40 (bf16 quiet-NaN bit)

	// The int8 maps of moments.go (integers unless marked float).
	kAbs     // 0x7fffffff
	kI7F     // 0x7f: m's largest code
	kI80     // 0x80: m's sign bit
	kSign    // 0x80000000
	kMMag    // 0x07f00000: m's magnitude bits of code<<20
	kSubCode // 7<<20: a magnitude<<20 above it is a normal code
	kMDec    // mDecodeBias: a normal magnitude<<20 + kMDec is its value's bits
	kVDec    // the same for v
	kVMax    // 0xff: v's largest code
	kOne     // float 1: the divisor of a zero block

	// The int8 kernels' encoding by exponent and subnormal tables (moments_amd64.s).
	kExp     // 0x7f800000: fp32's exponent field
	kMFmin   // mMinNormalBits: the exponent field of m's smallest normal, <<23
	kVFmin   // vMinNormalBits
	kK257    // (127+3+127)<<23: minus an exponent field e<<23, the bits of 2^(3-(e-127))
	kMBase   // -(mMinNormalBits>>20) (mod 2^32): a field<<20 plus this is its code's 8s
	kVBase   // -(vMinNormalBits>>20)
	kI80W    // 0x00800080: m's sign bit in two 16-bit lanes
	kMSubTab // float lanes i·2^-17: m's subnormal values by fraction i
	kVSubTab // float lanes i·2^-33 (AVX-512's VPERMPS reads a table and the row after it)
	kPerm    // lanes 0, 4, 1, 5, 2, 6, 3, 7: VPERMD's order for two blocks of packed codes
	kRows
)

func (k *kconsts) set(r int, f float32) {
	for i := range k.row[r] {
		k.row[r][i] = f
	}
}

func (k *kconsts) get(r int) float32 { return k.row[r][0] }

// makeConsts lays out the scalars of one step (adam.Params.Scalars: each
// computed in float64 and rounded once to float32) for the kernels.
func makeConsts(p Params) kconsts {
	sc := p.Scalars()
	var k kconsts
	k.set(kGradScale, sc.GradScale)
	k.set(kBeta1, sc.Beta1)
	k.set(kOneMinusB1, sc.OneMinusB1)
	k.set(kBeta2, sc.Beta2)
	k.set(kOneMinusB2, sc.OneMinusB2)
	k.set(kNegStep, sc.NegStep)
	k.set(kInvSqrtBC2, sc.InvSqrtBC2)
	k.set(kEps, sc.Eps)
	k.set(kDecay, sc.Decay)
	k.set(kL2, sc.L2)
	k.set(kI7FFF, math.Float32frombits(0x7fff))
	k.set(kI1, math.Float32frombits(1))
	k.set(kI40, math.Float32frombits(0x40))
	for _, c := range [...]struct {
		row  int
		bits uint32
	}{
		{kAbs, absMask}, {kI7F, mMaxCode}, {kI80, 0x80}, {kSign, 0x80000000},
		{kMMag, mMaxCode << fracShift}, {kSubCode, 7 << fracShift},
		{kMDec, mDecodeBias}, {kVDec, vDecodeBias},
		{kVMax, vMaxCode}, {kOne, math.Float32bits(1)},
		{kExp, 0x7f800000}, {kMFmin, mMinNormalBits}, {kVFmin, vMinNormalBits}, {kK257, (127 + 3 + 127) << 23},
		{kMBase, -(mMinNormalBits >> fracShift) & 0xffffffff}, {kVBase, -(vMinNormalBits >> fracShift) & 0xffffffff},
		{kI80W, 0x00800080},
	} {
		k.set(c.row, math.Float32frombits(c.bits))
	}
	for i := range 8 {
		k.row[kPerm][i] = math.Float32frombits(uint32(i/2 + i%2*4))
		k.row[kMSubTab][i] = float32(i) * mSubQuantum
		k.row[kVSubTab][i] = float32(i) * vSubQuantum
	}
	return k
}

// scalars is kconsts unpacked for the Go loop.
type scalars struct {
	gs, b1, omb1, b2, omb2, negStep, invSqrtBC2, eps, decay, l2 float32
	useL2                                                       bool
}

func (k *kconsts) scalars(mode Mode) scalars {
	return scalars{
		gs: k.get(kGradScale), b1: k.get(kBeta1), omb1: k.get(kOneMinusB1),
		b2: k.get(kBeta2), omb2: k.get(kOneMinusB2), negStep: k.get(kNegStep),
		invSqrtBC2: k.get(kInvSqrtBC2), eps: k.get(kEps), decay: k.get(kDecay), l2: k.get(kL2),
		useL2: mode == AdamL2,
	}
}

// refStepF32 is the oracle: the package doc's formula, one element at a
// time, every operation rounded to float32 as the kernels round it (fma32
// where they use a fused multiply-add). The assembly kernels give the same
// bits.
func refStepF32(p Params, param, grad, m, v []float32, out []uint16) {
	k := makeConsts(p)
	refF32(&k, p.Mode, param, grad, m, v, out)
}

func refStepBF16(p Params, param []float32, grad []uint16, m, v []float32, out []uint16) {
	k := makeConsts(p)
	refBF16(&k, p.Mode, param, grad, m, v, out)
}

func refF32(k *kconsts, mode Mode, param, grad, m, v []float32, out []uint16) {
	s := k.scalars(mode)
	grad, m, v = grad[:len(param)], m[:len(param)], v[:len(param)]
	for i := range param {
		param[i], m[i], v[i] = s.one(param[i], grad[i], m[i], v[i])
	}
	if out != nil {
		bf16.FromFloat32s(out, param)
	}
}

func refBF16(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
	s := k.scalars(mode)
	grad, m, v = grad[:len(param)], m[:len(param)], v[:len(param)]
	for i := range param {
		param[i], m[i], v[i] = s.one(param[i], bf16.ToFloat32(grad[i]), m[i], v[i])
	}
	if out != nil {
		bf16.FromFloat32s(out, param)
	}
}

// one is the update of one element. Each line rounds once to float32; the
// explicit float32() conversions stop the compiler from fusing a multiply
// and an add that the kernels keep apart.
func (s *scalars) one(x, g, m, v float32) (float32, float32, float32) {
	g = float32(g * s.gs)
	if s.useL2 {
		g = fma32(s.l2, x, g)
	}
	m = fma32(s.b1, m, float32(s.omb1*g))
	v = fma32(s.b2, v, float32(float32(s.omb2*g)*g))
	d := fma32(float32(math.Sqrt(float64(v))), s.invSqrtBC2, s.eps)
	x = fma32(s.negStep, float32(m/d), float32(x*s.decay))
	return x, m, v
}

// fma32 returns a*b+c rounded once to float32 (round to nearest even), as
// VFMADD*PS computes it. The product of two float32 is exact in float64;
// the sum p+c is computed with its exact error e (TwoSum), rounded to 53
// bits with round-to-odd, and then to 24 bits: round-to-odd at a precision
// of at least 2×24+2 bits followed by round-to-nearest gives the correctly
// rounded result (Boldo and Melquiond), subnormals included, and never
// meets float64's own underflow or overflow for float32 inputs.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b) // exact: 48 significant bits
	cc := float64(c)
	s := p + cc
	bits := math.Float64bits(s)
	if bits&0x7ff0000000000000 == 0x7ff0000000000000 { // Inf or NaN: nothing to round
		return float32(s)
	}
	// TwoSum: s + e == p + cc exactly.
	bb := s - p
	e := (p - (s - bb)) + (cc - bb)
	if e != 0 && bits&1 == 0 {
		// Round to odd: the exact value lies between s and its neighbour
		// in the direction of e; that neighbour is odd.
		if (e > 0) == (s > 0) {
			bits++
		} else {
			bits--
		}
		s = math.Float64frombits(bits)
	}
	return float32(s)
}
