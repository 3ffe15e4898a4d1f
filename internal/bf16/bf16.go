// Package bf16 converts between float32 and bfloat16 the way PyTorch does:
// round to nearest, ties to even; NaN stays NaN (quiet), infinities stay
// infinite. A bfloat16 is stored as its 16 raw bits in a uint16.
package bf16

import "math"

// FromFloat32 rounds f to the nearest bfloat16, ties to even.
// It computes what PyTorch's c10::BFloat16 round_to_nearest_even computes:
//
//	if isnan(f) { return 0x7fc0 | sign }  // quiet NaN, sign kept
//	bits += 0x7fff + ((bits >> 16) & 1); return bits >> 16
func FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// ToFloat32 widens a bfloat16 exactly.
func ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Round returns f rounded to bfloat16 precision, as a float32.
func Round(f float32) float32 { return ToFloat32(FromFloat32(f)) }

// FromFloat32s converts src into dst; len(dst) must be at least len(src).
func FromFloat32s(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = FromFloat32(f)
	}
}

// ToFloat32s widens src into dst; len(dst) must be at least len(src).
func ToFloat32s(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = ToFloat32(h)
	}
}
