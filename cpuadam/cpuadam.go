package cpuadam

import (
	"fmt"

	"github.com/strata-ai/strata/adam"
)

// Mode selects how weight decay enters (internal/adam's Mode).
type Mode = adam.Mode

const (
	AdamW  = adam.W  // decoupled weight decay (PyTorch torch.optim.AdamW)
	AdamL2 = adam.L2 // classic Adam, decay added to the gradient (torch.optim.Adam weight_decay)
)

// Params are the hyper-parameters of one step: internal/adam's Params,
// which are also gpu.AdamParams, so host and device optimizers take the
// same value. Params.Validate says what is wrong with them.
type Params = adam.Params

// StepF32 is the single-threaded entry point: one Adam step over
// param, grad (fp32), m and v, all of one length; out (bf16 bits) receives
// the new params when not nil. It uses the fastest kernel of this CPU
// (Best); every kernel gives the same bits.
func StepF32(p Params, param, grad, m, v []float32, out []uint16) {
	checkLens(len(param), len(grad), len(m), len(v), out)
	k := makeConsts(p)
	best.adamF32(&k, p.Mode, param, grad, m, v, out)
}

// StepBF16 is StepF32 with bf16 gradients.
func StepBF16(p Params, param []float32, grad []uint16, m, v []float32, out []uint16) {
	checkLens(len(param), len(grad), len(m), len(v), out)
	k := makeConsts(p)
	best.adamBF16(&k, p.Mode, param, grad, m, v, out)
}

// StepF16 is StepF32 with fp16 mixed precision's 16-bit floats: grad in
// IEEE binary16 (widened exactly) and the new params rounded to binary16
// into out when not nil; the update's bits are those of StepF32 on the
// widened gradient.
func StepF16(p Params, param []float32, grad []uint16, m, v []float32, out []uint16) {
	checkLens(len(param), len(grad), len(m), len(v), out)
	k := makeConsts(p)
	best.adamShard(&k, p.Mode, Shard{Param: param, Grad16: grad, M: Moment{F32: m}, V: Moment{F32: v, Second: true}, Out: out, F16: true})
}

// SumSquares returns the sum of x[i]² in float64, in the order the package
// doc defines (independent of ISA and threads). It is +Inf or NaN exactly
// when some x[i] is.
func SumSquares(x []float32) float64 {
	return sumSquares(best, x, nil)
}

// SumSquaresBF16 is SumSquares over bf16 values.
func SumSquaresBF16(x []uint16) float64 {
	return sumSquares(best, nil, x)
}

// NonFinite reports whether some x[i] is ±Inf or NaN.
func NonFinite(x []float32) bool {
	return best.maxAbsF32(x) >= 0x7f800000
}

// NonFiniteBF16 reports whether some bf16 x[i] is ±Inf or NaN.
func NonFiniteBF16(x []uint16) bool {
	return best.maxAbsBF16(x) >= 0x7f800000
}

func checkLens(n, g, m, v int, out []uint16) {
	if g != n || m != n || v != n || (out != nil && len(out) != n) {
		panic(fmt.Sprintf("cpuadam: length mismatch: param %d grad %d m %d v %d out %d", n, g, m, v, len(out)))
	}
}
