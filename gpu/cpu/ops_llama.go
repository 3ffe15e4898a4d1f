package cpu

import (
	"math"

	"github.com/strata-ai/strata/gpu"
)

// The Llama family's ops: RMSNorm, rotary embeddings and SwiGLU.

// RMSNormForward: per row, the mean of squares in float64, rstd =
// 1/sqrt(ms+eps) stored as fp32, then y = (x·rstd)·gamma in fp32 with the
// stored rstd (Hugging Face's LlamaRMSNorm: normalise, then weight).
func (o *kernels) RMSNormForward(s *Stream, x, gamma, y, rstd *Buffer, rows, cols int, eps float32) {
	s.enqueue(func() error {
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		g := loadF32(gamma, 0, cols, st.get(cols))
		rv := rstd.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int, t *temps) {
			out, tmp := t.get(cols), t.get(cols)
			for r := lo; r < hi; r++ {
				xr := loadF32(x, r*cols, (r+1)*cols, tmp)
				if x.DType() != gpu.F32 {
					tmp = xr
				}
				var ss float64
				for _, v := range xr {
					ss += float64(v) * float64(v)
				}
				rf := float32(1 / math.Sqrt(ss/float64(cols)+float64(eps)))
				for c, v := range xr {
					out[c] = v * rf * g[c]
				}
				rv[r] = rf
				storeF32(y, r*cols, out)
			}
		})
		return nil
	})
}

// AddRMSNormForward is Add, then RMSNormForward of the stored sum: the
// bits of those two calls by construction.
func (o *kernels) AddRMSNormForward(s *Stream, a, b, sum, gamma, y, rstd *Buffer, rows, cols int, eps float32) {
	o.Add(s, a, b, sum, rows*cols)
	o.RMSNormForward(s, sum, gamma, y, rstd, rows, cols, eps)
}

// AddLayerNormForward is Add, then LayerNormForward of the stored sum:
// the bits of those two calls by construction.
func (o *kernels) AddLayerNormForward(s *Stream, a, b, sum, gamma, beta, y, mean, rstd *Buffer, rows, cols int, eps float32) {
	o.Add(s, a, b, sum, rows*cols)
	o.LayerNormForward(s, sum, gamma, beta, y, mean, rstd, rows, cols, eps)
}

// BiasGeluForward is BiasAdd, then GeluForward of the stored y: the bits
// of those two calls by construction.
func (o *kernels) BiasGeluForward(s *Stream, y, bias, act *Buffer, rows, cols int) {
	o.BiasAdd(s, y, bias, rows, cols)
	o.GeluForward(s, y, act, rows*cols)
}

// RMSNormBackward accumulates dx and dgamma: with xhat = x·rstd and
// g = dy·gamma, dx += (g - xhat·mean(g·xhat))·rstd, dgamma += sum_r dy·xhat;
// the row mean in float64, the column sums in gpu.ColumnBlockRows order.
func (o *kernels) RMSNormBackward(s *Stream, dy, x, gamma, rstd, dx, dgamma *Buffer, rows, cols int) {
	s.enqueue(func() error {
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		g := loadF32(gamma, 0, cols, st.get(cols))
		rv := rstd.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int, t *temps) {
			xh := t.get(cols)
			tx, td, tdx := t.get(cols), t.get(cols), t.get(cols)
			for r := lo; r < hi; r++ {
				xr := loadF32(x, r*cols, (r+1)*cols, tx)
				dr := loadF32(dy, r*cols, (r+1)*cols, td)
				tx, td = xr, dr
				var sgx float64
				for c := range cols {
					xh[c] = xr[c] * rv[r]
					sgx += float64(dr[c]*g[c]) * float64(xh[c])
				}
				mgx := float32(sgx / float64(cols))
				dxr := loadF32(dx, r*cols, (r+1)*cols, tdx)
				tdx = dxr
				for c := range cols {
					dxr[c] += (dr[c]*g[c] - xh[c]*mgx) * rv[r]
				}
				storeF32(dx, r*cols, dxr)
			}
		})
		o.d.parallel(cols, 64, func(lo, hi int, t *temps) {
			ag, pg := t.get(hi-lo), t.get(hi-lo)
			clear(ag)
			clear(pg)
			tx, td, tsum := t.get(hi-lo), t.get(hi-lo), t.get(hi-lo)
			for r := range rows {
				xr := loadF32(x, r*cols+lo, r*cols+hi, tx)
				dr := loadF32(dy, r*cols+lo, r*cols+hi, td)
				tx, td = xr, dr
				for i := range ag {
					pg[i] += dr[i] * (xr[i] * rv[r])
				}
				endBlock(r, rows, ag, pg)
			}
			addInto(dgamma, lo, ag, tsum)
		})
		return nil
	})
}

// ropeTable holds cos and sin (fp32, rounded from float64) of angle
// p·InvFreq[i], times the Rope's scale, for positions p < rows and i <
// Dims/2.
type ropeTable struct {
	r        gpu.Rope
	half     int
	cos, sin []float32
}

// newRopeTable fills a table of rows positions in memory from tmp.
func newRopeTable(rows int, r gpu.Rope, tmp *temps) ropeTable {
	half := r.Dims / 2
	t := ropeTable{r: r, half: half, cos: tmp.get(rows * half), sin: tmp.get(rows * half)}
	for p := range rows {
		t.fill(p, t.cos[p*half:(p+1)*half], t.sin[p*half:(p+1)*half])
	}
	return t
}

