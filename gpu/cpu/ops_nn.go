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
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		g, b := loadF32(gamma, 0, cols, st.get(cols)), loadF32(beta, 0, cols, st.get(cols))
		mv, rv := mean.f32(), rstd.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int, t *temps) {
			out, tmp := t.get(cols), t.get(cols)
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
// dbeta += sum_r dy; the column sums in gpu.ColumnBlockRows order.
func (o *kernels) LayerNormBackward(s *Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta *Buffer, rows, cols int) {
	s.enqueue(func() error {
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		g := loadF32(gamma, 0, cols, st.get(cols))
		mv, rv := mean.f32(), rstd.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int, t *temps) {
			gh, xh := t.get(cols), t.get(cols)
			tx, td, tdx := t.get(cols), t.get(cols), t.get(cols)
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
		o.d.parallel(cols, 64, func(lo, hi int, t *temps) {
			ag, ab := t.get(hi-lo), t.get(hi-lo)
			pg, pb := t.get(hi-lo), t.get(hi-lo)
			clear(ag)
			clear(ab)
			clear(pg)
			clear(pb)
			tx, td, tsum := t.get(hi-lo), t.get(hi-lo), t.get(hi-lo)
			for r := range rows {
				xr := loadF32(x, r*cols+lo, r*cols+hi, tx)
				dr := loadF32(dy, r*cols+lo, r*cols+hi, td)
				tx, td = xr, dr
				for i := range ag {
					pg[i] += dr[i] * ((xr[i] - mv[r]) * rv[r])
					pb[i] += dr[i]
				}
				endBlock(r, rows, ag, pg)
				endBlock(r, rows, ab, pb)
			}
			addInto(dgamma, lo, ag, tsum)
			addInto(dbeta, lo, ab, tsum)
		})
		return nil
	})
}

func axpyF(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// CrossEntropyForward: losses[r] = log(sum exp(l - max)) + max - l[target],
// the sum in float64; 0 for a target < 0 (ignored). A target >= vocab is
// an error on the stream and leaves losses unchanged.
func (o *kernels) CrossEntropyForward(s *Stream, logits, targets, losses *Buffer, rows, vocab int, softCap float32) {
	s.enqueue(func() error {
		if err := checkTargets(targets.i32(), vocab); err != nil {
			return err
		}
		tv := targets.i32()
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		res := st.get(rows)
		clear(res) // an ignored row's loss is 0
		o.d.parallel(rows, 1, func(lo, hi int, t *temps) {
			tmp, capped := t.get(vocab), t.get(vocab)
			for r := lo; r < hi; r++ {
				if tv[r] < 0 {
					continue
				}
				l := loadF32(logits, r*vocab, (r+1)*vocab, tmp)
				tmp = l
				if softCap > 0 {
					capped = capLogits(capped, l, softCap)
					l = capped
				}
				mx, sum := softmaxStats(l)
				res[r] = float32(math.Log(sum) + float64(mx) - float64(l[tv[r]]))
			}
		})
		storeF32(losses, 0, res)
		return nil
	})
}

// capLogits writes softCap·tanh(x/softCap) of each x of l (float64,
// rounded to fp32) into dst's memory and returns it.
func capLogits(dst, l []float32, softCap float32) []float32 {
	dst = append(dst[:0], l...)
	c := float64(softCap)
	for i, v := range dst {
		dst[i] = float32(c * math.Tanh(float64(v)/c))
	}
	return dst
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

// CrossEntropyBackward: dlogits = (softmax(logits) - onehot(target)) * scale,
// 0 for a row whose target is < 0. dlogits may be the logits buffer itself
// (in place).
func (o *kernels) CrossEntropyBackward(s *Stream, logits, targets, dlogits *Buffer, rows, vocab int, scale, softCap float32) {
	s.enqueue(func() error {
		if err := checkTargets(targets.i32(), vocab); err != nil {
			return err
		}
		tv := targets.i32()
		o.d.parallel(rows, 1, func(lo, hi int, t *temps) {
			tmp, capped, own := t.get(vocab), t.get(vocab), t.get(vocab)
			for r := lo; r < hi; r++ {
				out := own
				if dlogits.DType() == gpu.F32 {
					out = dlogits.f32()[r*vocab : (r+1)*vocab]
				}
				if tv[r] < 0 {
					clear(out)
					storeF32(dlogits, r*vocab, out)
					continue
				}
				l := loadF32(logits, r*vocab, (r+1)*vocab, tmp)
				if logits.DType() != gpu.F32 {
					tmp = l
				}
				if softCap > 0 {
					capped = capLogits(capped, l, softCap)
					l = capped
				}
				mx, sum := softmaxStats(l)
				for c, v := range l {
					p := float32(math.Exp(float64(v-mx)) / sum)
					if c == int(tv[r]) {
						p--
					}
					if softCap > 0 {
						z := float64(v) / float64(softCap)
						p = float32(float64(p) * (1 - z*z))
					}
					out[c] = p * scale
				}
				storeF32(dlogits, r*vocab, out)
			}
		})
		return nil
	})
}

// checkTargets checks that every target is below vocab (a negative one is
// ignored).
func checkTargets(targets []int32, vocab int) error {
	for i, id := range targets {
		if int(id) >= vocab {
			return fmt.Errorf("gpu/cpu: cross-entropy: target %d at position %d outside [0, %d)", id, i, vocab)
		}
	}
	return nil
}

func checkIDs(what string, ids []int32, limit int) error {
	for i, id := range ids {
		if id < 0 || int(id) >= limit {
			return fmt.Errorf("gpu/cpu: %s %d at position %d outside [0, %d)", what, id, i, limit)
		}
	}
	return nil
}

// embeddingRows returns the ids and the position-table row of every token
// (pos, or t when pos is nil), checked against the tables: vocab rows of
// wte, posRows of wpe (0: no position table).
func embeddingRows(ids, pos *Buffer, seq, vocab, posRows int) ([]int32, []int32, error) {
	iv := ids.i32()
	if err := checkIDs("embedding: id", iv, vocab); err != nil {
		return nil, nil, err
	}
	pv := make([]int32, len(iv))
	for i := range pv {
		pv[i] = int32(i % seq)
	}
	if pos != nil {
		copy(pv, pos.i32())
		if posRows > 0 {
			if err := checkIDs("embedding: position", pv, posRows); err != nil {
				return nil, nil, err
			}
		}
	}
	return iv, pv, nil
}

// EmbeddingForward: out[b,t,:] = wte[ids[b,t],:] (+ wpe[pos[b,t],:]). An id
// or position outside its table is an error on the stream and leaves out
// unchanged.
func (o *kernels) EmbeddingForward(s *Stream, ids, pos, wte, wpe, out *Buffer, batch, seq, dim int) {
	s.enqueue(func() error {
		posRows := 0
		if wpe != nil {
			posRows = wpe.Len() / max(1, dim)
		}
		iv, pv, err := embeddingRows(ids, pos, seq, wte.Len()/max(1, dim), posRows)
		if err != nil {
			return err
		}
		o.d.parallel(batch*seq, max(1, 4096/max(1, dim)), func(lo, hi int, t *temps) {
			res, t1, t2 := t.get(dim), t.get(dim), t.get(dim)
			for bt := lo; bt < hi; bt++ {
				id := int(iv[bt])
				e := loadF32(wte, id*dim, (id+1)*dim, t1)
				if wte.DType() != gpu.F32 {
					t1 = e
				}
				copy(res, e)
				if wpe != nil {
					p := int(pv[bt])
					pe := loadF32(wpe, p*dim, (p+1)*dim, t2)
					if wpe.DType() != gpu.F32 {
						t2 = pe
					}
					for c := range res {
						res[c] += pe[c]
					}
				}
				storeF32(out, bt*dim, res)
			}
		})
		return nil
	})
}

// EmbeddingBackward accumulates dwte[ids[b,t],:] += dout[b,t,:] (and
// dwpe[pos[b,t],:] += dout[b,t,:]). Each touched row is summed in fp32 in
// the order b, then t, starting from its old value, and rounded once on
// store.
func (o *kernels) EmbeddingBackward(s *Stream, ids, pos, dout, dwte, dwpe *Buffer, batch, seq, dim int) {
	s.enqueue(func() error {
		posRows := 0
		if dwpe != nil {
			posRows = dwpe.Len() / max(1, dim)
		}
		iv, pv, err := embeddingRows(ids, pos, seq, dwte.Len()/max(1, dim), posRows)
		if err != nil {
			return err
		}
		wte, pe := o.d.slots.get(), o.d.slots.get()
		defer o.d.slots.put(wte)
		defer o.d.slots.put(pe)
		wteRows, wteSlot := wte.number(iv)
		var peRows []int32
		var peSlot []int
		if dwpe != nil {
			peRows, peSlot = pe.number(pv)
		}
		o.d.parallel(dim, 64, func(lo, hi int, t *temps) {
			w := hi - lo
			acc, pacc, tmp := t.get(len(wteRows)*w), t.get(len(peRows)*w), t.get(w)
			for sl, id := range wteRows {
				copy(acc[sl*w:], loadF32(dwte, int(id)*dim+lo, int(id)*dim+hi, tmp))
			}
			for sl, p := range peRows {
				copy(pacc[sl*w:], loadF32(dwpe, int(p)*dim+lo, int(p)*dim+hi, tmp))
			}
			for bt := range batch * seq {
				d := loadF32(dout, bt*dim+lo, bt*dim+hi, tmp)
				if dout.DType() != gpu.F32 {
					tmp = d
				}
				axpyF(1, d, acc[wteSlot[bt]*w:(wteSlot[bt]+1)*w])
				if dwpe != nil {
					axpyF(1, d, pacc[peSlot[bt]*w:(peSlot[bt]+1)*w])
				}
			}
			for sl, id := range wteRows {
				storeF32(dwte, int(id)*dim+lo, acc[sl*w:(sl+1)*w])
			}
			for sl, p := range peRows {
				storeF32(dwpe, int(p)*dim+lo, pacc[sl*w:(sl+1)*w])
			}
		})
		return nil
	})
}

// slots numbers distinct rows; a device keeps its tables (pool.go).
type slots struct {
	slotOf map[int32]int
	order  []int32
	slot   []int
}

// number numbers the distinct values of rows in order of first
// appearance: order[k] is the k-th distinct value, slot[i] the number of
// rows[i]. Both are valid until the next call.
func (s *slots) number(rows []int32) (order []int32, slot []int) {
	if s.slotOf == nil {
		s.slotOf = map[int32]int{}
	}
	clear(s.slotOf)
	s.order = s.order[:0]
	if cap(s.slot) < len(rows) {
		s.slot = make([]int, len(rows))
	}
	s.slot = s.slot[:len(rows)]
	for i, r := range rows {
		sl, ok := s.slotOf[r]
		if !ok {
			sl = len(s.order)
			s.slotOf[r] = sl
			s.order = append(s.order, r)
		}
		s.slot[i] = sl
	}
	return s.order, s.slot
}
