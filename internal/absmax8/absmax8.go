// Package absmax8 is 8-bit absmax quantization of weights, blockwise: the
// symmetric linear int8 code of LLM.int8() (Dettmers et al. 2022,
// "LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale":
// x_i8 = round(127·x / absmax)), with one scale per BlockSize = 64 values
// counted from the array's start (the last block may be shorter) rather
// than per row, so that a rank's shard of a chunk is coded on its own.
//
// Coding: the block's step f = absmax/127, rounded once to fp32 (0 for a
// block of zeros), is stored; code = x/f (a correctly rounded fp32
// division) rounded to nearest even and clamped to [−127, 127] (0 where f
// is 0). Decoding: code·f, rounded once to fp32: the device's decoding
// (gpu.Ops.DequantizeInt8) computes the same product. Storing f, not the
// absmax, makes quantizing the decoded values give the same bytes back
// (the largest decodes to fl(127·f), whose fl(·/127) is f again for every
// fp32 f of that form: checked over every mantissa), which a checkpoint
// of a frozen int8 base relies on.
//
// The stored layout (Bytes(n) bytes): the ⌈n/64⌉ fp32 steps f,
// little-endian, then n signed bytes.
package absmax8

import (
	"encoding/binary"
	"math"
)

// BlockSize is the number of values that share one step.
const BlockSize = 64

// Blocks is the number of steps of n elements.
func Blocks(n int) int { return (n + BlockSize - 1) / BlockSize }

// Bytes is the stored size of n elements.
func Bytes(n int) int64 { return 4*int64(Blocks(n)) + int64(n) }

// Quantize codes src into dst (Bytes(len(src)) bytes).
func Quantize(dst []byte, src []float32) {
	n := len(src)
	if int64(len(dst)) != Bytes(n) {
		panic("absmax8: Quantize into a buffer of the wrong size")
	}
	codes := dst[4*Blocks(n):]
	for b := range Blocks(n) {
		lo := b * BlockSize
		block := src[lo:min(lo+BlockSize, n)]
		var absmax float32
		for _, x := range block {
			absmax = max(absmax, float32(math.Abs(float64(x))))
		}
		f := absmax / 127
		binary.LittleEndian.PutUint32(dst[4*b:], math.Float32bits(f))
		for j, x := range block {
			q := 0.0
			if f > 0 {
				q = max(-127, min(127, math.RoundToEven(float64(x/f))))
			}
			codes[lo+j] = byte(int8(q))
		}
	}
}

// Dequantize decodes src (Bytes(len(dst)) bytes) into dst.
func Dequantize(dst []float32, src []byte) {
	n := len(dst)
	if int64(len(src)) != Bytes(n) {
		panic("absmax8: Dequantize from a buffer of the wrong size")
	}
	codes := src[4*Blocks(n):]
	for b := range Blocks(n) {
		f := math.Float32frombits(binary.LittleEndian.Uint32(src[4*b:]))
		for i := b * BlockSize; i < min((b+1)*BlockSize, n); i++ {
			dst[i] = float32(int8(codes[i])) * f
		}
	}
}

// DequantizeBlocks decodes blocks [lo, hi) of n values coded in src into
// dst (the values lo·BlockSize up to min(hi·BlockSize, n)), the same
// values as Dequantize: a device's decoding, one range of blocks at a time.
func DequantizeBlocks(dst []float32, src []byte, n, lo, hi int) {
	codes := src[4*Blocks(n):]
	a := lo * BlockSize
	for blk := lo; blk < hi; blk++ {
		f := math.Float32frombits(binary.LittleEndian.Uint32(src[4*blk:]))
		for i := blk * BlockSize; i < min((blk+1)*BlockSize, n); i++ {
			dst[i-a] = float32(int8(codes[i])) * f
		}
	}
}
