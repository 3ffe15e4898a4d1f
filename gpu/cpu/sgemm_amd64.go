//go:build amd64 && !noasm && !purego

package cpu

import "golang.org/x/sys/cpu"

// sgemmKernel6x32 writes c (6×32) = a (packed kc×6)ᵀ · b (packed kc×32)
// with AVX-512 FMAs, k in order; see sgemm_amd64.s.
//
//go:noescape
func sgemmKernel6x32(kc int, a, b, c *float32)

// hasPackedKernel says whether this CPU runs sgemmKernel6x32.
var hasPackedKernel = cpu.X86.HasAVX512F
