package cpu

import (
	"github.com/strata-ai/strata/gpu"
)

// AttentionCached first copies each new token's key and value heads into
// row start+i of the caches (rounded once to the caches' dtype), then runs
// the flash-attention forward of AttentionForward (attnForwardTile) with
// the keys and values read back from the caches as stored: one work item
// per (head, tile of attnTile query rows), query row i seeing cache rows
// 0..start+i. A worker loads a head's queries, keys and values once for
// the consecutive items of that head. With start = 0 the tiles, and so
// the bits, are AttentionForward's on one row of n tokens.
func (o *kernels) AttentionCached(s *Stream, qkv, kc, vc, out *Buffer, start, n, heads, kvHeads, hd int, opt gpu.AttnOptions) {
	s.enqueue(func() error {
		width, kvw, total := (heads+2*kvHeads)*hd, kvHeads*hd, start+n
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		tmp := st.get(kvw)
		for i := range n {
			for _, c := range []struct {
				cache *Buffer
				col   int
			}{{kc, heads * hd}, {vc, (heads + kvHeads) * hd}} {
				row := loadF32(qkv, i*width+c.col, i*width+c.col+kvw, tmp)
				if qkv.DType() != gpu.F32 {
					tmp = row
				}
				storeF32(c.cache, (start+i)*kvw, row)
			}
		}
		if n == 0 || heads == 0 || hd == 0 {
			return nil
		}
		g := attnGeom{batch: 1, seq: n, heads: heads, kvHeads: kvHeads, hd: hd, rep: heads / kvHeads,
			scale: opt.ScaleFor(hd), window: opt.Window, shift: start, softCap: opt.SoftCap}
		tiles := (n + attnTile - 1) / attnTile
		o.d.parallel(heads*tiles, 1, func(lo, hi int, t *temps) {
			w := o.d.takeAttnWork(n, total, hd, attnTile)
			defer o.d.giveAttnWork(w)
			lse := t.get(n)
			loaded := -1
			for it := lo; it < hi; it++ {
				h, t := it/tiles, it%tiles
				if h != loaded {
					kv := h / g.rep
					w.tmp = loadHead(qkv, w.q, 0, h*hd, width, n, hd, w.tmp)
					w.tmp = loadHead(kc, w.k, 0, kv*hd, kvw, total, hd, w.tmp)
					w.tmp = loadHead(vc, w.v, 0, kv*hd, kvw, total, hd, w.tmp)
					w.packedKV = -1
					w.packKV(total, kv, false)
					if w.packed {
						w.qa = packTiles(w.qa, w.q, n, hd)
					}
					loaded = h
				}
				r0, r1 := t*attnTile, min(n, (t+1)*attnTile)
				o.attnForwardTile(&g, w, 0, r0, r1, start, lse)
				for r := r0; r < r1; r++ {
					storeF32(out, r*heads*hd+h*hd, w.o[r*hd:(r+1)*hd])
				}
			}
		})
		return nil
	})
}
