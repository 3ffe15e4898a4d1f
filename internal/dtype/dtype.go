// Package dtype names the element types that Strata stores and moves: the
// shared vocabulary of gpu, model, tier and engine.
package dtype

import "fmt"

// DType is an element type.
type DType uint8

const (
	F32  DType = iota + 1 // IEEE 754 binary32
	BF16                  // bfloat16: the top 16 bits of a binary32
	I32                   // int32 (token ids, targets)
	F64                   // IEEE 754 binary64 (reductions)
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16:
		return 2
	case F64:
		return 8
	}
	panic(fmt.Sprintf("dtype: unknown dtype %d", uint8(d)))
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case I32:
		return "i32"
	case F64:
		return "f64"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Parse accepts the names DeepSpeed and PyTorch users write.
func Parse(s string) (DType, error) {
	switch s {
	case "f32", "fp32", "float32", "float":
		return F32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "i32", "int32":
		return I32, nil
	case "f64", "fp64", "float64", "double":
		return F64, nil
	}
	return 0, fmt.Errorf("dtype: unknown dtype %q (want fp32, bf16, int32 or fp64)", s)
}
