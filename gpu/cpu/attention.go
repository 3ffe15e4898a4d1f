package cpu

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
)

// attnTile is the side of the attention tiles: attnTile query rows meet
// attnTile keys at a time, so the scores of a tile are one attnTile×attnTile
// GEMM and nothing of size seq×seq is ever held. 128 rather than 64: when
// each tile's GEMMs packed their operands afresh, the packing at 64 cost
// more than the multiplications (a Mistral-style block over 4,096 tokens,
// heads of 128: 8 % less CPU time a token at 128, 14 % with a window of
// 4,096). On the packed kernel the products now read a head's keys,
// values, queries and output gradients from panels packed once per head
// (attn_packed.go); only P and dS are packed per product. A multiple of
// 32 (packedNR): a key tile starts on a panel of those.
const attnTile = 128

// attnGeom is the shape of one attention call: qkv rows of
// (heads+2·kvHeads)·hd values, query head h reading key/value head h/rep.
type attnGeom struct {
	batch, seq, heads, kvHeads, hd, rep int
	scale                               float32
	pos                                 []int32 // nil: pos[b,t] = t
	window                              int     // 0: none; else query i sees keys j > i+shift-window
	shift                               int     // the keys start shift tokens before the queries (AttentionCached)
	softCap                             float32 // 0: none
}

func newAttnGeom(batch, seq, heads, kvHeads, hd int, pos *Buffer, opt gpu.AttnOptions) (attnGeom, error) {
	g := attnGeom{batch: batch, seq: seq, heads: heads, kvHeads: kvHeads, hd: hd,
		scale: opt.ScaleFor(hd), window: opt.Window, softCap: opt.SoftCap}
	if kvHeads > 0 {
		g.rep = heads / kvHeads
	}
	if pos != nil {
		g.pos = pos.i32()
		for i, p := range g.pos {
			if t := i % seq; p < 0 || int(p) > t {
				return g, fmt.Errorf("gpu/cpu: attention: position %d of row %d, column %d outside [0, %d]", p, i/seq, t, t)
			}
		}
	}
	return g, nil
}

// width is the number of values of one token's qkv row.
func (g *attnGeom) width() int { return (g.heads + 2*g.kvHeads) * g.hd }

// first is the first key the query at (b, i) attends to: the first of
// its example, or of its window.
func (g *attnGeom) first(b, i int) int {
	f := 0
	if g.pos != nil {
		f = i - int(g.pos[b*g.seq+i])
	}
	if g.window > 0 {
		f = max(f, i+g.shift-g.window+1)
	}
	return f
}

// capScores makes each score x of row[lo:hi] softCap·tanh(x/softCap)
// (float64, rounded to fp32).
func (g *attnGeom) capScores(row []float32) {
	if g.softCap <= 0 {
		return
	}
	c := float64(g.softCap)
	for j, x := range row {
		row[j] = float32(c * math.Tanh(float64(x)/c))
	}
}

// firstOfTile is the first key any query of rows [r0, r1) of row b attends to.
func (g *attnGeom) firstOfTile(b, r0, r1 int) int {
	lo := r0
	for i := r0; i < r1; i++ {
		lo = min(lo, g.first(b, i))
	}
	return lo
}

// loadHead copies head h (at value offset off within a token's row) of
// batch row b of buf, seq×hd, into dst as contiguous fp32 rows.
func loadHead(buf *Buffer, dst []float32, b, off, rowWidth, seq, hd int, tmp []float32) []float32 {
	for t := range seq {
		base := (b*seq+t)*rowWidth + off
		src := loadF32(buf, base, base+hd, tmp)
		copy(dst[t*hd:(t+1)*hd], src)
		if buf.DType() != gpu.F32 {
			tmp = src
		}
	}
	return tmp
}

// storeHead writes src (seq×hd contiguous) into head offset off of batch
// row b of buf.
func storeHead(buf *Buffer, src []float32, b, off, rowWidth, seq, hd int) {
	for t := range seq {
		storeF32(buf, (b*seq+t)*rowWidth+off, src[t*hd:(t+1)*hd])
	}
}

