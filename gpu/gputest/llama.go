package gputest

import (
	"fmt"
	"math"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// The Llama family's ops: RMSNorm, rotary embeddings, the gated MLP
// (SwiGLU, GeGLU).

func rmsNormRef(x, g []float64, rows, cols int, eps float64) (y, rstd []float64) {
	y, rstd = make([]float64, rows*cols), make([]float64, rows)
	for r := range rows {
		xr := x[r*cols : (r+1)*cols]
		var ss float64
		for _, v := range xr {
			ss += v * v
		}
		rs := 1 / math.Sqrt(ss/float64(cols)+eps)
		for c, v := range xr {
			y[r*cols+c] = v * rs * g[c]
		}
		rstd[r] = rs
	}
	return y, rstd
}

func testRMSNorm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(51)
	for _, sz := range [][2]int{{1, 1}, {5, 37}, {17, 300}} {
		rows, cols := sz[0], sz[1]
		x, g := stored(randVals(r, rows*cols, 2), dt), stored(randVals(r, cols, 1.5), dt)
		gx, gg := upload(t, d, s, x, dt), upload(t, d, s, g, dt)
		gy, gr := alloc(t, d, rows*cols, dt), alloc(t, d, rows, gpu.F32)
		d.Ops().RMSNormForward(s, gx, gg, gy, gr, rows, cols, 1e-6)
		y, rstd := rmsNormRef(x, g, rows, cols, 1e-6)
		name := fmt.Sprintf("%dx%d", rows, cols)
		checkClose(t, name+" y", download(t, d, s, gy), y, absVals(y), dt, rtolF32)
		checkClose(t, name+" rstd", download(t, d, s, gr), rstd, nil, gpu.F32, rtolF32)
	}
}

// testAddRMSNorm checks AddRMSNormForward against the float64 reference of
// the stored sum, and against its contract: sum has Add's bits, y and rstd
// RMSNormForward's, with sum apart and in place of b. The buffers are
// views at odd offsets and the widths not multiples of 8, so a backend
// that moves 16-byte vectors takes its unaligned paths and its tails too
// (2051: more than a 256-thread block's 2048 columns in chunks of 8).
func testAddRMSNorm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(54)
	ops := d.Ops()
	for _, sz := range [][3]int{{1, 1, 0}, {4, 64, 0}, {3, 37, 1}, {2, 2051, 3}, {2, 2072, 0}} {
		rows, cols, off := sz[0], sz[1], sz[2]
		n := rows * cols
		name := fmt.Sprintf("%dx%d+%d", rows, cols, off)
		av, bv, g := stored(randVals(r, n, 2), dt), stored(randVals(r, n, 1), dt), stored(randVals(r, cols, 1.5), dt)
		view := viewAt(t, d, s, off, dt)
		ga, gb, gg := view(av), view(bv), view(g)
		gsum, gy, gr := view(make([]float64, n)), view(make([]float64, n)), alloc(t, d, rows, gpu.F32)
		ops.AddRMSNormForward(s, ga, gb, gsum, gg, gy, gr, rows, cols, 1e-6)
		// the contract: Add, then RMSNormForward of the stored sum
		wsum, wy, wr := view(make([]float64, n)), view(make([]float64, n)), alloc(t, d, rows, gpu.F32)
		ops.Add(s, ga, gb, wsum, n)
		ops.RMSNormForward(s, wsum, gg, wy, wr, rows, cols, 1e-6)
		sum := download(t, d, s, gsum)
		for _, c := range []struct {
			what      string
			got, want gpu.Buffer
		}{{"sum", gsum, wsum}, {"y", gy, wy}, {"rstd", gr, wr}} {
			if !equalBits(download(t, d, s, c.got), download(t, d, s, c.want)) {
				t.Errorf("%s %s: not the bits of Add then RMSNormForward", name, c.what)
			}
		}
		checkClose(t, name+" sum", sum, addVals(av, bv), addVals(absVals(av), absVals(bv)), dt, rtolF32)
		y, rstd := rmsNormRef(sum, g, rows, cols, 1e-6)
		checkClose(t, name+" y", download(t, d, s, gy), y, absVals(y), dt, rtolF32)
		checkClose(t, name+" rstd", download(t, d, s, gr), rstd, nil, gpu.F32, rtolF32)
		// in place: sum is b
		gy2, gr2 := view(make([]float64, n)), alloc(t, d, rows, gpu.F32)
		ops.AddRMSNormForward(s, ga, gb, gb, gg, gy2, gr2, rows, cols, 1e-6)
		if !equalBits(download(t, d, s, gb), sum) || !equalBits(download(t, d, s, gy2), download(t, d, s, gy)) {
			t.Errorf("%s: in place of b, not the bits of a separate sum", name)
		}
	}
}

