package adam

import (
	"math"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := Params{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 1, GradScale: 1}
	if err := good.Validate(); err != nil {
		t.Fatalf("good params: %v", err)
	}
	for _, c := range []struct {
		want string
		bad  func(p *Params)
	}{
		{"lr", func(p *Params) { p.LR = -1 }},
		{"lr", func(p *Params) { p.LR = math.Inf(1) }},
		{"beta1", func(p *Params) { p.Beta1 = 1 }},
		{"beta2", func(p *Params) { p.Beta2 = math.NaN() }},
		{"eps", func(p *Params) { p.Eps = 0 }},
		{"weight decay", func(p *Params) { p.WeightDecay = -0.1 }},
		{"step", func(p *Params) { p.Step = 0 }},
		{"grad scale", func(p *Params) { p.GradScale = 0 }},
		{"mode", func(p *Params) { p.Mode = L2 + 1 }},
	} {
		p := good
		c.bad(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one about %s", p, err, c.want)
		}
	}
}

// TestScalars: the constants of the formula, each from float64 rounded
// once, and the two ways weight decay enters.
func TestScalars(t *testing.T) {
	p := Params{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5}
	w := p.Scalars()
	if want := float32(-1e-3 / (1 - 0.9*0.9*0.9)); w.NegStep != want {
		t.Errorf("negStep %v, want %v", w.NegStep, want)
	}
	if want := float32(1 / math.Sqrt(1-math.Pow(0.999, 3))); w.InvSqrtBC2 != want {
		t.Errorf("invSqrtBC2 %v, want %v", w.InvSqrtBC2, want)
	}
	if w.Decay != float32(1-1e-3*0.1) || w.L2 != 0 || w.GradScale != 0.5 || w.OneMinusB2 != float32(1-0.999) {
		t.Errorf("adamw scalars %+v", w)
	}
	p.Mode = L2
	if l := p.Scalars(); l.Decay != 1 || l.L2 != float32(0.1) {
		t.Errorf("l2 scalars %+v", l)
	}
}
