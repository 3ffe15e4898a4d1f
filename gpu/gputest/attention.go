package gputest

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// attnCase is one attention configuration: batch, seq, heads, key/value
// heads and head dimension, the positions (nil: pos[b,t] = t) and the
// options (scale, sliding window, soft cap).
type attnCase struct {
	B, T, H, KV, D int
	pos            []int
	opt            gpu.AttnOptions
}

func (c attnCase) String() string {
	p := ""
	if c.pos != nil {
		p = ",packed"
	}
	if c.opt.Scale != 0 {
		p += fmt.Sprintf(",scale%g", c.opt.Scale)
	}
	if c.opt.Window != 0 {
		p += fmt.Sprintf(",window%d", c.opt.Window)
	}
	if c.opt.SoftCap != 0 {
		p += fmt.Sprintf(",cap%g", c.opt.SoftCap)
	}
	return fmt.Sprintf("B%d,T%d,H%d,KV%d,D%d%s", c.B, c.T, c.H, c.KV, c.D, p)
}

// scale is the softmax scale: opt.Scale (as the fp32 value the op gets),
// or 1/sqrt(D) in float64.
func (c attnCase) scale() float64 {
	if c.opt.Scale != 0 {
		return float64(c.opt.Scale)
	}
	return 1 / math.Sqrt(float64(c.D))
}

// capScore is the soft cap of a scaled score x: cap·tanh(x/cap), or x
// without a cap; dcap its derivative at the capped value z, 1 - (z/cap)².
func (c attnCase) capScore(x float64) float64 {
	if c.opt.SoftCap == 0 {
		return x
	}
	sc := float64(c.opt.SoftCap)
	return sc * math.Tanh(x/sc)
}

func (c attnCase) dcap(z float64) float64 {
	if c.opt.SoftCap == 0 {
		return 1
	}
	u := z / float64(c.opt.SoftCap)
	return 1 - u*u
}

// width is the number of values of one token's packed qkv row.
func (c attnCase) width() int { return (c.H + 2*c.KV) * c.D }

// first is the first key the query at (b, i) sees: the first of its
// example and, with a window, of keys i-Window+1..i.
func (c attnCase) first(b, i int) int {
	f := 0
	if c.pos != nil {
		f = i - c.pos[b*c.T+i]
	}
	if c.opt.Window > 0 {
		f = max(f, i-c.opt.Window+1)
	}
	return f
}

// packedPositions returns positions for batch rows of seq tokens holding
// examples of random lengths (1 to maxLen): positions restart at 0 at each
// example's first token. Every row starts an example at column 0.
func packedPositions(r *rand.Rand, batch, seq, maxLen int) []int {
	pos := make([]int, batch*seq)
	for b := range batch {
		left := 0
		for t := range seq {
			if left == 0 {
				left = 1 + r.IntN(maxLen)
			} else {
				pos[b*seq+t] = pos[b*seq+t-1] + 1
			}
			left--
		}
	}
	return pos
}

