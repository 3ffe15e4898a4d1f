//go:build !amd64 || noasm || purego

package cpu

// Without the AVX-512 kernel every GEMM goes through gonum.
const hasPackedKernel = false

func sgemmKernel6x32(kc int, a, b, c *float32) { panic("gpu/cpu: no packed GEMM kernel in this build") }
