package gputest

import (
	"fmt"
	"math"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// Finite-difference gradient checks: for each op y = f(x), the scalar
// L = sum(w ⊙ y) with random w; the backend's backward with dy = w is
// compared with the central difference of L computed by the float64
// reference. Inputs are rounded to the storage dtype first, so the
// reference sees exactly what the device holds.

const fdStep = 1e-6

func fdGrad(f func([]float64) float64, x []float64) []float64 {
	g := make([]float64, len(x))
	xx := append([]float64(nil), x...)
	for i := range x {
		xx[i] = x[i] + fdStep
		fp := f(xx)
		xx[i] = x[i] - fdStep
		fm := f(xx)
		xx[i] = x[i]
		g[i] = (fp - fm) / (2 * fdStep)
	}
	return g
}

func dotVals(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// checkGrad compares got with init + fd (init nil: the op writes).
func checkGrad(t *testing.T, what string, got, fd, init []float64, dt gpu.DType) {
	t.Helper()
	var mx float64
	for _, v := range fd {
		mx = math.Max(mx, math.Abs(v))
	}
	want, mag := make([]float64, len(fd)), make([]float64, len(fd))
	for i, v := range fd {
		want[i] = v
		if init != nil {
			want[i] += init[i]
		}
		mag[i] = mx + math.Abs(v)
	}
	checkClose(t, what, got, want, mag, dt, rtolGrad)
}

func testGrads(t *testing.T, nb NewBackend) {
	d, s := one(t, nb)
	for _, dt := range storages {
		t.Run("Gemm/"+dt.String(), func(t *testing.T) { gradGemm(t, d, s, dt) })
		t.Run("Bias/"+dt.String(), func(t *testing.T) { gradBias(t, d, s, dt) })
		t.Run("LayerNorm/"+dt.String(), func(t *testing.T) { gradLayerNorm(t, d, s, dt) })
		t.Run("Attention/"+dt.String(), func(t *testing.T) { gradAttention(t, d, s, dt) })
		t.Run("RMSNorm/"+dt.String(), func(t *testing.T) { gradRMSNorm(t, d, s, dt) })
		t.Run("Rope/"+dt.String(), func(t *testing.T) { gradRope(t, d, s, dt) })
		t.Run("GLU/"+dt.String(), func(t *testing.T) { gradGLU(t, d, s, dt) })
		t.Run("Gelu/"+dt.String(), func(t *testing.T) { gradGelu(t, d, s, dt) })
		t.Run("CrossEntropy/"+dt.String(), func(t *testing.T) { gradCrossEntropy(t, d, s, dt) })
		t.Run("Embedding/"+dt.String(), func(t *testing.T) { gradEmbedding(t, d, s, dt) })
	}
}

// gradGemm checks the backward formulas of C = op(A)·op(B), as the model
// writes them with Gemm and beta = 1 (accumulating into the gradients):
//
//	dA = dC·op(B)ᵀ (or op(B)·dCᵀ when transA), dB = op(A)ᵀ·dC (or dCᵀ·op(A) when transB).
func gradGemm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(30)
	m, n, k := 5, 7, 6
	for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
		tA, tB := tr[0], tr[1]
		a, b := stored(randVals(r, m*k, 1), dt), stored(randVals(r, k*n, 1), dt)
		w := stored(randVals(r, m*n, 1), dt)
		da0, db0 := stored(randVals(r, m*k, 1), dt), stored(randVals(r, k*n, 1), dt)
		ga, gb, gw := upload(t, d, s, a, dt), upload(t, d, s, b, dt), upload(t, d, s, w, dt)
		gda, gdb := upload(t, d, s, da0, dt), upload(t, d, s, db0, dt)
		ops := d.Ops()
		if !tA {
			ops.Gemm(s, false, !tB, m, k, n, 1, gw, gb, 1, gda)
		} else {
			ops.Gemm(s, tB, true, k, m, n, 1, gb, gw, 1, gda)
		}
		if !tB {
			ops.Gemm(s, !tA, false, k, n, m, 1, ga, gw, 1, gdb)
		} else {
			ops.Gemm(s, true, tA, n, k, m, 1, gw, ga, 1, gdb)
		}
		fdA := fdGrad(func(x []float64) float64 {
			c, _ := gemmRef(tA, tB, m, n, k, 1, x, b, 0, nil)
			return dotVals(w, c)
		}, a)
		fdB := fdGrad(func(x []float64) float64 {
			c, _ := gemmRef(tA, tB, m, n, k, 1, a, x, 0, nil)
			return dotVals(w, c)
		}, b)
		name := fmt.Sprintf("tA=%v,tB=%v", tA, tB)
		checkGrad(t, name+" dA", download(t, d, s, gda), fdA, da0, dt)
		checkGrad(t, name+" dB", download(t, d, s, gdb), fdB, db0, dt)
	}
}

