package checkpoint

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"unsafe"
)

// littleEndian says whether the host stores numbers as the file formats
// do, so that a typed slice and its bytes can be copied with memmove.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// PutFloat32s writes src to dst as little-endian fp32; dst must be
// 4·len(src) bytes.
func PutFloat32s(dst []byte, src []float32) {
	if len(dst) != 4*len(src) {
		panic(fmt.Sprintf("checkpoint: PutFloat32s into %d bytes from %d values", len(dst), len(src)))
	}
	if len(src) == 0 {
		return
	}
	if littleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), len(dst)))
		return
	}
	for i, f := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
	}
}

// Float32Bytes returns src as little-endian fp32 bytes (a copy).
func Float32Bytes(src []float32) []byte {
	b := make([]byte, 4*len(src))
	PutFloat32s(b, src)
	return b
}

// GetFloat32s reads little-endian fp32 from src into dst; src must be
// 4·len(dst) bytes.
func GetFloat32s(dst []float32, src []byte) {
	if len(src) != 4*len(dst) {
		panic(fmt.Sprintf("checkpoint: GetFloat32s of %d bytes into %d values", len(src), len(dst)))
	}
	if len(dst) == 0 {
		return
	}
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(src)), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// Float32s returns the little-endian fp32 values of b (a copy); len(b) must
// be a multiple of 4.
func Float32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	GetFloat32s(out, b)
	return out
}

// PutBF16s writes src to dst as little-endian bf16; dst must be
// 2·len(src) bytes.
func PutBF16s(dst []byte, src []uint16) {
	if len(dst) != 2*len(src) {
		panic(fmt.Sprintf("checkpoint: PutBF16s into %d bytes from %d values", len(dst), len(src)))
	}
	if len(src) == 0 {
		return
	}
	if littleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), len(dst)))
		return
	}
	for i, h := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], h)
	}
}

// BF16Bytes returns src as little-endian bf16 bytes (a copy).
func BF16Bytes(src []uint16) []byte {
	b := make([]byte, 2*len(src))
	PutBF16s(b, src)
	return b
}

// GetBF16s reads little-endian bf16 from src into dst; src must be
// 2·len(dst) bytes.
func GetBF16s(dst []uint16, src []byte) {
	if len(src) != 2*len(dst) {
		panic(fmt.Sprintf("checkpoint: GetBF16s of %d bytes into %d values", len(src), len(dst)))
	}
	if len(dst) == 0 {
		return
	}
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), len(src)), src)
		return
	}
	for i := range dst {
		dst[i] = binary.LittleEndian.Uint16(src[2*i:])
	}
}

// BF16s returns the little-endian bf16 values of b (a copy).
func BF16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	GetBF16s(out, b)
	return out
}

func putF32(b []byte, f float32) { binary.LittleEndian.PutUint32(b, math.Float32bits(f)) }
func getF32(b []byte) float32    { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }
func putU16(b []byte, h uint16)  { binary.LittleEndian.PutUint16(b, h) }
func getU16(b []byte) uint16     { return binary.LittleEndian.Uint16(b) }

// bytesReaderAt reads from memory.
type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// transpose writes src (rows×cols, row-major) into dst as cols×rows, in
// 8×8 tiles, each dst row written contiguously (measured 5x faster than
// 32×32 tiles walked along src rows, whose 4 KiB strides thrash L1 sets).
func transpose(dst, src []float32, rows, cols int) {
	const tile = 8
	for r0 := 0; r0 < rows; r0 += tile {
		r1 := min(r0+tile, rows)
		for c0 := 0; c0 < cols; c0 += tile {
			c1 := min(c0+tile, cols)
			for c := c0; c < c1; c++ {
				d := dst[c*rows : c*rows+rows]
				for r := r0; r < r1; r++ {
					d[r] = src[r*cols+c]
				}
			}
		}
	}
}

// float32View is b as []float32 without a copy, when the host is
// little-endian and b is 4-byte aligned; else nil.
func float32View(b []byte) []float32 {
	if !littleEndian || len(b) < 4 || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// transposeStrided writes the transpose of src (k×n, row-major) into
// rows of dst stride apart: dst[r·stride + i] = src[i·n + r] for i < k,
// r < n; in 8×8 tiles, as transpose.
func transposeStrided(dst []float32, stride int, src []float32, k, n int) {
	const tile = 8
	for i0 := 0; i0 < k; i0 += tile {
		i1 := min(i0+tile, k)
		for r0 := 0; r0 < n; r0 += tile {
			r1 := min(r0+tile, n)
			for r := r0; r < r1; r++ {
				d := dst[r*stride : r*stride+i1]
				for i := i0; i < i1; i++ {
					d[i] = src[i*n+r]
				}
			}
		}
	}
}

// uint16View is b as []uint16 without a copy, when the host is
// little-endian and b is 2-byte aligned; else nil.
func uint16View(b []byte) []uint16 {
	if !littleEndian || len(b) < 2 || uintptr(unsafe.Pointer(&b[0]))%2 != 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}