// AttentionForward is the flash-attention forward on fp32 tiles. Each
// (batch, head) runs on one worker: for every tile of attnTile query rows,
// the key tiles that any of its rows may see, in order; per key tile the
// scores S = Q·Kᵀ·scale are one GEMM, masked to each row's keys
// [i-pos[i], i], and the running row maximum m, running sum l (float64)
// and output accumulator O (fp32) are updated online:
//
//	m' = max(m, max_j S_ij), P_ij = exp(S_ij - m') (float64 attnExp, rounded to fp32),
//	l = l·exp(m - m') + Σ_j P_ij, O = O·exp(m - m') + P·V (one GEMM)
//
// then out = O/l and lse = m + log l.
func (o *kernels) AttentionForward(s *Stream, qkv, out, lse, pos *Buffer, batch, seq, heads, kvHeads, headDim int, opt gpu.AttnOptions) {
	s.enqueue(func() error {
		g, err := newAttnGeom(batch, seq, heads, kvHeads, headDim, pos, opt)
		if err != nil {
			return err
		}
		lv := lse.f32()
		o.d.parallel(batch*heads, 1, func(lo, hi int, _ *temps) {
			w := o.d.takeAttnWork(seq, seq, headDim, min(attnTile, seq))
			defer o.d.giveAttnWork(w)
			for bh := lo; bh < hi; bh++ {
				b, h := bh/heads, bh%heads
				kv := h / g.rep
				w.tmp = loadHead(qkv, w.q, b, h*headDim, g.width(), seq, headDim, w.tmp)
				if w.packedKV != b*kvHeads+kv {
					w.tmp = loadHead(qkv, w.k, b, (heads+kv)*headDim, g.width(), seq, headDim, w.tmp)
					w.tmp = loadHead(qkv, w.v, b, (heads+kvHeads+kv)*headDim, g.width(), seq, headDim, w.tmp)
					w.packKV(seq, b*kvHeads+kv, false)
				}
				if w.packed {
					w.qa = packTiles(w.qa, w.q, seq, headDim)
				}
				for r0 := 0; r0 < seq; r0 += attnTile {
					o.attnForwardTile(&g, w, b, r0, min(seq, r0+attnTile), 0, lv[bh*seq:(bh+1)*seq])
				}
				storeHead(out, w.o, b, h*headDim, heads*headDim, seq, headDim)
			}
		})
		return nil
	})
}

// attnWork is one piece's scratch (parallel): a head's q, k, v (and for the
// backward dout, dq, dk, dv) as seq×hd rows, and two tiles.
type attnWork struct {
	q, k, v, o     []float32
	do, dq, dk, dv []float32
	s, dp, dcap    []float32 // attnTile×attnTile; dcap: the soft cap's derivative (backward)
	m              []float32 // attnTile running maxima
	l              []float64 // attnTile running sums
	dsum           []float32 // seq: D_i = rowsum(dout ⊙ out)
	tmp            []float32
	seq, hd        int
	from           *bufs // where the buffers come from and go back to

	// The packed kernel's panels (attn_packed.go), nil on the gonum path:
	// kt, vt: B panels of Kᵀ and Vᵀ (stride hd·32, key tile c0 at c0·hd);
	// kn, vn, qn, don: B panels of K, V, Q and dO over all their rows
	// (stride rows·32, row r0 at r0·32); qa, doa: A panels of Q and dO per
	// tile of attnTile rows; pa: the tile's P or dS.
	packed           bool
	kt, vt, kn, vn   []float32
	qa, qn, doa, don []float32
	pa               []float32
	kvRows, packedKV int // rows of kn and vn; the (batch·kvHeads + kv head) packed, -1 none
}

// packKV packs w.k and w.v (rows×hd) for the forward (kt, vn) and, with
// backward, for the backward (kn, vt too); id names the head, and a head
// already packed is not packed again.
func (w *attnWork) packKV(rows, id int, backward bool) {
	if !w.packed || w.packedKV == id {
		return
	}
	hd := w.hd
	w.kvRows, w.packedKV = rows, id
	w.kt = packBT(w.kt, w.k[:rows*hd], rows, hd)
	w.vn = packBN(w.vn, w.v[:rows*hd], rows, hd)
	if backward {
		w.vt = packBT(w.vt, w.v[:rows*hd], rows, hd)
		w.kn = packBN(w.kn, w.k[:rows*hd], rows, hd)
	}
}