func gradBias(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(31)
	rows, cols := 9, 13
	y, bias := stored(randVals(r, rows*cols, 1), dt), stored(randVals(r, cols, 1), dt)
	w, db0 := stored(randVals(r, rows*cols, 1), dt), stored(randVals(r, cols, 1), dt)
	gw, gdb := upload(t, d, s, w, dt), upload(t, d, s, db0, dt)
	d.Ops().BiasGrad(s, gw, gdb, rows, cols)
	fd := fdGrad(func(x []float64) float64 {
		var l float64
		for i := range y {
			l += w[i] * (y[i] + x[i%cols])
		}
		return l
	}, bias)
	checkGrad(t, "dbias", download(t, d, s, gdb), fd, db0, dt)
}

func gradLayerNorm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(32)
	rows, cols := 3, 8
	const eps = 1e-5
	x := stored(randVals(r, rows*cols, 2), dt)
	g, b := stored(randVals(r, cols, 1.5), dt), stored(randVals(r, cols, 1), dt)
	w := stored(randVals(r, rows*cols, 1), dt)
	dx0, dg0, db0 := stored(randVals(r, rows*cols, 1), dt), stored(randVals(r, cols, 1), dt), stored(randVals(r, cols, 1), dt)
	gx, gg, gb, gw := upload(t, d, s, x, dt), upload(t, d, s, g, dt), upload(t, d, s, b, dt), upload(t, d, s, w, dt)
	gy, gm, gr := alloc(t, d, rows*cols, dt), alloc(t, d, rows, gpu.F32), alloc(t, d, rows, gpu.F32)
	gdx, gdg, gdb := upload(t, d, s, dx0, dt), upload(t, d, s, dg0, dt), upload(t, d, s, db0, dt)
	ops := d.Ops()
	ops.LayerNormForward(s, gx, gg, gb, gy, gm, gr, rows, cols, eps)
	ops.LayerNormBackward(s, gw, gx, gg, gm, gr, gdx, gdg, gdb, rows, cols)
	loss := func(x, g, b []float64) float64 {
		y, _, _ := layerNormRef(x, g, b, rows, cols, eps)
		return dotVals(w, y)
	}
	checkGrad(t, "dx", download(t, d, s, gdx), fdGrad(func(v []float64) float64 { return loss(v, g, b) }, x), dx0, dt)
	checkGrad(t, "dgamma", download(t, d, s, gdg), fdGrad(func(v []float64) float64 { return loss(x, v, b) }, g), dg0, dt)
	checkGrad(t, "dbeta", download(t, d, s, gdb), fdGrad(func(v []float64) float64 { return loss(x, g, v) }, b), db0, dt)
}

func gradGelu(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(34)
	n := 51
	x, w := stored(randVals(r, n, 4), dt), stored(randVals(r, n, 1), dt)
	gx, gw := upload(t, d, s, x, dt), upload(t, d, s, w, dt)
	gdx := upload(t, d, s, constVals(n, math.NaN()), dt)
	d.Ops().GeluBackward(s, gx, gw, gdx, n)
	fd := fdGrad(func(v []float64) float64 {
		var l float64
		for i := range v {
			l += w[i] * geluRef(v[i])
		}
		return l
	}, x)
	checkGrad(t, "dx", download(t, d, s, gdx), fd, nil, dt)
}
