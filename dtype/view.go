package dtype

import "unsafe"

// The views below reinterpret host bytes in place, without copying, as the
// element type they hold. Host memory and every device copy in Strata are
// little-endian (amd64, arm64), so the bytes are the elements. The length is
// len(b) divided by the element size; an empty b gives nil.

// Float32s views b as float32 elements.
func Float32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Uint16s views b as uint16 elements (bf16 bits).
func Uint16s(b []byte) []uint16 {
	if len(b) < 2 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

// Int32s views b as int32 elements.
func Int32s(b []byte) []int32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// Float64s views b as float64 elements.
func Float64s(b []byte) []float64 {
	if len(b) < 8 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), len(b)/8)
}

// Bytes views s as its bytes, the inverse of the views above: a file
// writer hands typed host memory to io.Writer without a copy.
func Bytes[T float32 | uint16 | int32 | float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
