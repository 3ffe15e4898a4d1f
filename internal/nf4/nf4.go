// Package nf4 is the 4-bit NormalFloat format of QLoRA (Dettmers et al.
// 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"), blockwise, as
// bitsandbytes computes it (csrc/kernels.cu: kQuantizeBlockwise with its
// dQuantizeNF4 decision tree, kDequantizeBlockwise with dDequantizeNF4):
// a frozen base's weights stored in about a quarter of their bf16 bytes.
//
// An array of n values is cut into blocks of BlockSize = 64 from its
// start (the last may be shorter). Each block keeps its absmax, the
// largest |x|, as fp32; each value is multiplied by the block's 1/absmax
// (rounded once to fp32, as bitsandbytes does) and coded as the number of
// the 15 published thresholds (the midpoints of Values, as fp32) it is
// strictly greater than, so a value at a threshold takes the lower code;
// decoding is Values[code]·absmax rounded once to fp32. A block of zeros
// has 1/absmax = +Inf: its values code as NaN compares, 0 (−1.0), and
// decode to −0, as bitsandbytes' do. Not built: the second level of
// double quantization (absmax in 8 bits, a scale per 256 blocks), which
// would save 3.5 of the 4 scale bits per parameter.
//
// The stored layout (Bytes(n) bytes): the ⌈n/64⌉ fp32 absmax values,
// little-endian, then ⌈n/2⌉ bytes of codes, two per byte, the earlier
// value in the high nibble (bitsandbytes' packing).
package nf4

import (
	"encoding/binary"
	"math"
)

// BlockSize is the number of values that share one absmax.
const BlockSize = 64

// Values are the 16 NF4 values (bitsandbytes' nf4 table, from its
// create_normal_map), code 0 to 15.
var Values = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// thresholds are dQuantizeNF4's pivots, low to high: code c is taken by
// thresholds[c-1] < x <= thresholds[c].
var thresholds = [15]float32{
	-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
	-0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
	0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
	0.5016634166240692, 0.6427869200706482, 0.8614784181118011,
}

// Blocks is the number of absmax values of n elements.
func Blocks(n int) int { return (n + BlockSize - 1) / BlockSize }

// Bytes is the stored size of n elements.
func Bytes(n int) int64 { return 4*int64(Blocks(n)) + int64(n+1)/2 }

// Code is the NF4 code of x (a value already multiplied by its block's
// 1/absmax).
func Code(x float32) byte {
	// The number of thresholds below x, by bisection of the 15 ascending
	// thresholds (the count the linear scan gives, in 4 comparisons).
	c := 0
	if x > thresholds[7] {
		c = 8
	}
	if x > thresholds[c+3] {
		c += 4
	}
	if x > thresholds[c+1] {
		c += 2
	}
	if x > thresholds[c] {
		c++
	}
	return byte(c)
}

// Quantize codes src into dst (Bytes(len(src)) bytes).
func Quantize(dst []byte, src []float32) {
	n := len(src)
	if int64(len(dst)) != Bytes(n) {
		panic("nf4: Quantize into a buffer of the wrong size")
	}
	codes := dst[4*Blocks(n):]
	clear(codes)
	for b := range Blocks(n) {
		block := src[b*BlockSize : min((b+1)*BlockSize, n)]
		var absmax float32
		for _, x := range block {
			absmax = max(absmax, float32(math.Abs(float64(x))))
		}
		binary.LittleEndian.PutUint32(dst[4*b:], math.Float32bits(absmax))
		inv := 1 / absmax
		for j, x := range block {
			i := b*BlockSize + j
			c := Code(x * inv)
			if i%2 == 0 {
				codes[i/2] |= c << 4
			} else {
				codes[i/2] |= c
			}
		}
	}
}

// Dequantize decodes src (Bytes(len(dst)) bytes) into dst.
func Dequantize(dst []float32, src []byte) {
	n := len(dst)
	if int64(len(src)) != Bytes(n) {
		panic("nf4: Dequantize from a buffer of the wrong size")
	}
	codes := src[4*Blocks(n):]
	for i := range dst {
		absmax := math.Float32frombits(binary.LittleEndian.Uint32(src[4*(i/BlockSize):]))
		c := codes[i/2] >> 4
		if i%2 == 1 {
			c = codes[i/2] & 0xf
		}
		dst[i] = Values[c] * absmax
	}
}

// DequantizeBlocks decodes blocks [lo, hi) of n values coded in src into
// dst (the values lo·BlockSize up to min(hi·BlockSize, n)), the same
// values as Dequantize: a device's decoding, one range of blocks at a time.
func DequantizeBlocks(dst []float32, src []byte, n, lo, hi int) {
	codes := src[4*Blocks(n):]
	a := lo * BlockSize
	for blk := lo; blk < hi; blk++ {
		absmax := math.Float32frombits(binary.LittleEndian.Uint32(src[4*blk:]))
		first, last := blk*BlockSize, min((blk+1)*BlockSize, n)
		for i := first; i < last; i += 2 { // blocks start even: a byte holds i and i+1
			c := codes[i/2]
			dst[i-a] = Values[c>>4] * absmax
			if i+1 < last {
				dst[i+1-a] = Values[c&0xf] * absmax
			}
		}
	}
}
