package cpuadam

import (
	"fmt"
	"math"
	"strings"

	"github.com/strata-ai/strata/internal/bf16"
)

//go:generate go tool stringer -type=ISA -linecomment -output=isa_string.go

// ISA names a family of kernels.
type ISA uint8

const (
	// ISAAuto: the best this CPU supports (Best)
	ISAAuto ISA = iota // auto
	// ISAGo: the pure Go reference, everywhere
	ISAGo // go
	// ISAAVX2: AVX2 + FMA, ymm (amd64)
	ISAAVX2 // avx2
	// ISAAVX512: AVX-512F, zmm with masked tails (amd64)
	ISAAVX512 // avx512
	isaCount
)

// ParseISA reads the names that String prints.
func ParseISA(s string) (ISA, error) {
	for i := ISAAuto; i < isaCount; i++ {
		if strings.EqualFold(s, i.String()) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("cpuadam: unknown isa %q (want auto, avx512, avx2 or go)", s)
}

// Supported reports whether this CPU and build can run i's kernels.
// ISAAuto and ISAGo always can.
func (i ISA) Supported() bool {
	return i < isaCount && supported[i]
}

// Best is the ISA that ISAAuto and the plain functions use: AVX-512 where
// the CPU (and GODEBUG, e.g. cpu.avx512f=off) allows it, then AVX2+FMA,
// then Go. Builds with the noasm or purego tag, and other architectures,
// have only Go.
func Best() ISA { return best }

// The kernels of each ISA over whole slices (lengths already checked),
// dispatched with a switch so that nothing escapes to the heap. Every ISA
// computes the same bits as ISAGo. ISAAuto is resolved before these run.

func (i ISA) adamF32(k *kconsts, mode Mode, param, grad, m, v []float32, out []uint16) {
	switch i {
	case ISAAVX512:
		adamF32AVX512(k, mode, param, grad, m, v, out)
	case ISAAVX2:
		adamF32AVX2(k, mode, param, grad, m, v, out)
	default:
		refF32(k, mode, param, grad, m, v, out)
	}
}

func (i ISA) adamBF16(k *kconsts, mode Mode, param []float32, grad []uint16, m, v []float32, out []uint16) {
	switch i {
	case ISAAVX512:
		adamBF16AVX512(k, mode, param, grad, m, v, out)
	case ISAAVX2:
		adamBF16AVX2(k, mode, param, grad, m, v, out)
	default:
		refBF16(k, mode, param, grad, m, v, out)
	}
}

// sumSqF32 adds x[i]² to acc[i%16].
func (i ISA) sumSqF32(x []float32, acc *[16]float64) {
	switch i {
	case ISAAVX512:
		sumSqF32AVX512(x, acc)
	case ISAAVX2:
		sumSqF32AVX2(x, acc)
	default:
		sumSqGoF32(x, acc)
	}
}

func (i ISA) sumSqBF16(x []uint16, acc *[16]float64) {
	switch i {
	case ISAAVX512:
		sumSqBF16AVX512(x, acc)
	case ISAAVX2:
		sumSqBF16AVX2(x, acc)
	default:
		sumSqGoBF16(x, acc)
	}
}

// maxAbsF32 is the largest bit pattern of |x[i]|.
func (i ISA) maxAbsF32(x []float32) uint32 {
	switch i {
	case ISAAVX512:
		return maxAbsF32AVX512(x)
	case ISAAVX2:
		return maxAbsF32AVX2(x)
	}
	return maxAbsGoF32(x)
}

func (i ISA) maxAbsBF16(x []uint16) uint32 {
	switch i {
	case ISAAVX512:
		return maxAbsBF16AVX512(x)
	case ISAAVX2:
		return maxAbsBF16AVX2(x)
	}
	return maxAbsGoBF16(x)
}

func (i ISA) r4w3(a, b, c, d []float32) {
	switch i {
	case ISAAVX512:
		r4w3F32AVX512(a, b, c, d)
	case ISAAVX2:
		r4w3F32AVX2(a, b, c, d)
	default:
		r4w3Go(a, b, c, d)
	}
}

// supported says which ISAs this CPU and build run; best is the dispatch
// variable of the plain functions. Both are set once, in init.
var (
	supported [isaCount]bool
	best      = ISAGo
)

func init() {
	supported[ISAAuto], supported[ISAGo] = true, true
	supported[ISAAVX2], supported[ISAAVX512] = archSupport()
	for _, i := range []ISA{ISAAVX512, ISAAVX2} {
		if supported[i] {
			best = i
			break
		}
	}
}

func sumSqGoF32(x []float32, acc *[16]float64) {
	for i, f := range x {
		d := float64(f)
		acc[i%16] += float64(d * d) // the square is exact
	}
}

func sumSqGoBF16(x []uint16, acc *[16]float64) {
	for i, h := range x {
		d := float64(bf16.ToFloat32(h))
		acc[i%16] += float64(d * d)
	}
}

func maxAbsGoF32(x []float32) uint32 {
	var mx uint32
	for _, f := range x {
		mx = max(mx, math.Float32bits(f)&0x7fffffff)
	}
	return mx
}

func maxAbsGoBF16(x []uint16) uint32 {
	var mx uint32
	for _, h := range x {
		mx = max(mx, uint32(h&0x7fff)<<16)
	}
	return mx
}

// r4w3Go is the r4w3 loop of membw.c (bench/tools/membw.c, the memory-bandwidth roofline) (see r4w3AVX512).
func r4w3Go(a, b, c, d []float32) {
	b, c, d = b[:len(a)], c[:len(a)], d[:len(a)]
	for i := range a {
		g := b[i]
		m := fma32(0.9, c[i], float32(0.1*g))
		v := fma32(0.999, d[i], float32(float32(0.001*g)*g))
		a[i], c[i], d[i] = fma32(-1e-9, m, a[i]), m, v
	}
}

// sumBlockLen is the block of the SumSquares order: the sum is the
// sequential float64 sum, block after block, of each block's tree-reduced
// 16 lanes (see the package doc).
const sumBlockLen = 1 << 14

// reduce16 adds the 16 lanes in the fixed tree order of the package doc.
func reduce16(acc *[16]float64) float64 {
	for w := 8; w >= 1; w /= 2 {
		for j := 0; j < w; j++ {
			acc[j] += acc[j+w]
		}
	}
	return acc[0]
}

// blockSums writes the sum of each sumBlockLen block of x (or xh) into
// sums, one per block.
func blockSums(ks ISA, x []float32, xh []uint16, sums []float64) {
	n := len(x) + len(xh)
	for b := range sums {
		lo, hi := b*sumBlockLen, min((b+1)*sumBlockLen, n)
		var acc [16]float64
		if x != nil {
			ks.sumSqF32(x[lo:hi], &acc)
		} else {
			ks.sumSqBF16(xh[lo:hi], &acc)
		}
		sums[b] = reduce16(&acc)
	}
}

func sumSquares(ks ISA, x []float32, xh []uint16) float64 {
	n := len(x) + len(xh)
	var total float64
	var one [1]float64
	for lo := 0; lo < n; lo += sumBlockLen {
		hi := min(lo+sumBlockLen, n)
		if x != nil {
			blockSums(ks, x[lo:hi], nil, one[:])
		} else {
			blockSums(ks, nil, xh[lo:hi], one[:])
		}
		total += one[0]
	}
	return total
}
