package cpuadam

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/strata-ai/strata/dtype"
)

// Remainder is an fp32 master kept as its bf16 param plus what the param
// lacks (strata.optimizer_state.master "bf16+remainder"; the package doc's
// "The master as a remainder"): Lo holds each master's low 16 bits, and
// bit i%8 of Up[i/8] says that the param was rounded up from the master,
// so that the master's high 16 bits are the param's bits minus one. The
// master is then exactly (param − up) << 16 | lo, for 2.125 bytes beside
// the param instead of 4.
//
// Sixteen bits alone cannot do it: with the param rounded to nearest
// even, as the fp32 master's run rounds it, 65,537 masters round to each
// even bf16 value (both ties), and the up bit tells the two ties apart.
type Remainder struct {
	Lo []uint16
	Up []uint8
}

// RemainderView lays the remainder of n masters over b (dtype.Rem16's
// Bytes(n) long, 2-byte aligned), as the tier store leases it.
func RemainderView(n int, b []byte) Remainder {
	if int64(len(b)) != dtype.Rem16.Bytes(n) {
		panic(fmt.Sprintf("cpuadam: remainder of %d masters over %d bytes, want %d", n, len(b), dtype.Rem16.Bytes(n)))
	}
	if n == 0 {
		return Remainder{Lo: []uint16{}, Up: []uint8{}}
	}
	return Remainder{Lo: unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), n), Up: b[2*n:]}
}

// Len is the number of masters of r.
func (r Remainder) Len() int { return len(r.Lo) }

// Slice is masters [lo, hi) of r; lo is a multiple of 8.
func (r Remainder) Slice(lo, hi int) Remainder {
	if lo%8 != 0 {
		panic(fmt.Sprintf("cpuadam: remainder sliced at %d, not on a byte of its up bits", lo))
	}
	return Remainder{Lo: r.Lo[lo:hi], Up: r.Up[lo/8 : (hi+7)/8]}
}

// Join writes the fp32 masters of r and their bf16 params into dst (all
// of length r.Len()): exactly the masters Split was given.
func (r Remainder) Join(dst []float32, param []uint16) {
	if len(dst) != len(r.Lo) || len(param) != len(r.Lo) {
		panic(fmt.Sprintf("cpuadam: join of %d masters into %d from %d params", len(r.Lo), len(dst), len(param)))
	}
	best.joinMasters(dst, param, r.Lo, r.Up)
}

// Split stores masters src, whose bf16 params (rounded to nearest even:
// bf16.FromFloat32s) are param, into r (all of length r.Len()). A NaN
// master whose quiet bit is clear (a signalling NaN; arithmetic never
// makes one) is joined as a NaN, not the same one.
func (r Remainder) Split(src []float32, param []uint16) {
	if len(src) != len(r.Lo) || len(param) != len(r.Lo) {
		panic(fmt.Sprintf("cpuadam: split of %d masters into %d with %d params", len(src), len(r.Lo), len(param)))
	}
	best.splitMasters(src, param, r.Lo, r.Up)
}

// joinRef is Join in Go: the oracle of the vector kernels.
func joinRef(dst []float32, param, lo []uint16, up []uint8) {
	for i := range dst {
		u := uint32(up[i>>3]>>(i&7)) & 1
		dst[i] = math.Float32frombits((uint32(param[i])-u)<<16 | uint32(lo[i]))
	}
}

// splitRef is Split in Go: the oracle of the vector kernels.
func splitRef(src []float32, param, lo []uint16, up []uint8) {
	for j := 0; j < len(src); j += 8 {
		var b uint8
		for i := j; i < min(j+8, len(src)); i++ {
			x := math.Float32bits(src[i])
			lo[i] = uint16(x)
			var u uint8
			if uint16(x>>16) != param[i] {
				u = 1
			}
			b |= u << (i - j)
		}
		up[j>>3] = b
	}
}

// remBlock is how many masters adamRem joins into fp32 at a time: a
// multiple of QuantBlock (int8 moments are sliced on whole blocks), 16 KiB
// of stack that stays in the first- or second-level cache between the
// join, the kernel and the split. 4,096 measured 5-14 % faster than 1,024
// streaming (fewer kernel calls and slices of the shard a step).
const remBlock = 16 * QuantBlock

// adamRem is the step of a shard whose master is a Remainder: each block
// is joined into fp32 from the remainder and the params in Out, the
// fp32-master kernel runs on it (writing the new params into Out), and the
// new masters are split again against them. The kernel sees the masters
// the fp32 run has, so the bits are the fp32 run's.
func (i ISA) adamRem(k *kconsts, mode Mode, s Shard) {
	var x [remBlock]float32
	for lo := 0; lo < s.Len(); lo += remBlock {
		hi := min(lo+remBlock, s.Len())
		b := s.Slice(lo, hi)
		r, m := b.Rem, x[:hi-lo]
		i.joinMasters(m, b.Out, r.Lo, r.Up)
		b.Param, b.Rem = m, Remainder{}
		i.adamShard(k, mode, b)
		i.splitMasters(m, b.Out, r.Lo, r.Up)
	}
}

// The join and split kernels of each ISA (lengths already checked).

func (i ISA) joinMasters(dst []float32, param, lo []uint16, up []uint8) {
	if i == ISAGo {
		joinRef(dst, param, lo, up)
	} else {
		joinVec(i == ISAAVX512, dst, param, lo, up)
	}
}

func (i ISA) splitMasters(src []float32, param, lo []uint16, up []uint8) {
	if i == ISAGo {
		splitRef(src, param, lo, up)
	} else {
		splitVec(i == ISAAVX512, src, param, lo, up)
	}
}
