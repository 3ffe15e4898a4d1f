// Package dtype names the element types that Strata stores and moves.
//
// It is the shared vocabulary of gpu, model, tier and engine.
package dtype

import (
	"fmt"

	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/fp16"
)

//go:generate go tool stringer -type=DType -linecomment -output=dtype_string.go

// DType is an element type.
type DType uint8

const (
	// F32: IEEE 754 binary32
	F32 DType = iota + 1 // f32
	// BF16: bfloat16: the top 16 bits of a binary32
	BF16 // bf16
	// I32: int32 (token ids, targets)
	I32 // i32
	// F64: IEEE 754 binary64 (reductions)
	F64 // f64
	// U8: bytes (a Q8 array in a safetensors file)
	U8 // u8
	// Q8 is an 8-bit block-quantized array (cpuadam's int8 moments): for n
	// >= Q8MinElems, one fp32 scale per Q8Block elements, then n one-byte
	// codes; a smaller array is plain fp32. It has no fixed element size:
	// Bytes(n) is its size.
	Q8 // q8
	// NF4 is QLoRA's 4-bit NormalFloat, blockwise (internal/nf4: an fp32
	// absmax per 64 values, then two 4-bit codes a byte): a frozen base's
	// weights in the tiers. No fixed element size: Bytes(n).
	NF4 // nf4
	// INT8 is 8-bit absmax codes of weights, blockwise (internal/absmax8:
	// an fp32 step per 64 values, then one signed byte each): a frozen
	// base's weights in the tiers. No fixed element size: Bytes(n).
	INT8 // int8
	// F16 is IEEE 754 binary16 (torch.float16): fp16 mixed precision's
	// device params, gradients and activations (internal/fp16).
	F16 // f16
	// Rem16 is the part of an fp32 master kept beside its bf16 param
	// (strata.optimizer_state.master "bf16+remainder", cpuadam.Remainder):
	// n low halves of 16 bits, then a bit per element, eight to a byte,
	// saying that the param was rounded up. No fixed element size:
	// Bytes(n).
	Rem16 // rem16
)

// Q8Block is the number of elements that share one Q8 scale, counted from
// the start of the array; Q8MinElems is the smallest array stored as
// codes (the published 8-bit optimizers keep tensors under 4,096 elements
// in fp32).
const (
	Q8Block    = 256
	Q8MinElems = 4096
)

// Bytes is the size of n elements of d.
func (d DType) Bytes(n int) int64 {
	if d == Q8 {
		if n < Q8MinElems {
			return 4 * int64(n)
		}
		return 4*int64((n+Q8Block-1)/Q8Block) + int64(n)
	}
	if c := codecOf(d); c != nil {
		return c.Bytes(n) // NF4, INT8: the codec's size
	}
	if d == Rem16 {
		return 2*int64(n) + int64(n+7)/8
	}
	return int64(n) * int64(d.Size())
}

// Size returns the size of one element in bytes (Q8 has none: Bytes).
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	case F64:
		return 8
	case U8:
		return 1
	}
	panic(fmt.Sprintf("dtype: unknown dtype %d", uint8(d)))
}

// Parse accepts the names DeepSpeed and PyTorch users write.
func Parse(s string) (DType, error) {
	switch s {
	case "f32", "fp32", "float32", "float":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "f16", "fp16", "float16", "half":
		return F16, nil
	case "i32", "int32":
		return I32, nil
	case "f64", "fp64", "float64", "double":
		return F64, nil
	case "q8":
		return Q8, nil
	}
	return 0, fmt.Errorf("dtype: unknown dtype %q (want fp32, bf16, fp16, int32 or fp64)", s)
}

// Half says whether d is a 16-bit float: BF16 or F16.
func (d DType) Half() bool { return d == BF16 || d == F16 }

// Widen writes the 16-bit floats src of dtype d (BF16 or F16) into dst as
// float32, exactly; len(dst) must be at least len(src).
func Widen(d DType, dst []float32, src []uint16) {
	switch d {
	case BF16:
		bf16.ToFloat32s(dst, src)
	case F16:
		fp16.ToFloat32s(dst, src)
	default:
		panic(fmt.Sprintf("dtype: Widen of %s", d))
	}
}

// Narrow rounds src into dst as 16-bit floats of dtype d (BF16 or F16),
// to nearest, ties to even; len(dst) must be at least len(src).
func Narrow(d DType, dst []uint16, src []float32) {
	switch d {
	case BF16:
		bf16.FromFloat32s(dst, src)
	case F16:
		fp16.FromFloat32s(dst, src)
	default:
		panic(fmt.Sprintf("dtype: Narrow to %s", d))
	}
}

// Round is f rounded to d (F32: f itself; BF16 or F16 to nearest even).
func Round(d DType, f float32) float32 {
	switch d {
	case BF16:
		return bf16.Round(f)
	case F16:
		return fp16.Round(f)
	}
	return f
}
