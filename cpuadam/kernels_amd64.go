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

func archKernels() (avx2, avx512 *kernelSet) {
	// x/sys/cpu reports a feature only when the OS saves its registers,
	// and honours GODEBUG=cpu.avx512f=off and friends.
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		avx2 = &kernelSet{
			adamF32: func(k *kconsts, mode Mode, param, grad, m, v []float32, out []uint16) {
				adamVec(adamAVX2, 8, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), 0, m, v, out)
				if t := len(param) &^ 7; t < len(param) {
					refF32(k, mode, param[t:], grad[t:], m[t:], v[t:], tail(out, t))
				}
			},
			adamBF16: func(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
				adamVec(adamAVX2, 8, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), fGradBF16, m, v, out)
				if t := len(param) &^ 7; t < len(param) {
					refBF16(k, mode, param[t:], grad[t:], m[t:], v[t:], tail(out, t))
				}
			},
			sumSqF32: func(x []float32, acc *[16]float64) {
				t := len(x) &^ 15
				if t > 0 {
					sumSqAVX2(unsafe.Pointer(&x[0]), t, false, acc)
				}
				sumSqGoF32(x[t:], acc) // len(x[t:]) < 16: lanes 0.. continue
			},
			sumSqBF16: func(x []uint16, acc *[16]float64) {
				t := len(x) &^ 15
				if t > 0 {
					sumSqAVX2(unsafe.Pointer(&x[0]), t, true, acc)
				}
				sumSqGoBF16(x[t:], acc)
			},
			maxAbsF32: func(x []float32) uint32 {
				t := len(x) &^ 7
				mx := maxAbsGoF32(x[t:])
				if t > 0 {
					mx = max(mx, maxAbsAVX2(unsafe.Pointer(&x[0]), t, false))
				}
				return mx
			},
			maxAbsBF16: func(x []uint16) uint32 {
				t := len(x) &^ 7
				mx := maxAbsGoBF16(x[t:])
				if t > 0 {
					mx = max(mx, maxAbsAVX2(unsafe.Pointer(&x[0]), t, true))
				}
				return mx
			},
			r4w3: func(a, b, c, d []float32) {
				t := len(a) &^ 7
				if t > 0 {
					r4w3AVX2(&a[0], &b[0], &c[0], &d[0], t)
				}
				r4w3Go(a[t:], b[t:], c[t:], d[t:])
			},
		}
	}
	if cpu.X86.HasAVX512F {
		avx512 = &kernelSet{
			adamF32: func(k *kconsts, mode Mode, param, grad, m, v []float32, out []uint16) {
				adamVec(adamAVX512, 1, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), 0, m, v, out)
			},
			adamBF16: func(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
				adamVec(adamAVX512, 1, k, mode, param, unsafe.Pointer(unsafe.SliceData(grad)), fGradBF16, m, v, out)
			},
			sumSqF32: func(x []float32, acc *[16]float64) {
				if len(x) > 0 {
					sumSqAVX512(unsafe.Pointer(&x[0]), len(x), false, acc)
				}
			},
			sumSqBF16: func(x []uint16, acc *[16]float64) {
				if len(x) > 0 {
					sumSqAVX512(unsafe.Pointer(&x[0]), len(x), true, acc)
				}
			},
			maxAbsF32: func(x []float32) uint32 {
				if len(x) == 0 {
					return 0
				}
				return maxAbsAVX512(unsafe.Pointer(&x[0]), len(x), false)
			},
			maxAbsBF16: func(x []uint16) uint32 {
				if len(x) == 0 {
					return 0
				}
				return maxAbsAVX512(unsafe.Pointer(&x[0]), len(x), true)
			},
			r4w3: func(a, b, c, d []float32) {
				if len(a) > 0 {
					r4w3AVX512(&a[0], &b[0], &c[0], &d[0], len(a))
				}
			},
		}
	}
	return avx2, avx512
}

type adamAsm func(k *kconsts, param *float32, grad unsafe.Pointer, m, v *float32, out *uint16, n int, flags uintptr)

// adamVec runs fn over the first len(param) rounded down to a multiple of
// quantum elements.
func adamVec(fn adamAsm, quantum int, k *kconsts, mode Mode, param []float32, grad unsafe.Pointer, flags uintptr, m, v []float32, out []uint16) {
	n := len(param) / quantum * quantum
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
	fn(k, &param[0], grad, &m[0], &v[0], o, n, flags)
}

func tail(out []uint16, t int) []uint16 {
	if out == nil {
		return nil
	}
	return out[t:]
}
