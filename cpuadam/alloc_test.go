package cpuadam

import (
	"testing"

	"github.com/strata-ai/strata/dtype"
)

func TestNoAllocPerCall(t *testing.T) {
	n := 1 << 17
	param, grad, m, v, out := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n), make([]uint16, n)
	p := Params{LR: 1e-3, Beta1: .9, Beta2: .999, Eps: 1e-8, Step: 1, GradScale: 1}
	o, err := New(Options{Threads: 2, MinTileLen: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	rem := Shard{Grad: grad, M: Moment{F32: m}, V: Moment{F32: v, Second: true}, Out: out,
		Rem: RemainderView(n, make([]byte, dtype.Rem16.Bytes(n)))} // the block of masters joined on the stack
	for name, f := range map[string]func(){
		"Step (remainder)":           func() { Step(p, rem) },
		"Optimizer.Step (remainder)": func() { o.Step(p, rem) },
		"StepF32":                    func() { StepF32(p, param, grad, m, v, out) },
		"SumSquares":                 func() { SumSquares(grad) },
		"NonFinite":                  func() { NonFinite(grad) },
		"Optimizer.StepF32":          func() { o.StepF32(p, param, grad, m, v, out) },
		"Optimizer.SumSquares":       func() { o.SumSquares(grad) },
		"Optimizer.NonFinite":        func() { o.NonFinite(grad) },
	} {
		if a := testing.AllocsPerRun(5, f); a != 0 {
			t.Errorf("%s: %v allocations per call", name, a)
		}
	}
}