func (t ropeTable) fill(p int, cos, sin []float32) {
	sc := float64(t.r.Scale)
	for i, f := range t.r.InvFreq {
		sn, cs := math.Sincos(float64(p) * float64(f))
		cos[i], sin[i] = float32(cs*sc), float32(sn*sc)
	}
}

// rope rotates the first r.Dims values of the query and key heads of
// packed qkv rows in place: forward (x1, x2) -> (x1·c - x2·s, x2·c +
// x1·s); transposed (the backward) (d1, d2) -> (d1·c + d2·s, d2·c - d1·s).
// Each token runs on one worker. Positions in [0, seq) come from one
// table; any other (a caller's position past its rows, as in generation)
// is computed for its token.
func (o *kernels) rope(s *Stream, qkv, pos *Buffer, batch, seq, heads, kvHeads, hd int, r gpu.Rope, inverse bool) {
	s.enqueue(func() error {
		var pv []int32
		if pos != nil {
			pv = pos.i32()
		}
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		tab := newRopeTable(seq, r, st)
		half, width, rotated := r.Dims/2, (heads+2*kvHeads)*hd, (heads+kvHeads)*hd
		o.d.parallel(batch*seq, max(1, 4096/max(1, width)), func(lo, hi int, t *temps) {
			tmp := t.get(rotated)
			cosOwn, sinOwn := t.get(half), t.get(half)
			for bt := lo; bt < hi; bt++ {
				p := bt % seq
				if pv != nil {
					p = int(pv[bt])
				}
				cos, sin := cosOwn, sinOwn
				if p >= 0 && p < seq {
					cos, sin = tab.cos[p*half:(p+1)*half], tab.sin[p*half:(p+1)*half]
				} else {
					tab.fill(p, cos, sin)
				}
				row := loadF32(qkv, bt*width, bt*width+rotated, tmp)
				if qkv.DType() != gpu.F32 {
					tmp = row
				}
				for h := 0; h < rotated; h += hd {
					x1, x2 := row[h:h+half], row[h+half:h+2*half]
					for i := range half {
						a, b, c, sn := x1[i], x2[i], cos[i], sin[i]
						if inverse {
							sn = -sn
						}
						x1[i], x2[i] = a*c-b*sn, b*c+a*sn
					}
				}
				storeF32(qkv, bt*width, row)
			}
		})
		return nil
	})
}

// RopeForward rotates q and k of qkv in place (rope).
func (o *kernels) RopeForward(s *Stream, qkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, r gpu.Rope) {
	o.rope(s, qkv, pos, batch, seq, heads, kvHeads, headDim, r, false)
}

// RopeBackward applies the transposed rotation to q and k of dqkv in
// place (rope).
func (o *kernels) RopeBackward(s *Stream, dqkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, r gpu.Rope) {
	o.rope(s, dqkv, pos, batch, seq, heads, kvHeads, headDim, r, true)
}

// sigmoid64 is 1/(1+exp(-x)) in float64.
func sigmoid64(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// glu64 is act(g) and act'(g) in float64.
func glu64(act gpu.GLUAct, g float64) (float64, float64) {
	if act == gpu.GeluTanh {
		u := geluScale * (g + 0.044715*g*g*g)
		th := math.Tanh(u)
		return 0.5 * g * (1 + th), 0.5*(1+th) + 0.5*g*(1-th*th)*geluScale*(1+3*0.044715*g*g)
	}
	sig := sigmoid64(g)
	return g * sig, sig * (1 + g*(1-sig))
}

// GLUForward: y = act(gate)·up, the activation and the product in
// float64, rounded once.
func (o *kernels) GLUForward(s *Stream, gateUp, y *Buffer, rows, ffn int, act gpu.GLUAct) {
	s.enqueue(func() error {
		o.d.parallel(rows, max(1, chunkElems/max(1, 2*ffn)), func(lo, hi int, t *temps) {
			out, tmp := t.get(ffn), t.get(2*ffn)
			for r := lo; r < hi; r++ {
				gu := loadF32(gateUp, r*2*ffn, (r+1)*2*ffn, tmp)
				if gateUp.DType() != gpu.F32 {
					tmp = gu
				}
				for c := range ffn {
					a, _ := glu64(act, float64(gu[c]))
					out[c] = float32(a * float64(gu[ffn+c]))
				}
				storeF32(y, r*ffn, out)
			}
		})
		return nil
	})
}

// GLUBackward: d gate = dy·up·act'(gate) and d up = dy·act(gate), in
// float64, rounded once (silu' = sig·(1 + gate·(1-sig))).
func (o *kernels) GLUBackward(s *Stream, gateUp, dy, dgateUp *Buffer, rows, ffn int, act gpu.GLUAct) {
	s.enqueue(func() error {
		o.d.parallel(rows, max(1, chunkElems/max(1, 2*ffn)), func(lo, hi int, t *temps) {
			out, tg, td := t.get(2*ffn), t.get(2*ffn), t.get(ffn)
			for r := lo; r < hi; r++ {
				gu := loadF32(gateUp, r*2*ffn, (r+1)*2*ffn, tg)
				d := loadF32(dy, r*ffn, (r+1)*ffn, td)
				if gateUp.DType() != gpu.F32 {
					tg = gu
				}
				if dy.DType() != gpu.F32 {
					td = d
				}
				for c := range ffn {
					u, dv := float64(gu[ffn+c]), float64(d[c])
					a, da := glu64(act, float64(gu[c]))
					out[c] = float32(dv * u * da)
					out[ffn+c] = float32(dv * a)
				}
				storeF32(dgateUp, r*2*ffn, out)
			}
		})
		return nil
	})
}
