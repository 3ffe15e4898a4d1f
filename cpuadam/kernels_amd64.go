//go:build amd64 && !noasm && !purego

package cpuadam

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// Kernel flags (adam_amd64.s).
const (
	fGradBF16 = 1
	fOut      = 2
	fL2       = 4
	fOutNT    = 8 // AVX-512: full vectors of out with non-temporal stores; out 32-byte aligned
	fMomBF16  = 16
	fGradF16  = 32 // grad is IEEE binary16 (F16C's VCVTPH2PS)
	fOutF16   = 64 // out is IEEE binary16 (VCVTPS2PH, round to nearest even)
)

// Implemented in adam_amd64.s; each is documented there by the Go loop it
// computes.

//go:noescape
func adamAVX512(k *kconsts, param *float32, grad, m, v unsafe.Pointer, out *uint16, n int, flags uintptr)

//go:noescape
func adamAVX2(k *kconsts, param *float32, grad, m, v unsafe.Pointer, out *uint16, n int, flags uintptr)

// Implemented in moments_amd64.s.

//go:noescape
func adamQ8AVX512(k *kconsts, param *float32, grad unsafe.Pointer, mc, vc *uint8, ms, vs *float32, out *uint16, n int, flags uintptr, scratch *q8Scratch)

//go:noescape
func adamQ8AVX2(k *kconsts, param *float32, grad unsafe.Pointer, mc, vc *uint8, ms, vs *float32, out *uint16, n int, flags uintptr, scratch *q8Scratch)

// q8Scratch holds a block's new m and v between the update and their
// encoding, then (AVX2) the block's two old scales broadcast to 8 lanes.
type q8Scratch [2*QuantBlock + 16]float32

// Implemented in master_amd64.s.

//go:noescape
func joinAVX2(dst *float32, param, lo *uint16, up *uint8, n int)

//go:noescape
func splitAVX2(src *float32, param, lo *uint16, up *uint8, n int)

//go:noescape
func joinAVX512(dst *float32, param, lo *uint16, up *uint8, n int)

//go:noescape
func splitAVX512(src *float32, param, lo *uint16, up *uint8, n int)

//go:noescape
func sumSqAVX512(x unsafe.Pointer, n int, bf16 bool, acc *[16]float64)

//go:noescape
func sumSqAVX2(x unsafe.Pointer, n int, bf16 bool, acc *[16]float64)

//go:noescape
func maxAbsAVX512(x unsafe.Pointer, n int, bf16 bool) uint32

//go:noescape
func maxAbsAVX2(x unsafe.Pointer, n int, bf16 bool) uint32

//go:noescape
func r4w3AVX512(a, b, c, d *float32, n int)

//go:noescape
func r4w3AVX2(a, b, c, d *float32, n int)

// archSupport reports which kernels this CPU runs. x/sys/cpu reports a
// feature only when the OS saves its registers, and honours
// GODEBUG=cpu.avx512f=off and friends.
func archSupport() (avx2, avx512 bool) {
	return cpu.X86.HasAVX2 && cpu.X86.HasFMA, cpu.X86.HasAVX512F
}

func adamF32AVX2(k *kconsts, mode Mode, param, grad, m, v []float32, out []uint16) {
	adamVec(false, k, mode, param, f32p(grad), f32p(m), f32p(v), 0, out)
	if t := len(param) &^ 7; t < len(param) {
		refF32(k, mode, param[t:], grad[t:], m[t:], v[t:], tail(out, t))
	}
}

func adamBF16AVX2(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
	adamVec(false, k, mode, param, u16p(grad), f32p(m), f32p(v), fGradBF16, out)
	if t := len(param) &^ 7; t < len(param) {
		refBF16(k, mode, param[t:], grad[t:], m[t:], v[t:], tail(out, t))
	}
}

func sumSqF32AVX2(x []float32, acc *[16]float64) {
	t := len(x) &^ 15
	if t > 0 {
		sumSqAVX2(unsafe.Pointer(&x[0]), t, false, acc)
	}
	sumSqGoF32(x[t:], acc) // len(x[t:]) < 16: lanes 0.. continue
}

func sumSqBF16AVX2(x []uint16, acc *[16]float64) {
	t := len(x) &^ 15
	if t > 0 {
		sumSqAVX2(unsafe.Pointer(&x[0]), t, true, acc)
	}
	sumSqGoBF16(x[t:], acc)
}

func maxAbsF32AVX2(x []float32) uint32 {
	t := len(x) &^ 7
	mx := maxAbsGoF32(x[t:])
	if t > 0 {
		mx = max(mx, maxAbsAVX2(unsafe.Pointer(&x[0]), t, false))
	}
	return mx
}

