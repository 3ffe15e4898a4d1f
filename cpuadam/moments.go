package cpuadam

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/strata-ai/strata/internal/fp16"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/bf16"
)

//go:generate go tool stringer -type=Moments -linecomment -output=moments_string.go

// Moments is the stored precision of Adam's first and second moments (m
// and v) of an offloaded shard: the package doc's "Narrow moments".
type Moments uint8

const (
	// MomentsF32: fp32, 4 B each
	MomentsF32 Moments = iota // fp32
	// MomentsBF16: bf16, rounded to nearest even, 2 B each
	MomentsBF16 // bf16
	// MomentsInt8: 8-bit codes in blocks of QuantBlock with an fp32 scale each, ~1.016 B each
	MomentsInt8 // int8
	momentsCount
)

// QuantBlock is the number of elements that share one int8 scale (counted
// from the start of the shard).
const QuantBlock = dtype.Q8Block

// MinQuantElems is the smallest shard whose moments are stored in int8; a
// smaller one (norm weights, biases, a tail shard) keeps fp32 moments, as
// the published 8-bit optimizers keep tensors under 4,096 elements in
// fp32: their bytes do not matter and their statistics are the least
// smooth.
const MinQuantElems = dtype.Q8MinElems

// ParseMoments reads the names String prints.
func ParseMoments(s string) (Moments, error) {
	for m := range momentsCount {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("cpuadam: unknown moments precision %q (want fp32, bf16 or int8)", s)
}

// For is the precision a shard of n elements stores its moments in: m,
// except that int8 shards under MinQuantElems keep fp32.
func (m Moments) For(n int) Moments {
	if m == MomentsInt8 && n < MinQuantElems {
		return MomentsF32
	}
	return m
}

// DType is the element type the tier store and checkpoints keep a moment
// of precision m in (dtype.Q8 for int8).
func (m Moments) DType() dtype.DType {
	return [...]dtype.DType{MomentsF32: dtype.F32, MomentsBF16: dtype.BF16, MomentsInt8: dtype.Q8}[m]
}

// MomentsOf is the precision whose DType is d.
func MomentsOf(d dtype.DType) (Moments, error) {
	for m := range momentsCount {
		if m.DType() == d {
			return m, nil
		}
	}
	return 0, fmt.Errorf("cpuadam: no moments are stored as %v", d)
}

// Bytes is the stored size of one moment (m or v) of a shard of n
// elements: int8 codes follow their fp32 scales, one per QuantBlock.
func (m Moments) Bytes(n int) int64 { return m.DType().Bytes(n) }

func quantBlocks(n int) int { return (n + QuantBlock - 1) / QuantBlock }

// Moment is one moment of a shard in its stored form: exactly one of F32,
// BF16 or (Codes, Scales) is set. Second says it is v (never negative:
// unsigned codes with a wider exponent range) rather than m.
type Moment struct {
	F32    []float32
	BF16   []uint16
	Codes  []uint8
	Scales []float32 // one per QuantBlock of Codes
	Second bool
}

// View lays a moment of n elements in precision m over b (Bytes(n) long,
// 4-byte aligned), as the tier store leases it.
func (m Moments) View(n int, b []byte, second bool) Moment {
	if int64(len(b)) != m.Bytes(n) {
		panic(fmt.Sprintf("cpuadam: %v moment of %d elements over %d bytes, want %d", m, n, len(b), m.Bytes(n)))
	}
	mo := Moment{Second: second}
	if n == 0 {
		mo.F32 = []float32{}
		return mo
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	switch m.For(n) {
	case MomentsBF16:
		mo.BF16 = unsafe.Slice((*uint16)(p), n)
	case MomentsInt8:
		nb := quantBlocks(n)
		mo.Scales = unsafe.Slice((*float32)(p), nb)
		mo.Codes = b[4*nb:]
	default:
		mo.F32 = unsafe.Slice((*float32)(p), n)
	}
	return mo
}

// Len is the number of elements of mo.
func (mo Moment) Len() int { return len(mo.F32) + len(mo.BF16) + len(mo.Codes) }

// Precision is the stored precision of mo.
func (mo Moment) Precision() Moments {
	switch {
	case mo.BF16 != nil:
		return MomentsBF16
	case mo.Codes != nil:
		return MomentsInt8
	}
	return MomentsF32
}

// Slice is elements [lo, hi) of mo; for int8, lo is a multiple of
// QuantBlock and hi is too or is mo.Len().
func (mo Moment) Slice(lo, hi int) Moment {
	s := Moment{Second: mo.Second}
	switch {
	case mo.BF16 != nil:
		s.BF16 = mo.BF16[lo:hi]
	case mo.Codes != nil:
		if lo%QuantBlock != 0 || (hi%QuantBlock != 0 && hi != len(mo.Codes)) {
			panic(fmt.Sprintf("cpuadam: int8 moment sliced at [%d, %d), not on blocks of %d", lo, hi, QuantBlock))
		}
		s.Codes = mo.Codes[lo:hi]
		s.Scales = mo.Scales[lo/QuantBlock : quantBlocks(hi)]
	default:
		s.F32 = mo.F32[lo:hi]
	}
	return s
}

// Decode writes mo's values as fp32 into dst (len mo.Len()).
func (mo Moment) Decode(dst []float32) {
	switch {
	case mo.BF16 != nil:
		bf16.ToFloat32s(dst, mo.BF16)
	case mo.Codes != nil:
		dec := decodeM
		if mo.Second {
			dec = decodeV
		}
		for b, sc := range mo.Scales {
			lo, hi := b*QuantBlock, min((b+1)*QuantBlock, len(mo.Codes))
			for i := lo; i < hi; i++ {
				dst[i] = dec(mo.Codes[i]) * sc
			}
		}
	default:
		copy(dst, mo.F32)
	}
}

// Encode stores src (len mo.Len()) into mo in its precision, rounded as
// the update rounds it.
func (mo Moment) Encode(src []float32) {
	switch {
	case mo.BF16 != nil:
		bf16.FromFloat32s(mo.BF16, src)
	case mo.Codes != nil:
		for b := range mo.Scales {
			lo, hi := b*QuantBlock, min((b+1)*QuantBlock, len(mo.Codes))
			mo.Scales[b] = quantizeBlock(src[lo:hi], mo.Codes[lo:hi], mo.Second)
		}
	default:
		copy(mo.F32, src)
	}
}

// The int8 maps (the package doc's "Narrow moments"). m's code is a sign
// and a 7-bit magnitude with 4 exponent and 3 fraction bits (FP8 E4M3's
// layout, its top exponent 2^0); v's is an unsigned 8-bit magnitude with 5
// exponent and 3 fraction bits (top exponent 2^0). Field 0 is subnormal.
// A value is its code's magnitude times the block's scale; the scale is the
// block's largest |x|, so |x|/scale ≤ 1 lies in range.
const (
	mMinNormalBits = 0x38800000      // 2^-14: m's smallest normal magnitude
	mBiasCode      = (127 - 15) << 3 // fp32's exponent-and-3-fraction-bits code of m's field 0
	mDecodeBias    = (127 - 15) << 23
	mSubScale      = 1 << 17 // m's subnormal quantum is 2^-17 (2^-14 / 8)
	mSubQuantum    = 1.0 / mSubScale
	mMaxCode       = 0x7f
	vMinNormalBits = 0x30800000 // 2^-30: v's smallest normal magnitude
	vBiasCode      = (127 - 31) << 3
	vDecodeBias    = (127 - 31) << 23
	vSubScale      = 1 << 33 // 2^-33
	vSubQuantum    = 1.0 / vSubScale
	vMaxCode       = 0xff
	fracShift      = 20         // fp32's fraction bit 20 is the last one a code keeps
	fracRoundBias  = 1<<19 - 1  // with the kept last bit: round to nearest, ties to even
	absMask        = 0x7fffffff // clears the sign
)

// encodeMag returns the code of magnitude bits a (|x|/scale, at most 1.0
// or NaN) in a map with the given smallest normal, bias code, subnormal
// scale and largest code: rounded to nearest, ties to even.
func encodeMag(a uint32, minNormal, biasCode uint32, subScale float32, maxCode uint32) uint32 {
	if a < minNormal {
		// Subnormal (or zero): a multiple of the quantum; ×subScale is
		// exact, and the rounding to an integer is to nearest even (as
		// VCVTPS2DQ under the default MXCSR). A result of 8 is the
		// smallest normal's code, which is contiguous.
		return uint32(math.RoundToEven(float64(math.Float32frombits(a) * subScale)))
	}
	c := (a + fracRoundBias + (a>>fracShift)&1) >> fracShift // fp32 exponent and 3 fraction bits, rounded
	return min(c-biasCode, maxCode)                          // NaN: the largest code
}

func encodeM(r float32) uint8 {
	b := math.Float32bits(r)
	return uint8(b>>24&0x80 | encodeMag(b&absMask, mMinNormalBits, mBiasCode, mSubScale, mMaxCode))
}

func encodeV(r float32) uint8 {
	return uint8(encodeMag(math.Float32bits(r)&absMask, vMinNormalBits, vBiasCode, vSubScale, vMaxCode))
}

func decodeM(c uint8) float32 {
	mag := uint32(c & 0x7f)
	var f float32
	if mag < 8 {
		f = float32(mag) * mSubQuantum
	} else {
		f = math.Float32frombits(mag<<fracShift + mDecodeBias)
	}
	if c&0x80 != 0 {
		f = -f
	}
	return f
}

func decodeV(c uint8) float32 {
	mag := uint32(c)
	if mag < 8 {
		return float32(mag) * vSubQuantum
	}
	return math.Float32frombits(mag<<fracShift + vDecodeBias)
}

// MaxMScale bounds an int8 m block's scale in a sound state: |m| is at
// most the largest |g| the run saw, and (1−β2)·g² ≤ v stays finite in
// fp32 (under 2^128), so |g| < 2^64/√(1−β2) ≤ 2^80 for any β2 ≤ 1−2^-32.
// A larger m could only come from a v that had overflowed; v's own scale
// is bounded by fp32's range alone.
const MaxMScale = 0x1p80

// Check says what is wrong with an int8 moment's stored form, as a file
// may bring it behind a valid checksum (nil for fp32 and bf16 moments,
// and for an int8 one quantizeBlock could have written): every block's
// scale finite, not negative (nor -0), m's at most MaxMScale; and the
// block's codes those of its scale: a zero scale only zero codes, a
// nonzero one no code above 1.0 and the code of 1.0 among them (the
// scale is the block's largest |x|, whose ratio is exactly 1).
func (mo Moment) Check() error {
	if mo.Codes == nil {
		return nil
	}
	top, mask, what := uint8(0x78), uint8(0x7f), "m"
	if mo.Second {
		top, mask, what = 0xf8, 0xff, "v"
	}
	for b, scale := range mo.Scales {
		bits := math.Float32bits(scale)
		codes := mo.Codes[b*QuantBlock : min((b+1)*QuantBlock, len(mo.Codes))]
		var hi uint8
		for _, c := range codes {
			hi = max(hi, c&mask)
		}
		switch {
		case math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0):
			return fmt.Errorf("int8 %s block %d (elements %d-%d): scale %v is not finite", what, b, b*QuantBlock, b*QuantBlock+len(codes)-1, scale)
		case bits&0x80000000 != 0:
			return fmt.Errorf("int8 %s block %d (elements %d-%d): scale %v is negative (a scale is the block's largest |x|)", what, b, b*QuantBlock, b*QuantBlock+len(codes)-1, scale)
		case !mo.Second && scale > MaxMScale:
			return fmt.Errorf("int8 m block %d (elements %d-%d): scale %g is above 2^80, more than any gradient whose square fits v's fp32", b, b*QuantBlock, b*QuantBlock+len(codes)-1, scale)
		case scale == 0 && hi != 0:
			return fmt.Errorf("int8 %s block %d (elements %d-%d): scale 0 with nonzero codes (a zero block's codes are 0)", what, b, b*QuantBlock, b*QuantBlock+len(codes)-1)
		case scale != 0 && hi != top:
			return fmt.Errorf("int8 %s block %d (elements %d-%d): scale %g with a largest code of %#02x, not 1.0's %#02x (the scale is the block's largest |x|)", what, b, b*QuantBlock, b*QuantBlock+len(codes)-1, scale, hi, top)
		}
	}
	return nil
}

// quantizeBlock writes x's codes into codes and returns the block's scale:
// the largest |x| (by bit pattern, so a NaN wins); a zero block has scale
// 0 and codes 0 (the division is by 1).
func quantizeBlock(x []float32, codes []uint8, second bool) float32 {
	var mx uint32
	for _, f := range x {
		mx = max(mx, math.Float32bits(f)&absMask)
	}
	scale := math.Float32frombits(mx)
	div := scale
	if mx == 0 {
		div = 1
	}
	for i, f := range x {
		r := f / div
		if second {
			codes[i] = encodeV(r)
		} else {
			codes[i] = encodeM(r)
		}
	}
	return scale
}

// Shard is one shard's state for Step: the master params (fp32 in Param,
// or with bf16 params kept as Rem: then Param is nil and Out holds the
// params, read as the masters' high halves before the new ones are
// written), the reduced gradient (exactly one of Grad and Grad16), the
// moments in their stored precision (both the same) and Out, which
// receives the new params as 16-bit floats when not nil. Grad16 and Out
// hold bfloat16, or IEEE binary16 with F16 (fp16 mixed precision: widened
// exactly, the new params rounded to nearest even, internal/fp16). All
// have Len() elements.
type Shard struct {
	Param  []float32
	Rem    Remainder
	Grad   []float32
	Grad16 []uint16
	M, V   Moment
	Out    []uint16
	F16    bool
}

// Len is the number of elements of s.
func (s Shard) Len() int { return len(s.Param) + s.Rem.Len() }

func (s Shard) check() {
	n := s.Len()
	if len(s.Grad)+len(s.Grad16) != n || (s.Grad != nil) == (s.Grad16 != nil) && n > 0 ||
		s.M.Len() != n || s.V.Len() != n || s.M.Precision() != s.V.Precision() || s.M.Second || !s.V.Second ||
		(s.Out != nil && len(s.Out) != n) ||
		s.Rem.Lo != nil && (s.Param != nil || s.Out == nil || s.F16 || len(s.Rem.Up) != (n+7)/8) {
		panic(fmt.Sprintf("cpuadam: shard mismatch: param %d remainder %d/%d grad %d/%d m %d (%v) v %d (%v, second %v) out %d f16 %v",
			len(s.Param), s.Rem.Len(), len(s.Rem.Up), len(s.Grad), len(s.Grad16), s.M.Len(), s.M.Precision(), s.V.Len(), s.V.Precision(), s.V.Second, len(s.Out), s.F16))
	}
}

// Slice is elements [lo, hi) of s (int8 moments: lo on a QuantBlock
// boundary, hi too or the end; a Remainder: lo a multiple of 8).
func (s Shard) Slice(lo, hi int) Shard {
	t := Shard{M: s.M.Slice(lo, hi), V: s.V.Slice(lo, hi), Out: sub(s.Out, lo, hi), F16: s.F16}
	if s.Rem.Lo != nil {
		t.Rem = s.Rem.Slice(lo, hi)
	} else {
		t.Param = s.Param[lo:hi]
	}
	if s.Grad != nil {
		t.Grad = s.Grad[lo:hi]
	} else {
		t.Grad16 = s.Grad16[lo:hi]
	}
	return t
}

// Step is one Adam step of s on the calling goroutine with the fastest
// kernels of this CPU; every ISA gives the same bits.
func Step(p Params, s Shard) {
	s.check()
	k := makeConsts(p)
	best.adamShard(&k, p.Mode, s)
}

// adamShard runs i's kernel for s's moment precision.
func (i ISA) adamShard(k *kconsts, mode Mode, s Shard) {
	if s.Rem.Lo != nil {
		i.adamRem(k, mode, s)
		return
	}
	if s.F16 {
		i.adamF16(k, mode, s)
		return
	}
	switch s.M.Precision() {
	case MomentsF32:
		if s.Grad != nil {
			i.adamF32(k, mode, s.Param, s.Grad, s.M.F32, s.V.F32, s.Out)
		} else {
			i.adamBF16(k, mode, s.Param, s.Grad16, s.M.F32, s.V.F32, s.Out)
		}
	default:
		switch i {
		case ISAAVX512:
			adamNarrowAVX512(k, mode, s)
		case ISAAVX2:
			adamNarrowAVX2(k, mode, s)
		default:
			refNarrow(k, mode, s)
		}
	}
}

// refNarrow is the oracle of bf16 and int8 moments: each block of
// QuantBlock elements is decoded to fp32, updated by the fp32 formula
// (scalars.one) and encoded again: bf16 rounded to nearest even, int8 by
// quantizeBlock from the block's new largest |x|.
func refNarrow(k *kconsts, mode Mode, s Shard) {
	sc := k.scalars(mode)
	var m, v [QuantBlock]float32
	for lo := 0; lo < len(s.Param); lo += QuantBlock {
		hi := min(lo+QuantBlock, len(s.Param))
		b := s.Slice(lo, hi)
		mb, vb := m[:hi-lo], v[:hi-lo]
		b.M.Decode(mb)
		b.V.Decode(vb)
		for i, x := range b.Param {
			var g float32
			if b.Grad != nil {
				g = b.Grad[i]
			} else {
				g = bf16.ToFloat32(b.Grad16[i])
			}
			b.Param[i], mb[i], vb[i] = sc.one(x, g, mb[i], vb[i])
		}
		b.M.Encode(mb)
		b.V.Encode(vb)
		if b.Out != nil {
			bf16.FromFloat32s(b.Out, b.Param)
		}
	}
}

// f16Block is how many elements adamF16 widens at a time: a multiple of
// QuantBlock, so that its pieces of int8 moments are whole blocks.
const f16Block = 4 * QuantBlock

// adamF16 is the step of an fp16 shard. The AVX-512 and AVX2 kernels
// (with F16C) take the binary16 gradient and write binary16 params
// themselves, for every moment precision (adamF16Vec); the rest (the Go
// ISA, AVX2's last n%8, or its last partial block of int8 moments) goes
// block by block: the binary16
// gradient (when Grad16 holds it) is widened exactly into fp32, the fp32
// kernel runs, and the new params are rounded to binary16 into Out. Both
// ways the update's bits are those of the fp32 gradient's (the widening is
// exact) and the rounding is IEEE's nearest even.
func (i ISA) adamF16(k *kconsts, mode Mode, s Shard) {
	t := i.adamF16Vec(k, mode, s) // the vector kernels convert in place (F16C)
	var g [f16Block]float32
	for lo := t; lo < len(s.Param); lo += f16Block {
		hi := min(lo+f16Block, len(s.Param))
		b := s.Slice(lo, hi)
		b.F16, b.Out = false, nil
		if b.Grad16 != nil {
			fp16.ToFloat32s(g[:hi-lo], b.Grad16)
			b.Grad, b.Grad16 = g[:hi-lo], nil
		}
		i.adamShard(k, mode, b)
		if s.Out != nil {
			fp16.FromFloat32s(s.Out[lo:hi], b.Param)
		}
	}
}