// gradRMSNorm: dx and dgamma accumulate onto what the buffers held.
func gradRMSNorm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(52)
	rows, cols := 3, 8
	const eps = 1e-5
	x, g := stored(randVals(r, rows*cols, 2), dt), stored(randVals(r, cols, 1.5), dt)
	w := stored(randVals(r, rows*cols, 1), dt)
	dx0, dg0 := stored(randVals(r, rows*cols, 1), dt), stored(randVals(r, cols, 1), dt)
	gx, gg, gw := upload(t, d, s, x, dt), upload(t, d, s, g, dt), upload(t, d, s, w, dt)
	gy, gr := alloc(t, d, rows*cols, dt), alloc(t, d, rows, gpu.F32)
	gdx, gdg := upload(t, d, s, dx0, dt), upload(t, d, s, dg0, dt)
	ops := d.Ops()
	ops.RMSNormForward(s, gx, gg, gy, gr, rows, cols, eps)
	ops.RMSNormBackward(s, gw, gx, gg, gr, gdx, gdg, rows, cols)
	loss := func(x, g []float64) float64 {
		y, _ := rmsNormRef(x, g, rows, cols, eps)
		return dotVals(w, y)
	}
	checkGrad(t, "dx", download(t, d, s, gdx), fdGrad(func(v []float64) float64 { return loss(v, g) }, x), dx0, dt)
	checkGrad(t, "dgamma", download(t, d, s, gdg), fdGrad(func(v []float64) float64 { return loss(x, v) }, g), dg0, dt)
}

// ropeCase is a rotary configuration on packed qkv rows: the plain
// rotation of base theta over whole heads (gpu.DefaultRope), or rope when
// its InvFreq is set.
type ropeCase struct {
	B, T, H, KV, D int
	theta          float64
	pos            []int // nil: pos[b,t] = t
	rope           gpu.Rope
}

// ropeOf is the case's Rope.
func (c ropeCase) ropeOf() gpu.Rope {
	if c.rope.InvFreq != nil {
		return c.rope
	}
	return gpu.DefaultRope(c.D, c.theta)
}

func (c ropeCase) String() string {
	r := c.ropeOf()
	return fmt.Sprintf("B%d,T%d,H%d,KV%d,D%d,theta%g,dims%d,scale%g,pos=%v", c.B, c.T, c.H, c.KV, c.D, c.theta, r.Dims, r.Scale, c.pos != nil)
}

// ropeRef rotates the first Dims values of the q and k heads of qkv in
// float64 by angle pos·InvFreq[i] (the fp32 inverse frequencies as the op
// gets them), cos and sin times Scale (inverse: the transpose rotation);
// the rest of each head is untouched. mag is Scale·(|x_i| +
// |x_{i+Dims/2}|) per rotated element, the scale of the error fp32 cos
// and sin (rounded from float64) make.
func ropeRef(qkv []float64, c ropeCase, inverse bool) (out, mag []float64) {
	rp := c.ropeOf()
	W, half, sc := (c.H+2*c.KV)*c.D, rp.Dims/2, float64(rp.Scale)
	out, mag = append([]float64(nil), qkv...), absVals(qkv)
	for bt := range c.B * c.T {
		p := bt % c.T
		if c.pos != nil {
			p = c.pos[bt]
		}
		for h := 0; h < c.H+c.KV; h++ {
			base := bt*W + h*c.D
			for i := range half {
				a := float64(p) * float64(rp.InvFreq[i])
				cs, sn := sc*math.Cos(a), sc*math.Sin(a)
				if inverse {
					sn = -sn
				}
				x1, x2 := qkv[base+i], qkv[base+half+i]
				out[base+i], out[base+half+i] = x1*cs-x2*sn, x2*cs+x1*sn
				m := sc * (math.Abs(x1) + math.Abs(x2))
				mag[base+i], mag[base+half+i] = m, m
			}
		}
	}
	return out, mag
}

