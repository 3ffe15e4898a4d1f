// Package adam holds the hyper-parameters of one Adam step.
//
// They are shared by the host optimizer (cpuadam, as cpuadam.Params) and
// the device backends (gpu, as gpu.AdamParams), so that neither converts
// the other's type: the engine builds one Params and hands it to whichever
// optimizer runs.
//
// It owns the validation of the hyper-parameters and the per-step scalars
// both implementations derive from them (computed in float64 and rounded
// once to float32); the formula that uses them is documented in package
// cpuadam. Params are plain values; nothing here allocates or keeps state.
package adam

import (
	"errors"
	"fmt"
	"math"
)

//go:generate go tool stringer -type=Mode -linecomment -output=mode_string.go

// Mode selects how weight decay enters.
type Mode uint8

const (
	// W: AdamW: decoupled weight decay (PyTorch torch.optim.AdamW)
	W Mode = iota // adamw
	// L2: classic Adam, decay added to the gradient (torch.optim.Adam weight_decay)
	L2 // adam-l2
)

// Params are the hyper-parameters of one step.
type Params struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	Step                               int64   // 1 for the first step
	GradScale                          float64 // multiplies every gradient first (1/loss-scale × clip coefficient); 1 when unused
	Mode                               Mode
}

// Validate says what is wrong with p.
func (p Params) Validate() error {
	switch {
	case !(p.LR >= 0) || math.IsInf(p.LR, 0):
		return fmt.Errorf("adam: lr %v must be finite and >= 0", p.LR)
	case !(p.Beta1 >= 0 && p.Beta1 < 1):
		return fmt.Errorf("adam: beta1 %v must be in [0, 1)", p.Beta1)
	case !(p.Beta2 >= 0 && p.Beta2 < 1):
		return fmt.Errorf("adam: beta2 %v must be in [0, 1)", p.Beta2)
	case !(p.Eps > 0):
		return fmt.Errorf("adam: eps %v must be > 0", p.Eps)
	case !(p.WeightDecay >= 0):
		return fmt.Errorf("adam: weight decay %v must be >= 0", p.WeightDecay)
	case p.Step < 1:
		return fmt.Errorf("adam: step %d must be >= 1", p.Step)
	case !(p.GradScale > 0) || math.IsInf(p.GradScale, 0):
		return fmt.Errorf("adam: grad scale %v must be finite and > 0", p.GradScale)
	case p.Mode > L2:
		return errors.New("adam: unknown mode")
	}
	return nil
}

// Scalars are the per-step constants of the update (see package cpuadam's
// formula), each computed in float64 and rounded once to float32.
type Scalars struct {
	GradScale  float32 // gs
	Beta1      float32 // b1
	OneMinusB1 float32 // 1 - beta1
	Beta2      float32 // b2
	OneMinusB2 float32 // 1 - beta2
	NegStep    float32 // -lr / (1 - beta1^step)
	InvSqrtBC2 float32 // 1 / sqrt(1 - beta2^step)
	Eps        float32
	Decay      float32 // 1 - lr*wd (AdamW) or 1 (L2)
	L2         float32 // wd (L2) or 0 (AdamW)
}

// Scalars computes the per-step constants of p.
func (p Params) Scalars() Scalars {
	bc1 := 1 - math.Pow(p.Beta1, float64(p.Step))
	bc2 := 1 - math.Pow(p.Beta2, float64(p.Step))
	s := Scalars{
		GradScale: float32(p.GradScale), Beta1: float32(p.Beta1), OneMinusB1: float32(1 - p.Beta1),
		Beta2: float32(p.Beta2), OneMinusB2: float32(1 - p.Beta2), NegStep: float32(-p.LR / bc1),
		InvSqrtBC2: float32(1 / math.Sqrt(bc2)), Eps: float32(p.Eps), Decay: 1,
	}
	if p.Mode == W {
		s.Decay = float32(1 - p.LR*p.WeightDecay)
	} else {
		s.L2 = float32(p.WeightDecay)
	}
	return s
}
