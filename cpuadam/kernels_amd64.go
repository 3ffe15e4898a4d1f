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
)

// Implemented in adam_amd64.s; each is documented there by the Go loop it
// computes.

//go:noescape
func adamAVX512(k *kconsts, param *float32, grad unsafe.Pointer, m, v *float32, out *uint16, n int, flags uintptr)

//go:noescape
func adamAVX2(k *kconsts, param *float32, grad unsafe.Pointer, m, v *float32, out *uint16, n int, flags uintptr)

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
	adamVec(false, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), 0, m, v, out)
	if t := len(param) &^ 7; t < len(param) {
		refF32(k, mode, param[t:], grad[t:], m[t:], v[t:], tail(out, t))
	}
}

func adamBF16AVX2(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
	adamVec(false, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), fGradBF16, m, v, out)
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
	adamVec(true, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), 0, m, v, out)
}

func adamBF16AVX512(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
	adamVec(true, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), fGradBF16, m, v, out)
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
// over its first len(param)&^7 elements.
func adamVec(avx512 bool, k *kconsts, mode Mode, param []float32, grad unsafe.Pointer, flags uintptr, m, v []float32, out []uint16) {
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
	if avx512 {
		if o != nil && n >= outNTMinLen {
			// Stream the write-only bf16 output past the cache: normal
			// stores first up to a 32-byte boundary of out, then
			// non-temporal stores of whole vectors.
			h := min(n, int((32-uintptr(unsafe.Pointer(o))%32)%32/2))
			if h > 0 {
				adamAVX512(k, &param[0], grad, &m[0], &v[0], o, h, flags)
			}
			if h == n {
				return
			}
			gb := uintptr(4)
			if flags&fGradBF16 != 0 {
				gb = 2
			}
			adamAVX512(k, &param[h], unsafe.Add(grad, uintptr(h)*gb), &m[h], &v[h], &out[h], n-h, flags|fOutNT)
			return
		}
		adamAVX512(k, &param[0], grad, &m[0], &v[0], o, n, flags)
	} else {
		adamAVX2(k, &param[0], grad, &m[0], &v[0], o, n, flags)
	}
}

func tail(out []uint16, t int) []uint16 {
	if out == nil {
		return nil
	}
	return out[t:]
}