// takeAttnWork returns a piece's attention scratch, one of the device's
// kept ones (pool.go; given back with d.attn.put once the piece is done):
// seq query rows and kvRows key and value rows of hd values, tiles of
// tile×tile, nothing packed yet. Its buffers hold what their last use
// left: every kernel writes them before it reads them.
func (d *Device) takeAttnWork(seq, kvRows, hd, tile int) *attnWork {
	w := d.attn.get()
	w.from = &d.bufs
	w.q, w.o, w.k, w.v = w.take(seq*hd), w.take(seq*hd), w.take(kvRows*hd), w.take(kvRows*hd)
	w.s, w.dp, w.m, w.tmp = w.take(tile*tile), w.take(tile*tile), w.take(tile), w.take(hd)
	if cap(w.l) < tile {
		w.l = make([]float64, tile)
	}
	w.l = w.l[:tile]
	w.seq, w.hd, w.packed, w.packedKV = seq, hd, d.packed, -1
	if w.packed { // the panels at their sizes, so that packing finds them long enough
		w.kt, w.vn = w.take(attnPanelsB(hd, kvRows)), w.take(attnPanelsB(kvRows, hd))
		w.qa = w.take((seq + attnTile - 1) / attnTile * attnPanelsA(attnTile, hd))
		w.pa = w.take(attnPanelsA(attnTile, attnTile))
	}
	return w
}

// withBackward takes w's buffers of the backward.
func (w *attnWork) withBackward() *attnWork {
	n := w.seq * w.hd
	w.do, w.dq, w.dk, w.dv, w.dsum = w.take(n), w.take(n), w.take(n), w.take(n), w.take(w.seq)
	// The soft cap's derivative is written only for each row's keys; the
	// rest, multiplied by a zero probability, stays zero as when it was new.
	w.dcap = w.take(len(w.s))
	clear(w.dcap)
	if w.packed {
		w.vt, w.kn = w.take(attnPanelsB(w.hd, w.seq)), w.take(attnPanelsB(w.seq, w.hd))
		w.qn, w.don = w.take(attnPanelsB(w.seq, w.hd)), w.take(attnPanelsB(w.seq, w.hd))
		w.doa = w.take(len(w.qa))
	}
	return w
}

// take returns n values of a kept buffer.
func (w *attnWork) take(n int) []float32 { return w.from.get(n)[:n] }

// giveAttnWork gives w and its buffers back once its piece is done.
func (d *Device) giveAttnWork(w *attnWork) {
	for _, b := range [...]*[]float32{&w.q, &w.k, &w.v, &w.o, &w.do, &w.dq, &w.dk, &w.dv, &w.s, &w.dp, &w.dcap,
		&w.m, &w.dsum, &w.tmp, &w.kt, &w.vt, &w.kn, &w.vn, &w.qa, &w.qn, &w.doa, &w.don, &w.pa} {
		w.from.put(*b)
		*b = nil
	}
	d.attn.put(w)
}

