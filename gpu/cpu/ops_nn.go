package cpu

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
)

// LayerNormForward: per row, mean and variance (float64 sums, biased
// variance), rstd = 1/sqrt(var+eps) stored as fp32, then
// y = (x-mean)*rstd*gamma + beta in fp32 with the stored mean and rstd.
func (o *kernels) LayerNormForward(s *Stream, x, gamma, beta, y, mean, rstd *Buffer, rows, cols int, eps float32) {
	s.enqueue(func() error {
		g, b := loadF32(gamma, 0, cols, nil), loadF32(beta, 0, cols, nil)
		mv, rv := mean.f32(), rstd.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int) {
			out := make([]float32, cols)
			var tmp []float32
			for r := lo; r < hi; r++ {
				xr := loadF32(x, r*cols, (r+1)*cols, tmp)
				tmp = xr
				var sum float64
				for _, v := range xr {
					sum += float64(v)
				}
				m := sum / float64(cols)
				var ss float64
				for _, v := range xr {
					d := float64(v) - m
					ss += d * d
				}
				mf, rf := float32(m), float32(1/math.Sqrt(ss/float64(cols)+float64(eps)))
				for c, v := range xr {
					out[c] = (v-mf)*rf*g[c] + b[c]
				}
				mv[r], rv[r] = mf, rf
				storeF32(y, r*cols, out)
			}
		})
		return nil
	})
}

// LayerNormBackward accumulates dx, dgamma and dbeta (llm.c's formulas):
// with xhat = (x-mean)*rstd and g = dy*gamma,
// dx += (g - mean(g) - xhat*mean(g*xhat)) * rstd, dgamma += sum_r dy*xhat,
// dbeta += sum_r dy; the column sums run in row order.
func (o *kernels) LayerNormBackward(s *Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta *Buffer, rows, cols int) {
	s.enqueue(func() error {
		g := loadF32(gamma, 0, cols, nil)
		mv, rv := mean.f32(), rstd.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int) {
			gh := make([]float32, cols)
			xh := make([]float32, cols)
			var tx, td, tdx []float32
			for r := lo; r < hi; r++ {
				xr := loadF32(x, r*cols, (r+1)*cols, tx)
				dr := loadF32(dy, r*cols, (r+1)*cols, td)
				tx, td = xr, dr
				var sg, sgx float64
				for c := range cols {
					xh[c] = (xr[c] - mv[r]) * rv[r]
					gh[c] = dr[c] * g[c]
					sg += float64(gh[c])
					sgx += float64(gh[c]) * float64(xh[c])
				}
				mg, mgx := float32(sg/float64(cols)), float32(sgx/float64(cols))
				dxr := loadF32(dx, r*cols, (r+1)*cols, tdx)
				tdx = dxr
				for c := range cols {
					dxr[c] += (gh[c] - mg - xh[c]*mgx) * rv[r]
				}
				storeF32(dx, r*cols, dxr)
			}
		})
		o.d.parallel(cols, 64, func(lo, hi int) {
			ag, ab := make([]float32, hi-lo), make([]float32, hi-lo)
			var tx, td []float32
			for r := range rows {
				xr := loadF32(x, r*cols+lo, r*cols+hi, tx)
				dr := loadF32(dy, r*cols+lo, r*cols+hi, td)
				tx, td = xr, dr
				for i := range ag {
					ag[i] += dr[i] * ((xr[i] - mv[r]) * rv[r])
					ab[i] += dr[i]
				}
			}
			addInto(dgamma, lo, ag)
			addInto(dbeta, lo, ab)
		})
		return nil
	})
}

// attnBlock is the number of query rows processed together: the scores of
// rows [r0, r0+attnBlock) against keys [0, r1) are one GEMM, so the causal
// mask wastes at most one block's triangle.
const attnBlock = 64