// testRope checks RopeForward and RopeBackward against the float64
// rotation (values untouched bit for bit), at head dimensions 8, 64 and
// 128, Llama-3's theta, grouped heads, packed positions and positions past
// seq (as generation with a cache uses); then partial rotations (Dims <
// headDim: the rest of each q and k head untouched bit for bit, Phi-3's
// and Gemma's partial_rotary_factor), Scale ≠ 1 (YaRN's attention
// factor) and inverse frequencies that are not the default ones (Llama
// 3.1's rescaled ones, arbitrary ones). Tolerance 1e-5·Scale·(|x_i| +
// |x_{i+Dims/2}|): fp32 cos and sin are within 2^-24 of the float64 ones.
func testRope(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(53)
	cases := []ropeCase{
		{B: 2, T: 9, H: 4, KV: 2, D: 8, theta: 10000},
		{B: 1, T: 70, H: 2, KV: 1, D: 64, theta: 500000},
		{B: 2, T: 33, H: 2, KV: 2, D: 128, theta: 10000, pos: packedPositions(r, 2, 33, 10)},
		{B: 1, T: 3, H: 1, KV: 1, D: 8, theta: 10000, pos: []int{5000, 7, 100}},
		{B: 2, T: 9, H: 4, KV: 2, D: 16, pos: packedPositions(r, 2, 9, 5),
			rope: gpu.Rope{InvFreq: gpu.InvFreq(8, 10000), Scale: 1, Dims: 8}},
		{B: 1, T: 33, H: 2, KV: 1, D: 64, rope: gpu.Rope{InvFreq: gpu.InvFreq(64, 500000), Scale: 1.25, Dims: 64}},
		{B: 1, T: 20, H: 3, KV: 1, D: 12, pos: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 900, 901, 902, 0, 1, 2, 3, 4, 5, 6},
			rope: gpu.Rope{InvFreq: []float32{1.5, 0.31, 0.007}, Scale: 0.8, Dims: 6}},
		{B: 1, T: 5, H: 1, KV: 1, D: 6, rope: gpu.Rope{InvFreq: []float32{0.5}, Scale: 1, Dims: 2}},
	}
	ops := d.Ops()
	for _, c := range cases {
		W := (c.H + 2*c.KV) * c.D
		x := stored(randVals(r, c.B*c.T*W, 2), dt)
		var gpos gpu.Buffer
		if c.pos != nil {
			gpos = upload(t, d, s, intVals(c.pos), gpu.I32)
		}
		name := c.String()
		rp := c.ropeOf()
		for _, inverse := range []bool{false, true} {
			gx := upload(t, d, s, x, dt)
			if inverse {
				ops.RopeBackward(s, gx, gpos, c.B, c.T, c.H, c.KV, c.D, rp)
			} else {
				ops.RopeForward(s, gx, gpos, c.B, c.T, c.H, c.KV, c.D, rp)
			}
			want, mag := ropeRef(x, c, inverse)
			got := download(t, d, s, gx)
			checkClose(t, fmt.Sprintf("%s inverse=%v", name, inverse), got, want, mag, dt, rtolF32)
			for bt := range c.B * c.T {
				v := bt*W + (c.H+c.KV)*c.D
				if !equalBits(got[v:v+c.KV*c.D], x[v:v+c.KV*c.D]) {
					t.Fatalf("%s: the value heads of token %d changed", name, bt)
				}
				for h := range c.H + c.KV { // the values past Dims of each q and k head
					u := bt*W + h*c.D
					if !equalBits(got[u+rp.Dims:u+c.D], x[u+rp.Dims:u+c.D]) {
						t.Fatalf("%s: values %d..%d of head %d of token %d changed", name, rp.Dims, c.D-1, h, bt)
					}
				}
			}
		}
	}
}

