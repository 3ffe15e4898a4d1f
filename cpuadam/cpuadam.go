package cpuadam

import (
	"errors"
	"fmt"
	"math"
)

// Mode selects how weight decay enters.
type Mode uint8

const (
	AdamW  Mode = iota // decoupled weight decay (PyTorch torch.optim.AdamW)
	AdamL2             // classic Adam, decay added to the gradient (torch.optim.Adam weight_decay)
)

func (m Mode) String() string {
	switch m {
	case AdamW:
		return "adamw"
	case AdamL2:
		return "adam-l2"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Params are the hyper-parameters of one step.
type Params struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	Step                               int64   // 1 for the first step
	GradScale                          float64 // multiplies every gradient first; 1 when unused
	Mode                               Mode
}

// Validate says what is wrong with p.
func (p Params) Validate() error {
	switch {
	case !(p.LR >= 0) || math.IsInf(p.LR, 0):
		return fmt.Errorf("cpuadam: lr %v must be finite and >= 0", p.LR)
	case !(p.Beta1 >= 0 && p.Beta1 < 1):
		return fmt.Errorf("cpuadam: beta1 %v must be in [0, 1)", p.Beta1)
	case !(p.Beta2 >= 0 && p.Beta2 < 1):
		return fmt.Errorf("cpuadam: beta2 %v must be in [0, 1)", p.Beta2)
	case !(p.Eps > 0):
		return fmt.Errorf("cpuadam: eps %v must be > 0", p.Eps)
	case !(p.WeightDecay >= 0):
		return fmt.Errorf("cpuadam: weight decay %v must be >= 0", p.WeightDecay)
	case p.Step < 1:
		return fmt.Errorf("cpuadam: step %d must be >= 1", p.Step)
	case !(p.GradScale > 0) || math.IsInf(p.GradScale, 0):
		return fmt.Errorf("cpuadam: grad scale %v must be finite and > 0", p.GradScale)
	case p.Mode > AdamL2:
		return errors.New("cpuadam: unknown mode")
	}
	return nil
}

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