// AttentionForward: causal softmax(q·k/sqrt(headDim))·v per (batch, head),
// llm.c layout: qkv[b,t,:] = [q heads | k heads | v heads]. att receives the
// probabilities, with zeros above the diagonal. Each (batch, head) runs on
// one worker; per block of query rows, the scores and the output are GEMMs
// (the device's kernel, serial), the softmax is row by row in float64.
func (o *kernels) AttentionForward(s *Stream, qkv, out, att *Buffer, batch, seq, heads, headDim int) {
	C := heads * headDim
	s.enqueue(func() error {
		scale := float32(1 / math.Sqrt(float64(headDim)))
		av := att.f32()
		hd := headDim
		o.d.parallel(batch*heads, 1, func(lo, hi int) {
			ah := newAttnHead(seq, hd)
			sc := make([]float32, min(attnBlock, seq)*seq)
			ob := make([]float32, min(attnBlock, seq)*hd)
			for bh := lo; bh < hi; bh++ {
				b, h := bh/heads, bh%heads
				ah.gather(qkv, b, h, heads)
				for r0 := 0; r0 < seq; r0 += attnBlock {
					r1 := min(seq, r0+attnBlock)
					rb := r1 - r0
					p := sc[:rb*r1]
					o.sgemm(false, true, rb, r1, hd, scale, ah.q[r0*hd:r1*hd], ah.k[:r1*hd], 0, p)
					for i := range rb {
						t := r0 + i
						row := p[i*r1 : (i+1)*r1]
						softmaxCausal(row[:t+1])
						clear(row[t+1:])
						a := av[(bh*seq+t)*seq : (bh*seq+t+1)*seq]
						copy(a, row)
						clear(a[r1:])
					}
					o.sgemm(false, false, rb, hd, r1, 1, p, ah.v[:r1*hd], 0, ob[:rb*hd])
					for i := range rb {
						storeF32(out, (b*seq+r0+i)*C+h*hd, ob[i*hd:(i+1)*hd])
					}
				}
			}
		})
		return nil
	})
}

