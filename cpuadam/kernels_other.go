//go:build !amd64 || noasm || purego

package cpuadam

// Only the pure Go kernels exist in this build.
func archSupport() (avx2, avx512 bool) { return false, false }

// The vector kernels are never called here: ISA.Supported is false.

func adamF32AVX2(*kconsts, Mode, []float32, []float32, []float32, []float32, []uint16) { unreachable() }
func adamBF16AVX2(*kconsts, Mode, []float32, []uint16, []float32, []float32, []uint16) { unreachable() }
func sumSqF32AVX2([]float32, *[16]float64)                                             { unreachable() }
func sumSqBF16AVX2([]uint16, *[16]float64)                                             { unreachable() }
func maxAbsF32AVX2([]float32) uint32                                                   { unreachable(); return 0 }
func maxAbsBF16AVX2([]uint16) uint32                                                   { unreachable(); return 0 }
func r4w3F32AVX2(_, _, _, _ []float32)                                                 { unreachable() }
func adamF32AVX512(*kconsts, Mode, []float32, []float32, []float32, []float32, []uint16) {
	unreachable()
}
func adamBF16AVX512(*kconsts, Mode, []float32, []uint16, []float32, []float32, []uint16) {
	unreachable()
}
func adamNarrowAVX2(*kconsts, Mode, Shard)                  { unreachable() }
func joinVec(bool, []float32, []uint16, []uint16, []uint8)  { unreachable() }
func splitVec(bool, []float32, []uint16, []uint16, []uint8) { unreachable() }
func adamNarrowAVX512(*kconsts, Mode, Shard)                { unreachable() }
func sumSqF32AVX512([]float32, *[16]float64)                { unreachable() }
func sumSqBF16AVX512([]uint16, *[16]float64)                { unreachable() }
func maxAbsF32AVX512([]float32) uint32                      { unreachable(); return 0 }
func maxAbsBF16AVX512([]uint16) uint32                      { unreachable(); return 0 }
func r4w3F32AVX512(_, _, _, _ []float32)                    { unreachable() }

// adamF16Vec: no vector kernels here; adamF16 widens in Go.
func (ISA) adamF16Vec(*kconsts, Mode, Shard) int { return 0 }

func unreachable() { panic("cpuadam: vector kernel called in a build without assembly") }

// outNTMinLen has no effect without assembly; the tests set it on every
// build.
var outNTMinLen = 1 << 18