// attnForwardTile computes query rows [r0, r1) of the head in w into w.o
// and lse. Query row i sees keys up to i+shift (shift > 0: the keys of w
// start shift tokens before the queries, AttentionCached's cache).
func (o *kernels) attnForwardTile(g *attnGeom, w *attnWork, b, r0, r1, shift int, lse []float32) {
	hd, rb := g.hd, r1-r0
	ninf := float32(math.Inf(-1))
	m, l := w.m[:rb], w.l[:rb]
	for i := range rb {
		m[i], l[i] = ninf, 0
	}
	acc := w.o[r0*hd : r1*hd]
	clear(acc)
	for c0 := g.firstOfTile(b, r0, r1) / attnTile * attnTile; c0 < r1+shift; c0 += attnTile {
		c1 := min(r1+shift, c0+attnTile)
		cb := c1 - c0
		sc := w.s[:rb*cb]
		o.attnMul(w, false, true, rb, cb, hd, g.scale, w.q[r0*hd:r1*hd], w.k[c0*hd:c1*hd], 0, sc,
			from(w.qa, r0/attnTile*attnPanelsA(attnTile, hd)), from(w.kt, c0*hd), hd*packedNR)
		for i := range rb {
			row := sc[i*cb : (i+1)*cb]
			lo, hi := max(g.first(b, r0+i), c0)-c0, min(r0+i+1+shift, c1)-c0 // the row's keys in this tile
			if lo >= hi {
				clear(row)
				continue
			}
			g.capScores(row[lo:hi])
			mt := m[i]
			for _, x := range row[lo:hi] {
				if x > mt { // not max: its NaN and ±0 handling cost a fifth of the tile's softmax; a NaN score still reaches out through its P
					mt = x
				}
			}
			alpha := float32(0)
			if m[i] != ninf {
				alpha = float32(math.Exp(float64(m[i]) - float64(mt)))
			}
			clear(row[:lo])
			clear(row[hi:])
			sum := expShift(row[lo:hi], float64(mt))
			m[i], l[i] = mt, l[i]*float64(alpha)+sum
			if alpha != 1 {
				for d := range acc[i*hd : (i+1)*hd] {
					acc[i*hd+d] *= alpha
				}
			}
		}
		o.attnMul(w, false, false, rb, hd, cb, 1, sc, w.v[c0*hd:c1*hd], 1, acc, nil, from(w.vn, c0*packedNR), w.kvRows*packedNR)
	}
	for i := range rb {
		inv := float32(1 / l[i])
		for d := range acc[i*hd : (i+1)*hd] {
			acc[i*hd+d] *= inv
		}
		lse[r0+i] = float32(float64(m[i]) + math.Log(l[i]))
	}
}

// AttentionBackward is FlashAttention-2's backward on fp32 tiles. Each
// (batch, key/value head) runs on one worker, which owns that head's dK
// and dV: for each query head of its group in order, D_i = rowsum(dO_i ⊙
// O_i) (float64), then for each key tile j and each query tile i that
// sees it (both in order) the probabilities are recomputed from lse,
//
//	P = exp(Q_i·K_jᵀ·scale - lse_i) masked, dV_j += Pᵀ·dO_i, dP = dO_i·V_jᵀ,
//	dS = P ⊙ (dP - D_i)·scale, dQ_i += dS·K_j, dK_j += dSᵀ·Q_i,
//
// each product one GEMM. Every sum runs in this fixed order, so the bits
// do not depend on the worker count or the run.
func (o *kernels) AttentionBackward(s *Stream, dout, qkv, out, lse, pos, dqkv *Buffer, batch, seq, heads, kvHeads, headDim int, opt gpu.AttnOptions) {
	s.enqueue(func() error {
		g, err := newAttnGeom(batch, seq, heads, kvHeads, headDim, pos, opt)
		if err != nil {
			return err
		}
		lv := lse.f32()
		hd, width := headDim, g.width()
		o.d.parallel(batch*kvHeads, 1, func(lo, hi int, _ *temps) {
			w := o.d.takeAttnWork(seq, seq, hd, min(attnTile, seq)).withBackward()
			defer o.d.giveAttnWork(w)
			for bk := lo; bk < hi; bk++ {
				b, kv := bk/kvHeads, bk%kvHeads
				w.tmp = loadHead(qkv, w.k, b, (heads+kv)*hd, width, seq, hd, w.tmp)
				w.tmp = loadHead(qkv, w.v, b, (heads+kvHeads+kv)*hd, width, seq, hd, w.tmp)
				w.packKV(seq, bk, true)
				clear(w.dk)
				clear(w.dv)
				for h := kv * g.rep; h < (kv+1)*g.rep; h++ {
					w.tmp = loadHead(qkv, w.q, b, h*hd, width, seq, hd, w.tmp)
					w.tmp = loadHead(dout, w.do, b, h*hd, heads*hd, seq, hd, w.tmp)
					w.tmp = loadHead(out, w.o, b, h*hd, heads*hd, seq, hd, w.tmp)
					if w.packed {
						w.qa, w.qn = packTiles(w.qa, w.q, seq, hd), packBN(w.qn, w.q, seq, hd)
						w.doa, w.don = packTiles(w.doa, w.do, seq, hd), packBN(w.don, w.do, seq, hd)
					}
					for i := range seq {
						var d float64
						for c := range hd {
							d += float64(w.do[i*hd+c]) * float64(w.o[i*hd+c])
						}
						w.dsum[i] = float32(d)
					}
					clear(w.dq)
					ls := lv[(b*heads+h)*seq : (b*heads+h+1)*seq]
					for c0 := 0; c0 < seq; c0 += attnTile {
						c1 := min(seq, c0+attnTile)
						last := seq // queries before c0 see no key of the tile, nor those at c1+window-1 or later
						if g.window > 0 {
							last = min(seq, c1+g.window-1)
						}
						for r0 := c0; r0 < last; r0 += attnTile {
							r1 := min(seq, r0+attnTile)
							if g.firstOfTile(b, r0, r1) < c1 {
								o.attnBackwardTile(&g, w, b, r0, r1, c0, c1, ls)
							}
						}
					}
					storeHead(dqkv, w.dq, b, h*hd, width, seq, hd)
				}
				storeHead(dqkv, w.dk, b, (heads+kv)*hd, width, seq, hd)
				storeHead(dqkv, w.dv, b, (heads+kvHeads+kv)*hd, width, seq, hd)
			}
		})
		return nil
	})
}