// softmaxCausal replaces the scores of one row (the keys a query may see)
// by their softmax: max-subtracted, exponentials and their sum in float64.
func softmaxCausal(row []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range row {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range row {
		e := math.Exp(float64(v - mx))
		row[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for i := range row {
		row[i] *= inv
	}
}

// AttentionBackward writes dqkv from dout, qkv and att. Per block of query
// rows (P = att rows, S = scaled scores):
//
//	dP = dO·Vᵀ, dV += Pᵀ·dO, dS = P ⊙ (dP - rowsum(P ⊙ dP)) * scale,
//	dQ = dS·K, dK += dSᵀ·Q
//
// with the blocks in order, so dK and dV are summed in a fixed order.
func (o *kernels) AttentionBackward(s *Stream, dout, qkv, att, dqkv *Buffer, batch, seq, heads, headDim int) {
	C := heads * headDim
	s.enqueue(func() error {
		scale := float32(1 / math.Sqrt(float64(headDim)))
		av := att.f32()
		hd := headDim
		o.d.parallel(batch*heads, 1, func(lo, hi int) {
			ah := newAttnHead(seq, hd)
			dq, dk, dv := make([]float32, seq*hd), make([]float32, seq*hd), make([]float32, seq*hd)
			nb := min(attnBlock, seq)
			pb, dpb, dob := make([]float32, nb*seq), make([]float32, nb*seq), make([]float32, nb*hd)
			var tmp []float32
			for bh := lo; bh < hi; bh++ {
				b, h := bh/heads, bh%heads
				ah.gather(qkv, b, h, heads)
				clear(dk)
				clear(dv)
				for r0 := 0; r0 < seq; r0 += attnBlock {
					r1 := min(seq, r0+attnBlock)
					rb := r1 - r0
					p, dp, do := pb[:rb*r1], dpb[:rb*r1], dob[:rb*hd]
					for i := range rb {
						t := r0 + i
						copy(p[i*r1:(i+1)*r1], av[(bh*seq+t)*seq:])
						row := loadF32(dout, (b*seq+t)*C+h*hd, (b*seq+t)*C+(h+1)*hd, tmp)
						if dout.DType() != gpu.F32 {
							tmp = row
						}
						copy(do[i*hd:], row)
					}
					o.sgemm(false, true, rb, r1, hd, 1, do, ah.v[:r1*hd], 0, dp)
					o.sgemm(true, false, r1, hd, rb, 1, p, do, 1, dv[:r1*hd])
					for i := range rb {
						pr, dr := p[i*r1:(i+1)*r1], dp[i*r1:(i+1)*r1]
						var sum float64
						for j, v := range pr {
							sum += float64(v) * float64(dr[j])
						}
						sf := float32(sum)
						for j, v := range pr {
							dr[j] = v * (dr[j] - sf) * scale
						}
					}
					o.sgemm(false, false, rb, hd, r1, 1, dp, ah.k[:r1*hd], 0, dq[r0*hd:r1*hd])
					o.sgemm(true, false, r1, hd, rb, 1, dp, ah.q[r0*hd:r1*hd], 1, dk[:r1*hd])
				}
				for t := range seq {
					base := (b*seq+t)*3*C + h*hd
					storeF32(dqkv, base, dq[t*hd:(t+1)*hd])
					storeF32(dqkv, base+C, dk[t*hd:(t+1)*hd])
					storeF32(dqkv, base+2*C, dv[t*hd:(t+1)*hd])
				}
			}
		})
		return nil
	})
}

// attnHead holds one (batch, head)'s q, k and v as contiguous fp32 rows.
type attnHead struct {
	seq, hd int
	q, k, v []float32
	tmp     []float32
}

func newAttnHead(seq, hd int) *attnHead {
	return &attnHead{seq: seq, hd: hd, q: make([]float32, seq*hd), k: make([]float32, seq*hd), v: make([]float32, seq*hd)}
}

func (a *attnHead) gather(qkv *Buffer, b, h, heads int) {
	C := heads * a.hd
	for t := range a.seq {
		base := (b*a.seq+t)*3*C + h*a.hd
		for i, dst := range [][]float32{a.q, a.k, a.v} {
			src := loadF32(qkv, base+i*C, base+i*C+a.hd, a.tmp)
			copy(dst[t*a.hd:(t+1)*a.hd], src)
			if qkv.DType() != gpu.F32 {
				a.tmp = src
			}
		}
	}
}

func axpyF(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// CrossEntropyForward: losses[r] = log(sum exp(l - max)) + max - l[target],
// the sum in float64. A target outside [0, vocab) is an error on the stream
// and leaves losses unchanged.
func (o *kernels) CrossEntropyForward(s *Stream, logits, targets, losses *Buffer, rows, vocab int) {
	s.enqueue(func() error {
		if err := checkIDs("cross-entropy: target", targets.i32(), vocab); err != nil {
			return err
		}
		tv := targets.i32()
		res := make([]float32, rows)
		o.d.parallel(rows, 1, func(lo, hi int) {
			var tmp []float32
			for r := lo; r < hi; r++ {
				l := loadF32(logits, r*vocab, (r+1)*vocab, tmp)
				tmp = l
				mx, sum := softmaxStats(l)
				res[r] = float32(math.Log(sum) + float64(mx) - float64(l[tv[r]]))
			}
		})
		storeF32(losses, 0, res)
		return nil
	})
}

func softmaxStats(l []float32) (float32, float64) {
	mx := float32(math.Inf(-1))
	for _, v := range l {
		mx = max(mx, v)
	}
	var sum float64
	for _, v := range l {
		sum += math.Exp(float64(v - mx))
	}
	return mx, sum
}

// CrossEntropyBackward: dlogits = (softmax(logits) - onehot(target)) * scale.
// dlogits may be the logits buffer itself (in place).
func (o *kernels) CrossEntropyBackward(s *Stream, logits, targets, dlogits *Buffer, rows, vocab int, scale float32) {
	s.enqueue(func() error {
		if err := checkIDs("cross-entropy: target", targets.i32(), vocab); err != nil {
			return err
		}
		tv := targets.i32()
		o.d.parallel(rows, 1, func(lo, hi int) {
			var tmp []float32
			for r := lo; r < hi; r++ {
				l := loadF32(logits, r*vocab, (r+1)*vocab, tmp)
				if logits.DType() != gpu.F32 {
					tmp = l
				}
				mx, sum := softmaxStats(l)
				var out []float32
				if dlogits.DType() == gpu.F32 {
					out = dlogits.f32()[r*vocab : (r+1)*vocab]
				} else {
					out = make([]float32, vocab)
				}
				for c, v := range l {
					p := float32(math.Exp(float64(v-mx)) / sum)
					if c == int(tv[r]) {
						p--
					}
					out[c] = p * scale
				}
				storeF32(dlogits, r*vocab, out)
			}
		})
		return nil
	})
}

func checkIDs(what string, ids []int32, limit int) error {
	for i, id := range ids {
		if id < 0 || int(id) >= limit {
			return fmt.Errorf("gpu/cpu: %s %d at position %d outside [0, %d)", what, id, i, limit)
		}
	}
	return nil
}

// EmbeddingForward: out[b,t,:] = wte[ids[b,t],:] + wpe[t,:]. An id outside
// the vocabulary is an error on the stream and leaves out unchanged.
func (o *kernels) EmbeddingForward(s *Stream, ids, wte, wpe, out *Buffer, batch, seq, dim int) {
	s.enqueue(func() error {
		vocab := wte.Len() / max(1, dim)
		if err := checkIDs("embedding: id", ids.i32(), vocab); err != nil {
			return err
		}
		iv := ids.i32()
		o.d.parallel(batch*seq, max(1, 4096/max(1, dim)), func(lo, hi int) {
			res := make([]float32, dim)
			var t1, t2 []float32
			for bt := lo; bt < hi; bt++ {
				t, id := bt%seq, int(iv[bt])
				e := loadF32(wte, id*dim, (id+1)*dim, t1)
				p := loadF32(wpe, t*dim, (t+1)*dim, t2)
				if wte.DType() != gpu.F32 {
					t1 = e
				}
				if wpe.DType() != gpu.F32 {
					t2 = p
				}
				for c := range res {
					res[c] = e[c] + p[c]
				}
				storeF32(out, bt*dim, res)
			}
		})
		return nil
	})
}

// EmbeddingBackward accumulates dwte[ids[b,t],:] += dout[b,t,:] and
// dwpe[t,:] += dout[b,t,:]. Each touched row is summed in fp32 in the order
// b, then t, starting from its old value, and rounded once on store.
func (o *kernels) EmbeddingBackward(s *Stream, ids, dout, dwte, dwpe *Buffer, batch, seq, dim int) {
	s.enqueue(func() error {
		vocab := dwte.Len() / max(1, dim)
		if err := checkIDs("embedding: id", ids.i32(), vocab); err != nil {
			return err
		}
		iv := ids.i32()
		// slot[i] is the row of acc that accumulates id iv[i].
		slotOf := map[int32]int{}
		slot := make([]int, len(iv))
		var order []int32
		for i, id := range iv {
			sl, ok := slotOf[id]
			if !ok {
				sl = len(order)
				slotOf[id] = sl
				order = append(order, id)
			}
			slot[i] = sl
		}
		o.d.parallel(dim, 64, func(lo, hi int) {
			w := hi - lo
			acc := make([]float32, len(order)*w)
			for sl, id := range order {
				copy(acc[sl*w:], loadF32(dwte, int(id)*dim+lo, int(id)*dim+hi, nil))
			}
			pacc := make([]float32, seq*w)
			for t := range seq {
				copy(pacc[t*w:], loadF32(dwpe, t*dim+lo, t*dim+hi, nil))
			}
			var tmp []float32
			for bt := range batch * seq {
				d := loadF32(dout, bt*dim+lo, bt*dim+hi, tmp)
				if dout.DType() != gpu.F32 {
					tmp = d
				}
				axpyF(1, d, acc[slot[bt]*w:(slot[bt]+1)*w])
				t := bt % seq
				axpyF(1, d, pacc[t*w:(t+1)*w])
			}
			for sl, id := range order {
				storeF32(dwte, int(id)*dim+lo, acc[sl*w:(sl+1)*w])
			}
			for t := range seq {
				storeF32(dwpe, t*dim+lo, pacc[t*w:(t+1)*w])
			}
		})
		return nil
	})
}
