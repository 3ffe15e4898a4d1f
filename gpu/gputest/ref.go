package gputest

import "math"

// Plain float64 references of the ops, written for clarity. Each returns
// the output and, where the suite needs it, the magnitude of the terms that
// make each output element (the scale of its rounding error).

// at returns element (i, j) of op(X) for X stored row-major as r×c
// (op(X) is c×r when trans).
func at(x []float64, trans bool, cols, i, j int) float64 {
	if trans {
		return x[j*cols+i]
	}
	return x[i*cols+j]
}

func gemmRef(transA, transB bool, m, n, k int, alpha float64, a, b []float64, beta float64, c []float64) (out, mag []float64) {
	out, mag = make([]float64, m*n), make([]float64, m*n)
	acols, bcols := k, n
	if transA {
		acols = m
	}
	if transB {
		bcols = k
	}
	for i := range m {
		for j := range n {
			var s, g float64
			for l := range k {
				p := alpha * at(a, transA, acols, i, l) * at(b, transB, bcols, l, j)
				s += p
				g += math.Abs(p)
			}
			if beta != 0 {
				s += beta * c[i*n+j]
				g += math.Abs(beta * c[i*n+j])
			}
			out[i*n+j], mag[i*n+j] = s, g
		}
	}
	return out, mag
}

func layerNormRef(x, g, b []float64, rows, cols int, eps float64) (y, mean, rstd []float64) {
	y, mean, rstd = make([]float64, rows*cols), make([]float64, rows), make([]float64, rows)
	for r := range rows {
		xr := x[r*cols : (r+1)*cols]
		var s float64
		for _, v := range xr {
			s += v
		}
		m := s / float64(cols)
		var ss float64
		for _, v := range xr {
			ss += (v - m) * (v - m)
		}
		rs := 1 / math.Sqrt(ss/float64(cols)+eps)
		for c, v := range xr {
			y[r*cols+c] = (v-m)*rs*g[c] + b[c]
		}
		mean[r], rstd[r] = m, rs
	}
	return y, mean, rstd
}

func geluRef(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func softmaxRow(l []float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range l {
		mx = math.Max(mx, v)
	}
	p := make([]float64, len(l))
	var s float64
	for i, v := range l {
		p[i] = math.Exp(v - mx)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}

func absVals(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = math.Abs(v)
	}
	return out
}

func addVals(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}