func intVals(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// attnProbs returns the softmax probabilities of query (b, h, i) over the
// keys j in [first, i], the score magnitude A_ij = scale·Σ_d |q_d·k_d| of
// each (the soft cap's slope is at most 1, so it bounds the capped
// score's error too), the scores z_ij (scaled, soft-capped) and the
// log-sum-exp of the scores.
func attnProbs(qkv []float64, c attnCase, b, h, i int) (p, amag, z []float64, lse float64) {
	W, kvh := c.width(), h/(c.H/c.KV)
	scale := c.scale()
	q := qkv[(b*c.T+i)*W+h*c.D:][:c.D]
	lo := c.first(b, i)
	p, amag, z = make([]float64, i+1-lo), make([]float64, i+1-lo), make([]float64, i+1-lo)
	mx := math.Inf(-1)
	for j := lo; j <= i; j++ {
		k := qkv[(b*c.T+j)*W+(c.H+kvh)*c.D:][:c.D]
		var sc, a float64
		for d := range c.D {
			sc += q[d] * k[d]
			a += math.Abs(q[d] * k[d])
		}
		z[j-lo], amag[j-lo] = c.capScore(sc*scale), a*scale
		mx = math.Max(mx, z[j-lo])
	}
	var sum float64
	for j := range p {
		p[j] = math.Exp(z[j] - mx)
		sum += p[j]
	}
	for j := range p {
		p[j] /= sum
	}
	return p, amag, z, mx + math.Log(sum)
}

// attentionRef is causal grouped-query attention in float64. mag bounds
// the rounding error of each output: Σ_j p_j|v_j| (the fp32 sums) plus
// max_j A_ij · Σ_j p_j|v_j - out| (an fp32 score is off by about ε·A_ij,
// which moves the output by p_j·δs_j·(v_j - out)); lseMag is |lse| + max_j
// A_ij for the same reason. mag16 is Σ_j p_j|v_j| alone: what rounding
// the probabilities to a 16-bit input type moves an output by, per unit
// of the type's relative rounding (attentionBackwardRef's mag16).
func attentionRef(qkv []float64, c attnCase) (out, lse, mag, lseMag, mag16 []float64) {
	W := c.width()
	out, mag, mag16 = make([]float64, c.B*c.T*c.H*c.D), make([]float64, c.B*c.T*c.H*c.D), make([]float64, c.B*c.T*c.H*c.D)
	lse, lseMag = make([]float64, c.B*c.H*c.T), make([]float64, c.B*c.H*c.T)
	for b := range c.B {
		for h := range c.H {
			kvh := h / (c.H / c.KV)
			for i := range c.T {
				p, amag, _, l := attnProbs(qkv, c, b, h, i)
				lo := c.first(b, i)
				var amax float64
				for _, a := range amag {
					amax = math.Max(amax, a)
				}
				o := out[(b*c.T+i)*c.H*c.D+h*c.D:][:c.D]
				for j := lo; j <= i; j++ {
					v := qkv[(b*c.T+j)*W+(c.H+c.KV+kvh)*c.D:][:c.D]
					for d := range c.D {
						o[d] += p[j-lo] * v[d]
					}
				}
				mg, m16 := mag[(b*c.T+i)*c.H*c.D+h*c.D:][:c.D], mag16[(b*c.T+i)*c.H*c.D+h*c.D:][:c.D]
				for j := lo; j <= i; j++ {
					v := qkv[(b*c.T+j)*W+(c.H+c.KV+kvh)*c.D:][:c.D]
					for d := range c.D {
						mg[d] += p[j-lo] * (math.Abs(v[d]) + amax*math.Abs(v[d]-o[d]))
						m16[d] += p[j-lo] * math.Abs(v[d])
					}
				}
				lse[(b*c.H+h)*c.T+i], lseMag[(b*c.H+h)*c.T+i] = l, math.Abs(l)+amax
			}
		}
	}
	return out, lse, mag, lseMag, mag16
}

// attentionBackwardRef is the gradient of Σ dout ⊙ attention(qkv) with
// respect to qkv, in float64, by the formulas of the op's contract (dS
// times the soft cap's derivative 1 - (z/cap)² with a cap): the
// probabilities recomputed exactly, D_i = dout_i · out_i from the out the
// op is given (so a bf16 out enters as the device holds it). mag16 bounds
// what rounding P and dS to a 16-bit input type before their products
// moves each element, per unit of the type's relative rounding (a backend
// on tensor cores does: gpu.Ops.AttentionForward): Σ_i p_ij|dout_i| (dV),
// Σ_j |dS_ij||k_j| (dQ), Σ_i |dS_ij||q_i| (dK).
func attentionBackwardRef(dout, qkv, out []float64, c attnCase) (dqkv, mag16 []float64) {
	W, C := c.width(), c.H*c.D
	scale := c.scale()
	dqkv, mag16 = make([]float64, len(qkv)), make([]float64, len(qkv))
	for b := range c.B {
		for h := range c.H {
			kvh := h / (c.H / c.KV)
			for i := range c.T {
				p, _, z, _ := attnProbs(qkv, c, b, h, i)
				lo := c.first(b, i)
				do := dout[(b*c.T+i)*C+h*c.D:][:c.D]
				o := out[(b*c.T+i)*C+h*c.D:][:c.D]
				var di float64
				for d := range c.D {
					di += do[d] * o[d]
				}
				q := qkv[(b*c.T+i)*W+h*c.D:][:c.D]
				qo := (b*c.T+i)*W + h*c.D
				dq, mq := dqkv[qo:][:c.D], mag16[qo:][:c.D]
				for j := lo; j <= i; j++ {
					ko, vo := (b*c.T+j)*W+(c.H+kvh)*c.D, (b*c.T+j)*W+(c.H+c.KV+kvh)*c.D
					k, v := qkv[ko:][:c.D], qkv[vo:][:c.D]
					dk, dv, mk, mv := dqkv[ko:][:c.D], dqkv[vo:][:c.D], mag16[ko:][:c.D], mag16[vo:][:c.D]
					var dp float64
					for d := range c.D {
						dp += do[d] * v[d]
					}
					pj := p[j-lo]
					ds := pj * (dp - di) * c.dcap(z[j-lo]) * scale
					for d := range c.D {
						dv[d] += pj * do[d]
						dq[d] += ds * k[d]
						dk[d] += ds * q[d]
						mv[d] += pj * math.Abs(do[d])
						mq[d] += math.Abs(ds * k[d])
						mk[d] += math.Abs(ds * q[d])
					}
				}
			}
		}
	}
	return dqkv, mag16
}

// round16 is the relative rounding of a 16-bit float type (2^-8 for
// bf16's 8 significant bits, 2^-11 for f16's 11), 0 for others.
func round16(dt gpu.DType) float64 {
	switch dt {
	case gpu.BF16:
		return 0x1p-8
	case gpu.F16:
		return 0x1p-11
	}
	return 0
}

// plusScaled returns mag + k·extra, element by element.
func plusScaled(mag, extra []float64, k float64) []float64 {
	out := make([]float64, len(mag))
	for i := range mag {
		out[i] = mag[i] + k*extra[i]
	}
	return out
}

// attentionCases cover head dimensions 64 and 128 and small ones, seq not
// a multiple of any usual tile (33, 70, 100, 130 cross tiles of 16-128),
// batch×head counts from 1 to 24, grouped-query ratios 1, 2 and 4, and
// packed examples that cross tile boundaries; then the options: sliding
// windows shorter than the sequence (whole tiles outside them), of one
// key and as long as the sequence (the full attention), a soft cap that
// bends the scores (|x| up to about the cap), a custom scale, and all
// three, with packed examples and grouped heads; and Gemma's heads of
// 256 with all three (the CUDA backend's wide kernels).
func attentionCases(r *rand.Rand) []attnCase {
	return []attnCase{
		{B: 1, T: 1, H: 1, KV: 1, D: 64},
		{B: 2, T: 7, H: 3, KV: 3, D: 5},
		{B: 2, T: 70, H: 4, KV: 4, D: 64},
		{B: 1, T: 130, H: 4, KV: 2, D: 128},
		{B: 3, T: 33, H: 8, KV: 2, D: 64},
		{B: 2, T: 130, H: 4, KV: 1, D: 64, pos: packedPositions(r, 2, 130, 90)},
		{B: 2, T: 100, H: 2, KV: 2, D: 128, pos: packedPositions(r, 2, 100, 40)},
		{B: 3, T: 20, H: 2, KV: 1, D: 8, pos: packedPositions(r, 3, 20, 3)},
		{B: 2, T: 70, H: 4, KV: 2, D: 64, pos: packedPositions(r, 2, 70, 50), opt: gpu.AttnOptions{Window: 16}},
		{B: 1, T: 130, H: 4, KV: 1, D: 32, opt: gpu.AttnOptions{Window: 40}},
		{B: 2, T: 33, H: 4, KV: 2, D: 8, pos: packedPositions(r, 2, 33, 20), opt: gpu.AttnOptions{Window: 1}},
		{B: 2, T: 37, H: 4, KV: 2, D: 16, pos: packedPositions(r, 2, 37, 30), opt: gpu.AttnOptions{Window: 37}},
		{B: 2, T: 70, H: 4, KV: 2, D: 64, pos: packedPositions(r, 2, 70, 50), opt: gpu.AttnOptions{SoftCap: 3}},
		{B: 2, T: 33, H: 4, KV: 1, D: 16, pos: packedPositions(r, 2, 33, 25), opt: gpu.AttnOptions{Scale: 0.1}},
		{B: 1, T: 100, H: 4, KV: 2, D: 128, pos: packedPositions(r, 1, 100, 60), opt: gpu.AttnOptions{Window: 40, SoftCap: 4, Scale: 0.05}},
		// Gemma's heads of 256, its window, soft cap and scale.
		{B: 1, T: 37, H: 2, KV: 1, D: 256, opt: gpu.AttnOptions{Window: 9, SoftCap: 50, Scale: 0.0625}},
	}
}

// testAttention checks AttentionForward (out and lse) and
// AttentionBackward against the float64 references on every case, the
// backward twice for identical bits, and a position outside [0, t] as an
// error on the stream.
//
// Tolerances: out and lse 1e-5 × their magnitudes (attentionRef), plus
// 2^-8|ref| for a bf16 out; dqkv against attentionBackwardRef 1e-4 × (the
// largest |ref| of the case + |ref|), as the gradient checks (the fp32
// tile sums add errors of ~sqrt(T)·2^-24 of their terms), plus 2^-8|ref|
// for a bf16 dqkv. With 16-bit inputs, plus the type's rounding times
// the references' mag16: a backend may round P and dS to the input type before
// their products (gpu.Ops.AttentionForward).
func testAttention(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(12)
	ops := d.Ops()
	for _, c := range attentionCases(r) {
		qkv := stored(randVals(r, c.B*c.T*c.width(), 2), dt)
		dout := stored(randVals(r, c.B*c.T*c.H*c.D, 1), dt)
		gq, gdo := upload(t, d, s, qkv, dt), upload(t, d, s, dout, dt)
		var gpos gpu.Buffer
		if c.pos != nil {
			gpos = upload(t, d, s, intVals(c.pos), gpu.I32)
		}
		gout := upload(t, d, s, constVals(c.B*c.T*c.H*c.D, math.NaN()), dt)
		glse := upload(t, d, s, constVals(c.B*c.H*c.T, math.NaN()), gpu.F32)
		ops.AttentionForward(s, gq, gout, glse, gpos, c.B, c.T, c.H, c.KV, c.D, c.opt)
		out, lse, mag, lseMag, mag16 := attentionRef(qkv, c)
		gotOut := download(t, d, s, gout)
		checkClose(t, c.String()+" out", gotOut, out, plusScaled(mag, mag16, round16(dt)/rtolF32), dt, rtolF32)
		checkClose(t, c.String()+" lse", download(t, d, s, glse), lse, lseMag, gpu.F32, rtolF32)

		var first []byte
		for run := range 2 {
			gdq := upload(t, d, s, constVals(len(qkv), math.NaN()), dt) // written, not accumulated
			ops.AttentionBackward(s, gdo, gq, gout, glse, gpos, gdq, c.B, c.T, c.H, c.KV, c.D, c.opt)
			if run == 0 {
				want, wmag16 := attentionBackwardRef(dout, qkv, gotOut, c)
				got := download(t, d, s, gdq)
				checkClose(t, c.String()+" dqkv", got, want, plusScaled(gradMag(want), wmag16, round16(dt)/rtolGrad), dt, rtolGrad)
				first = ReadBytes(t, d, gdq)
			} else if !bytes.Equal(ReadBytes(t, d, gdq), first) {
				t.Errorf("%v: the backward's bits differ between two calls", c)
			}
		}
	}

	testWindowAsLongAsSeq(t, d, s, dt, r)

	// A position past its column is an error on the stream.
	c := attnCase{B: 1, T: 4, H: 1, KV: 1, D: 2}
	gq, gout := upload(t, d, s, randVals(r, c.B*c.T*c.width(), 1), dt), alloc(t, d, c.T*c.D, dt)
	gpos, glse := upload(t, d, s, []float64{0, 1, 3, 0}, gpu.I32), alloc(t, d, c.T, gpu.F32)
	ops.AttentionForward(s, gq, gout, glse, gpos, c.B, c.T, c.H, c.KV, c.D, gpu.AttnOptions{})
	if err := s.Synchronize(); err == nil {
		t.Error("attention with position 3 at column 2: no error on the stream")
	}
}

// testWindowAsLongAsSeq: a sliding window as long as the sequence, or
// longer, is the full causal attention: out, lse and dqkv have the bits
// of the call without a window.
func testWindowAsLongAsSeq(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType, r *rand.Rand) {
	ops := d.Ops()
	c := attnCase{B: 2, T: 45, H: 4, KV: 2, D: 16, pos: packedPositions(r, 2, 45, 40)}
	gq := upload(t, d, s, stored(randVals(r, c.B*c.T*c.width(), 2), dt), dt)
	gdo := upload(t, d, s, stored(randVals(r, c.B*c.T*c.H*c.D, 1), dt), dt)
	gpos := upload(t, d, s, intVals(c.pos), gpu.I32)
	var first [][]byte
	for _, w := range []int{0, c.T, 1000} {
		opt := gpu.AttnOptions{Window: w}
		gout, glse := alloc(t, d, c.B*c.T*c.H*c.D, dt), alloc(t, d, c.B*c.H*c.T, gpu.F32)
		gdq := alloc(t, d, c.B*c.T*c.width(), dt)
		ops.AttentionForward(s, gq, gout, glse, gpos, c.B, c.T, c.H, c.KV, c.D, opt)
		ops.AttentionBackward(s, gdo, gq, gout, glse, gpos, gdq, c.B, c.T, c.H, c.KV, c.D, opt)
		got := [][]byte{ReadBytes(t, d, gout), ReadBytes(t, d, glse), ReadBytes(t, d, gdq)}
		if first == nil {
			first = got
			continue
		}
		for i, what := range []string{"out", "lse", "dqkv"} {
			if !bytes.Equal(got[i], first[i]) {
				t.Errorf("%v: window %d: %s differs from the full attention's bits", c, w, what)
			}
		}
	}
}

// gradMag is the gradient checks' magnitude: max|ref| + |ref| per element.
func gradMag(ref []float64) []float64 {
	var mx float64
	for _, v := range ref {
		mx = math.Max(mx, math.Abs(v))
	}
	mag := make([]float64, len(ref))
	for i, v := range ref {
		mag[i] = mx + math.Abs(v)
	}
	return mag
}

// gradAttention checks AttentionBackward after AttentionForward against
// central differences of the float64 forward, on small cases (every
// element of qkv is perturbed): across a tile boundary, with grouped
// heads and with packed examples; with a sliding window (of 7 and of 1),
// a soft cap that bends the scores (cap 0.8 against scores of about 1),
// and window, cap and scale together.
//
// Tolerance: fp32 storage as every gradient check (1e-4 of the largest
// gradient). bf16 storage: the backward reads out as stored, and
// D_i = dout_i·out_i then carries bf16's 2^-9 relative rounding of out,
// which moves dS by up to P·2^-9·|dout||out|·scale — an error of order
// 2^-8 of the largest gradient, so the bound is 4·2^-8 of it (a wrong
// formula is off by O(1)).
func gradAttention(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(33)
	cases := []attnCase{
		{B: 2, T: 5, H: 2, KV: 1, D: 4},
		{B: 1, T: 67, H: 2, KV: 1, D: 2},
		{B: 2, T: 70, H: 4, KV: 2, D: 2, pos: packedPositions(r, 2, 70, 30)},
		{B: 2, T: 40, H: 4, KV: 2, D: 4, pos: packedPositions(r, 2, 40, 30), opt: gpu.AttnOptions{Window: 7}},
		{B: 1, T: 20, H: 2, KV: 1, D: 4, opt: gpu.AttnOptions{Window: 1}},
		{B: 2, T: 20, H: 4, KV: 1, D: 4, pos: packedPositions(r, 2, 20, 15), opt: gpu.AttnOptions{SoftCap: 0.8}},
		{B: 1, T: 24, H: 2, KV: 1, D: 4, pos: packedPositions(r, 1, 24, 20), opt: gpu.AttnOptions{Window: 5, SoftCap: 1.5, Scale: 0.9}},
	}
	ops := d.Ops()
	for _, c := range cases {
		qkv := stored(randVals(r, c.B*c.T*c.width(), 1.5), dt)
		w := stored(randVals(r, c.B*c.T*c.H*c.D, 1), dt)
		gq, gw := upload(t, d, s, qkv, dt), upload(t, d, s, w, dt)
		var gpos gpu.Buffer
		if c.pos != nil {
			gpos = upload(t, d, s, intVals(c.pos), gpu.I32)
		}
		gout, glse := alloc(t, d, c.B*c.T*c.H*c.D, dt), alloc(t, d, c.B*c.H*c.T, gpu.F32)
		gdq := upload(t, d, s, constVals(len(qkv), math.NaN()), dt)
		ops.AttentionForward(s, gq, gout, glse, gpos, c.B, c.T, c.H, c.KV, c.D, c.opt)
		ops.AttentionBackward(s, gw, gq, gout, glse, gpos, gdq, c.B, c.T, c.H, c.KV, c.D, c.opt)
		fd := fdGrad(func(v []float64) float64 {
			out, _, _, _, _ := attentionRef(v, c)
			return dotVals(w, out)
		}, qkv)
		got := download(t, d, s, gdq)
		if dt == gpu.F32 {
			checkGrad(t, c.String()+" dqkv", got, fd, nil, dt)
		} else {
			checkClose(t, c.String()+" dqkv", got, fd, gradMag(fd), dt, 4*rtolBF16)
		}
	}
}