// gradRope: RopeBackward of w is the gradient of Σ w ⊙ rope(x), by
// central differences of the float64 rotation: whole heads, and a partial
// rotation with a scale and inverse frequencies of its own (the
// unrotated values' gradient is w itself).
func gradRope(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(54)
	pos := []int{0, 1, 2, 0, 1, 0, 1, 2, 3, 4}
	for _, c := range []ropeCase{
		{B: 2, T: 5, H: 2, KV: 1, D: 6, theta: 10000, pos: pos},
		{B: 2, T: 5, H: 2, KV: 1, D: 8, pos: pos, rope: gpu.Rope{InvFreq: []float32{0.9, 0.05}, Scale: 1.3, Dims: 4}},
	} {
		W := (c.H + 2*c.KV) * c.D
		x, w := stored(randVals(r, c.B*c.T*W, 1), dt), stored(randVals(r, c.B*c.T*W, 1), dt)
		gw, gpos := upload(t, d, s, w, dt), upload(t, d, s, intVals(c.pos), gpu.I32)
		d.Ops().RopeBackward(s, gw, gpos, c.B, c.T, c.H, c.KV, c.D, c.ropeOf())
		fd := fdGrad(func(v []float64) float64 {
			y, _ := ropeRef(v, c, false)
			return dotVals(w, y)
		}, x)
		checkGrad(t, c.String()+" dqkv", download(t, d, s, gw), fd, nil, dt)
	}
}

func siluRef(x float64) float64 { return x / (1 + math.Exp(-x)) }

// geluTanhRef is GELU's tanh approximation (gelu_pytorch_tanh).
func geluTanhRef(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// gluActs are the activations of GLUForward with their float64
// references.
var gluActs = []struct {
	act gpu.GLUAct
	f   func(float64) float64
}{{gpu.Silu, siluRef}, {gpu.GeluTanh, geluTanhRef}}

func gluRef(gu []float64, rows, ffn int, f func(float64) float64) (y, mag []float64) {
	y, mag = make([]float64, rows*ffn), make([]float64, rows*ffn)
	for r := range rows {
		for c := range ffn {
			g, u := gu[r*2*ffn+c], gu[r*2*ffn+ffn+c]
			y[r*ffn+c] = f(g) * u
			mag[r*ffn+c] = math.Abs(f(g) * u)
		}
	}
	return y, mag
}

// testGLU checks GLUForward with each activation (SwiGLU, GeGLU).
func testGLU(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(55)
	for _, a := range gluActs {
		for _, sz := range [][2]int{{1, 1}, {7, 37}, {3, 3000}} {
			rows, ffn := sz[0], sz[1]
			gu := stored(randVals(r, rows*2*ffn, 6), dt)
			ggu, gy := upload(t, d, s, gu, dt), alloc(t, d, rows*ffn, dt)
			d.Ops().GLUForward(s, ggu, gy, rows, ffn, a.act)
			want, mag := gluRef(gu, rows, ffn, a.f)
			checkClose(t, fmt.Sprintf("%v %dx%d", a.act, rows, ffn), download(t, d, s, gy), want, mag, dt, rtolF32)
		}
	}
}

// gradGLU: d gate|up is written (the buffer starts as NaN), for each
// activation.
func gradGLU(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(56)
	rows, ffn := 4, 9
	for _, a := range gluActs {
		gu, w := stored(randVals(r, rows*2*ffn, 5), dt), stored(randVals(r, rows*ffn, 1), dt)
		ggu, gw := upload(t, d, s, gu, dt), upload(t, d, s, w, dt)
		gd := upload(t, d, s, constVals(rows*2*ffn, math.NaN()), dt)
		d.Ops().GLUBackward(s, ggu, gw, gd, rows, ffn, a.act)
		fd := fdGrad(func(v []float64) float64 {
			y, _ := gluRef(v, rows, ffn, a.f)
			return dotVals(w, y)
		}, gu)
		checkGrad(t, a.act.String()+" d gate|up", download(t, d, s, gd), fd, nil, dt)
	}
}