// attnBackwardTile adds the contributions of query rows [r0, r1) against
// keys [c0, c1) of the head in w to w.dq, w.dk and w.dv.
func (o *kernels) attnBackwardTile(g *attnGeom, w *attnWork, b, r0, r1, c0, c1 int, lse []float32) {
	hd, rb, cb := g.hd, r1-r0, c1-c0
	p, dp := w.s[:rb*cb], w.dp[:rb*cb]
	q, do := w.q[r0*hd:r1*hd], w.do[r0*hd:r1*hd]
	tileA := r0 / attnTile * attnPanelsA(attnTile, hd)
	o.attnMul(w, false, true, rb, cb, hd, g.scale, q, w.k[c0*hd:c1*hd], 0, p, from(w.qa, tileA), from(w.kt, c0*hd), hd*packedNR)
	for i := range rb {
		row := p[i*cb : (i+1)*cb]
		lo, hi := max(g.first(b, r0+i), c0)-c0, min(r0+i+1, c1)-c0
		if lo < hi {
			g.capScores(row[lo:hi])
		}
		lo = min(lo, cb)
		hi = max(hi, lo)   // an empty [lo, hi) clears the row
		if g.softCap > 0 { // d cap(x)/dx = 1 - (cap(x)/softCap)², kept in w.dcap
			for j, z := range row[lo:hi] {
				c := float64(z) / float64(g.softCap)
				w.dcap[i*cb+lo+j] = float32(1 - c*c)
			}
		}
		clear(row[:lo])
		clear(row[hi:])
		expShift(row[lo:hi], float64(lse[r0+i]))
	}
	o.attnMul(w, true, false, cb, hd, rb, 1, p, do, 1, w.dv[c0*hd:c1*hd], nil, from(w.don, r0*packedNR), w.seq*packedNR)
	o.attnMul(w, false, true, rb, cb, hd, 1, do, w.v[c0*hd:c1*hd], 0, dp, from(w.doa, tileA), from(w.vt, c0*hd), hd*packedNR)
	for i := range rb {
		di := w.dsum[r0+i]
		for j := range cb {
			k := i*cb + j
			ds := p[k] * (dp[k] - di)
			if g.softCap > 0 {
				ds *= w.dcap[k]
			}
			dp[k] = ds * g.scale
		}
	}
	o.attnMul(w, false, false, rb, hd, cb, 1, dp, w.k[c0*hd:c1*hd], 1, w.dq[r0*hd:r1*hd], nil, from(w.kn, c0*packedNR), w.seq*packedNR)
	o.attnMul(w, true, false, cb, hd, rb, 1, dp, q, 1, w.dk[c0*hd:c1*hd], nil, from(w.qn, r0*packedNR), w.seq*packedNR)
}