func maxAbsBF16AVX2(x []uint16) uint32 {
	t := len(x) &^ 7
	mx := maxAbsGoBF16(x[t:])
	if t > 0 {
		mx = max(mx, maxAbsAVX2(unsafe.Pointer(&x[0]), t, true))
	}
	return mx
}

func r4w3F32AVX2(a, b, c, d []float32) {
	t := len(a) &^ 7
	if t > 0 {
		r4w3AVX2(&a[0], &b[0], &c[0], &d[0], t)
	}
	r4w3Go(a[t:], b[t:], c[t:], d[t:])
}

func adamF32AVX512(k *kconsts, mode Mode, param, grad, m, v []float32, out []uint16) {
	adamVec(true, k, mode, param, f32p(grad), f32p(m), f32p(v), 0, out)
}

func adamBF16AVX512(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
	adamVec(true, k, mode, param, u16p(grad), f32p(m), f32p(v), fGradBF16, out)
}

func sumSqF32AVX512(x []float32, acc *[16]float64) {
	if len(x) > 0 {
		sumSqAVX512(unsafe.Pointer(&x[0]), len(x), false, acc)
	}
}

func sumSqBF16AVX512(x []uint16, acc *[16]float64) {
	if len(x) > 0 {
		sumSqAVX512(unsafe.Pointer(&x[0]), len(x), true, acc)
	}
}

func maxAbsF32AVX512(x []float32) uint32 {
	if len(x) == 0 {
		return 0
	}
	return maxAbsAVX512(unsafe.Pointer(&x[0]), len(x), false)
}

func maxAbsBF16AVX512(x []uint16) uint32 {
	if len(x) == 0 {
		return 0
	}
	return maxAbsAVX512(unsafe.Pointer(&x[0]), len(x), true)
}

func r4w3F32AVX512(a, b, c, d []float32) {
	if len(a) > 0 {
		r4w3AVX512(&a[0], &b[0], &c[0], &d[0], len(a))
	}
}

// outNTMinLen is the length from which the AVX-512 kernel writes the
// bf16 output with non-temporal stores (measured in bench/README-adam.md).
//
// Measured on this machine's 100M-parameter step with 1 thread, alternated
// in one process: 19.4 vs 18.7 and 17.0 vs 13.2 GB/s (noisy host) for
// non-temporal vs plain stores of out. Non-temporal stores of the in-place
// param, m and v streams were slower (8.8 vs 12.1 GB/s): their lines are
// already in cache from the loads.
var outNTMinLen = 1 << 18

// adamVec runs the AVX-512 kernel over all of param, or the AVX2 kernel
// over its first len(param)&^7 elements. grad points to fp32 or, with
// fGradBF16, bf16 values; m and v to fp32 or, with fMomBF16, bf16.
func adamVec(avx512 bool, k *kconsts, mode Mode, param []float32, grad, m, v unsafe.Pointer, flags uintptr, out []uint16) {
	n := len(param)
	if !avx512 {
		n &^= 7
	}
	if n == 0 {
		return
	}
	var o *uint16
	if out != nil {
		o, flags = &out[0], flags|fOut
	}
	if mode == AdamL2 {
		flags |= fL2
	}
	if !avx512 {
		adamAVX2(k, &param[0], grad, m, v, o, n, flags)
		return
	}
	if o == nil || n < outNTMinLen {
		adamAVX512(k, &param[0], grad, m, v, o, n, flags)
		return
	}
	// Stream the write-only bf16 output past the cache: normal stores
	// first up to a 32-byte boundary of out, then non-temporal stores of
	// whole vectors.
	h := min(n, int((32-uintptr(unsafe.Pointer(o))%32)%32/2))
	if h > 0 {
		adamAVX512(k, &param[0], grad, m, v, o, h, flags)
	}
	if h == n {
		return
	}
	gb, mb := uintptr(4), uintptr(4)
	if flags&(fGradBF16|fGradF16) != 0 {
		gb = 2
	}
	if flags&fMomBF16 != 0 {
		mb = 2
	}
	hh := uintptr(h)
	adamAVX512(k, &param[h], unsafe.Add(grad, hh*gb), unsafe.Add(m, hh*mb), unsafe.Add(v, hh*mb), &out[h], n-h, flags|fOutNT)
}

func f32p(s []float32) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(s)) }
func u16p(s []uint16) unsafe.Pointer  { return unsafe.Pointer(unsafe.SliceData(s)) }

// adamNarrowAVX512 runs a shard with bf16 or int8 moments.
func adamNarrowAVX512(k *kconsts, mode Mode, s Shard) {
	adamNarrowVec(true, k, mode, s)
}

// adamNarrowAVX2 runs the AVX2 kernels over the first len(s.Param)&^7
// elements (bf16 moments) or whole blocks (int8), and refNarrow over the
// rest, which gives the same bits.
func adamNarrowAVX2(k *kconsts, mode Mode, s Shard) {
	if t := adamNarrowVec(false, k, mode, s); t < len(s.Param) {
		refNarrow(k, mode, s.Slice(t, len(s.Param)))
	}
}

