package cpu

import (
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// GEMM tiles. C is cut into gemmTileM×gemmTileN tiles, whatever the worker
// count; each tile is one call of gonum's Sgemm over the whole k, which
// gonum runs serially (the tile is below its parallel threshold of 4
// 64×64 blocks) and which adds the k products of each element of C in
// index order. The tiles are spread over the device's workers, so the
// result does not depend on the worker count and is bit-reproducible.
// bf16 operands are widened to fp32 one panel at a time (gemmTileM rows of
// op(A), gemmTileN columns of op(B)); a bf16 C is accumulated in an fp32
// tile and rounded once.
const (
	gemmTileM = 64
	gemmTileN = 128
)

var blasImpl gonum.Implementation

// Gemm computes C = alpha*op(A)*op(B) + beta*C.
func (o *kernels) Gemm(s *Stream, transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer) {
	s.enqueue(func() error {
		o.gemm(transA, transB, m, n, k, alpha, a, b, beta, c)
		return nil
	})
}

func (o *kernels) gemm(transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		o.elementwise(m*n, func(lo, hi int, t *temps) {
			v := loadF32(c, lo, hi, t.get(hi-lo))
			for i := range v {
				if beta == 0 {
					v[i] = 0
				} else {
					v[i] *= beta
				}
			}
			storeF32(c, lo, v)
		})
		return
	}
	if o.d.packed {
		o.gemmPacked(true, transA, transB, m, n, k, alpha, a, b, beta, c)
		return
	}
	tm, tn := (m+gemmTileM-1)/gemmTileM, (n+gemmTileN-1)/gemmTileN
	tA, tB := blas.NoTrans, blas.NoTrans
	if transA {
		tA = blas.Trans
	}
	if transB {
		tB = blas.Trans
	}
	o.d.parallel(tm*tn, 1, func(lo, hi int, t *temps) {
		var pa, pb, pc []float32 // bf16 and f16 operands' widened panels, C's fp32 tile
		if a.DType() != gpu.F32 {
			pa = t.get(gemmTileM * k)
		}
		if b.DType() != gpu.F32 {
			pb = t.get(gemmTileN * k)
		}
		if c.DType() != gpu.F32 {
			pc = t.get(gemmTileM * gemmTileN)
		}
		lastI, lastJ := -1, -1
		var av, bv []float32
		var lda, ldb int
		for t := lo; t < hi; t++ {
			i0, j0 := t/tn*gemmTileM, t%tn*gemmTileN
			mb, nb := min(gemmTileM, m-i0), min(gemmTileN, n-j0)
			if i0 != lastI {
				av, lda, pa = panelA(a, transA, m, k, i0, mb, pa)
				lastI = i0
			}
			if j0 != lastJ {
				bv, ldb, pb = panelB(b, transB, n, k, j0, nb, pb)
				lastJ = j0
			}
			var cv []float32
			ldc := n
			if c.DType() == gpu.F32 {
				cv = c.f32()[i0*n+j0 : (i0+mb-1)*n+j0+nb]
			} else {
				ldc = nb
				if cap(pc) < mb*nb {
					pc = make([]float32, gemmTileM*gemmTileN)
				}
				cv = pc[:mb*nb]
				if beta != 0 {
					u := c.u16()
					for i := range mb {
						dtype.Widen(c.DType(), cv[i*nb:(i+1)*nb], u[(i0+i)*n+j0:(i0+i)*n+j0+nb])
					}
				}
			}
			blasImpl.Sgemm(tA, tB, mb, nb, k, alpha, av, lda, bv, ldb, beta, cv, ldc)
			if c.DType() != gpu.F32 {
				u := c.u16()
				for i := range mb {
					dtype.Narrow(c.DType(), u[(i0+i)*n+j0:(i0+i)*n+j0+nb], cv[i*nb:(i+1)*nb])
				}
			}
		}
	})
}

// panelA returns rows [i0, i0+mb) of op(A) in the layout Sgemm expects for
// transA, with its leading dimension: a view for F32, a widened copy in
// tmp for BF16 and F16.
func panelA(a *Buffer, trans bool, m, k, i0, mb int, tmp []float32) ([]float32, int, []float32) {
	if !trans { // A is m×k: rows i0.. are contiguous
		if a.DType() == gpu.F32 {
			return a.f32()[i0*k : (i0+mb)*k], k, tmp
		}
		tmp = grow(tmp, mb*k)
		dtype.Widen(a.DType(), tmp, a.u16()[i0*k:(i0+mb)*k])
		return tmp, k, tmp
	}
	// A is k×m: columns i0.. of every row.
	if a.DType() == gpu.F32 {
		return a.f32()[i0 : (k-1)*m+i0+mb], m, tmp
	}
	tmp = grow(tmp, k*mb)
	u := a.u16()
	for l := range k {
		dtype.Widen(a.DType(), tmp[l*mb:(l+1)*mb], u[l*m+i0:l*m+i0+mb])
	}
	return tmp, mb, tmp
}

// panelB returns columns [j0, j0+nb) of op(B) in the layout Sgemm expects.
func panelB(b *Buffer, trans bool, n, k, j0, nb int, tmp []float32) ([]float32, int, []float32) {
	if trans { // B is n×k: rows j0.. are contiguous
		if b.DType() == gpu.F32 {
			return b.f32()[j0*k : (j0+nb)*k], k, tmp
		}
		tmp = grow(tmp, nb*k)
		dtype.Widen(b.DType(), tmp, b.u16()[j0*k:(j0+nb)*k])
		return tmp, k, tmp
	}
	// B is k×n: columns j0.. of every row.
	if b.DType() == gpu.F32 {
		return b.f32()[j0 : (k-1)*n+j0+nb], n, tmp
	}
	tmp = grow(tmp, k*nb)
	u := b.u16()
	for l := range k {
		dtype.Widen(b.DType(), tmp[l*nb:(l+1)*nb], u[l*n+j0:l*n+j0+nb])
	}
	return tmp, nb, tmp
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// sgemm computes c (m×n) = alpha*op(a)*op(b) + beta*c on dense fp32 slices
// on the calling goroutine, with the device's kernel (kernels inside other
// parallel ops use it).
func (o *kernels) sgemm(transA, transB bool, m, n, k int, alpha float32, a, b []float32, beta float32, c []float32) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 || !o.d.packed {
		tA, tB := blas.NoTrans, blas.NoTrans
		lda, ldb := k, n
		if transA {
			tA, lda = blas.Trans, m
		}
		if transB {
			tB, ldb = blas.Trans, k
		}
		if k == 0 || alpha == 0 {
			for i := range c[:m*n] {
				if beta == 0 {
					c[i] = 0
				} else {
					c[i] *= beta
				}
			}
			return
		}
		blasImpl.Sgemm(tA, tB, m, n, k, alpha, a, max(1, lda), b, max(1, ldb), beta, c, max(1, n))
		return
	}
	o.gemmPacked(false, transA, transB, m, n, k, alpha, sliceBuffer(a[:m*k]), sliceBuffer(b[:k*n]), beta, sliceBuffer(c[:m*n]))
}

// sliceBuffer wraps host fp32 memory as a Buffer for the kernels.
func sliceBuffer(s []float32) *Buffer {
	var mem []byte
	if len(s) > 0 {
		mem = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
	}
	return &Buffer{Extent: gpu.Scratch(gpu.F32, len(s)), a: &allocation{mem: mem}}
}
