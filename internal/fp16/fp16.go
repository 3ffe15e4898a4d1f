// Package fp16 converts between float32 and IEEE 754 binary16 (half
// precision, PyTorch's torch.float16): round to nearest, ties to even, as
// numpy's float16 and CUDA's __float2half_rn round; values past 65504
// (after rounding) become infinite, values under 2^-24 round through the
// subnormals to zero; NaN stays NaN (quiet, its top payload bits kept).
// A binary16 is stored as its 16 raw bits in a uint16.
//
// The conversions are github.com/x448/float16's, a small, well-kept
// package whose float32 → binary16 rounding its author checked on all
// 2^32 inputs; fp16_test.go checks it here against numpy on every
// binary16 value and on every rounding boundary between two of them.
package fp16

import "github.com/x448/float16"

// Max is the largest finite binary16, 65504.
const Max = 65504

// FromFloat32 rounds f to the nearest binary16, ties to even.
func FromFloat32(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// ToFloat32 widens a binary16 exactly.
func ToFloat32(h uint16) float32 { return float16.Frombits(h).Float32() }

// Round returns f rounded to binary16 precision, as a float32.
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