// adamNarrowVec runs the kernels of one ISA over s and returns how many
// elements (from the start) they did. With s.F16 (int8 moments only:
// adamF16Vec runs bf16 moments through adamVec) the gradient in Grad16 and
// the new params in Out are binary16, converted in the kernel (F16C).
func adamNarrowVec(avx512 bool, k *kconsts, mode Mode, s Shard) int {
	n := len(s.Param)
	grad, flags := f32p(s.Grad), uintptr(0)
	switch {
	case s.Grad == nil && s.F16:
		grad, flags = u16p(s.Grad16), fGradF16
	case s.Grad == nil:
		grad, flags = u16p(s.Grad16), fGradBF16
	}
	if s.M.BF16 != nil {
		adamVec(avx512, k, mode, s.Param, grad, u16p(s.M.BF16), u16p(s.V.BF16), flags|fMomBF16, s.Out)
		if avx512 {
			return n
		}
		return n &^ 7
	}
	if !avx512 {
		n &^= QuantBlock - 1
	}
	if n == 0 {
		return 0
	}
	var o *uint16
	if s.Out != nil {
		o, flags = &s.Out[0], flags|fOut
		if s.F16 {
			flags |= fOutF16
		}
		if avx512 && n >= outNTMinLen && uintptr(unsafe.Pointer(o))%32 == 0 {
			flags |= fOutNT // every full vector of out is 32-byte aligned
		}
	}
	if mode == AdamL2 {
		flags |= fL2
	}
	var scratch q8Scratch
	if avx512 {
		adamQ8AVX512(k, &s.Param[0], grad, &s.M.Codes[0], &s.V.Codes[0], &s.M.Scales[0], &s.V.Scales[0], o, n, flags, &scratch)
	} else {
		adamQ8AVX2(k, &s.Param[0], grad, &s.M.Codes[0], &s.V.Codes[0], &s.M.Scales[0], &s.V.Scales[0], o, n, flags, &scratch)
	}
	return n
}

// adamF16Vec runs the kernels of ISA i on an fp16 shard (the grad and the
// new params converted in the kernel, F16C) and returns how many elements
// (from the start) they did: all of them on AVX-512, whole vectors of 8
// (int8 moments: whole blocks) on AVX2, none without F16C (adamF16 widens
// those in Go).
func (i ISA) adamF16Vec(k *kconsts, mode Mode, s Shard) int {
	if i != ISAAVX512 && i != ISAAVX2 || !cpu.X86.HasF16C {
		return 0
	}
	if s.M.Precision() == MomentsInt8 {
		return adamNarrowVec(i == ISAAVX512, k, mode, s)
	}
	grad, flags := f32p(s.Grad), uintptr(fOutF16)
	if s.Grad == nil {
		grad, flags = u16p(s.Grad16), flags|fGradF16
	}
	m, v := f32p(s.M.F32), f32p(s.V.F32)
	if s.M.BF16 != nil {
		m, v, flags = u16p(s.M.BF16), u16p(s.V.BF16), flags|fMomBF16
	}
	avx512 := i == ISAAVX512
	adamVec(avx512, k, mode, s.Param, grad, m, v, flags, s.Out)
	if avx512 {
		return len(s.Param)
	}
	return len(s.Param) &^ 7
}

func tail(out []uint16, t int) []uint16 {
	if out == nil {
		return nil
	}
	return out[t:]
}

// remVecLen is how many of n masters the join and split kernels take:
// whole vectors of 8 (AVX2) or 16 (wide: AVX-512); Go does the rest.
func remVecLen(n int, wide bool) int {
	if wide {
		return n &^ 15
	}
	return n &^ 7
}

// joinVec joins the first remVecLen masters with AVX2 or AVX-512 and the
// rest in Go.
func joinVec(wide bool, dst []float32, param, lo []uint16, up []uint8) {
	t := remVecLen(len(dst), wide)
	switch {
	case t > 0 && wide:
		joinAVX512(&dst[0], &param[0], &lo[0], &up[0], t)
	case t > 0:
		joinAVX2(&dst[0], &param[0], &lo[0], &up[0], t)
	}
	joinRef(dst[t:], param[t:], lo[t:], up[t/8:])
}

// splitVec is joinVec's split.
func splitVec(wide bool, src []float32, param, lo []uint16, up []uint8) {
	t := remVecLen(len(src), wide)
	switch {
	case t > 0 && wide:
		splitAVX512(&src[0], &param[0], &lo[0], &up[0], t)
	case t > 0:
		splitAVX2(&src[0], &param[0], &lo[0], &up[0], t)
	}
	splitRef(src[t:], param[t:], lo[t:], up[t/8:])
}
