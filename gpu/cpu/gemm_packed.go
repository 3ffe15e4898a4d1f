package cpu

import (
	"github.com/strata-ai/strata/gpu"
)

// The packed GEMM (AVX-512). C is cut into fixed packedMC×packedNC tiles,
// spread over the workers; each tile walks k in blocks of packedKC: it
// packs the block of op(A) into 6-row panels and the block of op(B) into
// 32-column panels (widening bf16 and resolving the transposes while
// packing), and the kernel computes each 6×32 piece over the k block with
// FMAs in k order. The tile of C is kept in fp32 (beta*C first, then
// + alpha*piece per k block, in block order) and stored once, rounded to
// C's dtype. The blocking is fixed, so results are bit-reproducible and do
// not depend on the worker count; they differ from the gonum path (fused
// multiply-adds, k blocks) by normal fp32 rounding.
const (
	packedMR = 6
	packedNR = 32
)

// The blocking; variables only so that tests can shrink them to cross
// every boundary with small matrices.
var (
	packedKC = 256
	packedMC = 64 * packedMR // 384
	packedNC = 16 * packedNR // 512
)

type packedScratch struct {
	a, b, c, row []float32
	piece        [packedMR * packedNR]float32
}

// gemmPacked runs the tiles on the device's workers when par is set, else
// on the calling goroutine.
func (o *kernels) gemmPacked(par bool, transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer) {
	tm, tn := (m+packedMC-1)/packedMC, (n+packedNC-1)/packedNC
	run := func(lo, hi int, _ *temps) {
		sc := o.d.packs.get()
		mc := min(packedMC, (m+packedMR-1)/packedMR*packedMR)
		nc := min(packedNC, (n+packedNR-1)/packedNR*packedNR)
		kc := min(packedKC, k)
		bufs := &o.d.bufs
		sc.a, sc.b, sc.c = bufs.get(mc * kc)[:mc*kc], bufs.get(kc * nc)[:kc*nc], bufs.get(mc * nc)[:mc*nc]
		sc.row = bufs.get(max(mc, nc, kc))
		for t := lo; t < hi; t++ {
			i0, j0 := t/tn*packedMC, t%tn*packedNC
			packedTile(sc, transA, transB, m, n, k, alpha, a, b, beta, c, i0, j0, min(packedMC, m-i0), min(packedNC, n-j0))
		}
		for _, b := range [...][]float32{sc.a, sc.b, sc.c, sc.row} {
			bufs.put(b)
		}
		sc.a, sc.b, sc.c, sc.row = nil, nil, nil, nil
		o.d.packs.put(sc)
	}
	if par {
		o.d.parallel(tm*tn, 1, run)
	} else {
		run(0, tm*tn, nil)
	}
}

func packedTile(sc *packedScratch, transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer, i0, j0, mb, nb int) {
	ct := sc.c[:mb*nb]
	if beta == 0 {
		clear(ct)
	} else {
		for i := range mb {
			row := loadF32(c, (i0+i)*n+j0, (i0+i)*n+j0+nb, sc.row)
			if c.DType() != gpu.F32 {
				sc.row = row
			}
			for j, v := range row {
				ct[i*nb+j] = beta * v
			}
		}
	}
	pm, pn := (mb+packedMR-1)/packedMR, (nb+packedNR-1)/packedNR
	for p0 := 0; p0 < k; p0 += packedKC {
		kb := min(packedKC, k-p0)
		packA(sc, a, transA, m, k, i0, mb, p0, kb)
		packB(sc, b, transB, n, k, j0, nb, p0, kb)
		for jp := range pn {
			for ip := range pm {
				sgemmKernel6x32(kb, &sc.a[ip*kb*packedMR], &sc.b[jp*kb*packedNR], &sc.piece[0])
				rows, cols := min(packedMR, mb-ip*packedMR), min(packedNR, nb-jp*packedNR)
				for i := range rows {
					dst := ct[(ip*packedMR+i)*nb+jp*packedNR:][:cols]
					src := sc.piece[i*packedNR:][:cols]
					for j, v := range src {
						dst[j] += alpha * v
					}
				}
			}
		}
	}
	for i := range mb {
		storeF32(c, (i0+i)*n+j0, ct[i*nb:(i+1)*nb])
	}
}

// packA writes rows [i0, i0+mb) × columns [p0, p0+kb) of op(A) as 6-row
// panels: sc.a[(ip*kb + p)*6 + ii] = op(A)[i0 + ip*6 + ii, p0 + p], zero
// past mb.
func packA(sc *packedScratch, a *Buffer, trans bool, m, k, i0, mb, p0, kb int) {
	pm := (mb + packedMR - 1) / packedMR
	ap := sc.a[:pm*kb*packedMR]
	if mb%packedMR != 0 {
		clear(ap[(pm-1)*kb*packedMR:])
	}
	if !trans { // A is m×k
		for i := range mb {
			row := loadF32(a, (i0+i)*k+p0, (i0+i)*k+p0+kb, sc.row)
			if a.DType() != gpu.F32 {
				sc.row = row
			}
			base, ii := i/packedMR*kb*packedMR, i%packedMR
			for p, v := range row {
				ap[base+p*packedMR+ii] = v
			}
		}
		return
	}
	for p := range kb { // A is k×m
		row := loadF32(a, (p0+p)*m+i0, (p0+p)*m+i0+mb, sc.row)
		if a.DType() != gpu.F32 {
			sc.row = row
		}
		for i, v := range row {
			ap[(i/packedMR*kb+p)*packedMR+i%packedMR] = v
		}
	}
}

// packB writes rows [p0, p0+kb) × columns [j0, j0+nb) of op(B) as 32-column
// panels: sc.b[(jp*kb + p)*32 + jj] = op(B)[p0 + p, j0 + jp*32 + jj], zero
// past nb.
func packB(sc *packedScratch, b *Buffer, trans bool, n, k, j0, nb, p0, kb int) {
	pn := (nb + packedNR - 1) / packedNR
	bp := sc.b[:pn*kb*packedNR]
	if nb%packedNR != 0 {
		clear(bp[(pn-1)*kb*packedNR:])
	}
	if !trans { // B is k×n
		for p := range kb {
			row := loadF32(b, (p0+p)*n+j0, (p0+p)*n+j0+nb, sc.row)
			if b.DType() != gpu.F32 {
				sc.row = row
			}
			for jp := range pn {
				w := min(packedNR, nb-jp*packedNR)
				copy(bp[(jp*kb+p)*packedNR:][:w], row[jp*packedNR:jp*packedNR+w])
			}
		}
		return
	}
	for j := range nb { // B is n×k
		row := loadF32(b, (j0+j)*k+p0, (j0+j)*k+p0+kb, sc.row)
		if b.DType() != gpu.F32 {
			sc.row = row
		}
		base, jj := j/packedNR*kb*packedNR, j%packedNR
		for p, v := range row {
			bp[base+p*packedNR+jj] = v
		}
	}
}
