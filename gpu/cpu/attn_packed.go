package cpu

// The attention's products on the packed kernel (sgemmKernel6x32) without
// gemmPacked's per-call packing. A head's keys, values, queries and output
// gradients are packed once per head, in the layouts their products read,
// and every tile product reads its operand straight from those panels; only
// the tile's own probabilities (P, dS) are packed per product. The kernel
// runs each 6×32 piece over the whole k (at most attnTile or headDim) in
// one call, FMAs in k order, and the piece goes straight into the
// destination: c = alpha·piece (beta 0) or c + alpha·piece (beta 1). The
// order is fixed, so the bits do not depend on the worker count; they
// differ from gemmPacked's (k blocks of packedKC) only where k > packedKC.
//
// Layouts (zero past the last row or column, so every piece is whole):
//
//	A panels (op(A) m×k): panel ip = k×6, a[ip·6k + p·6 + ii] = op(A)[ip·6+ii, p]
//	B panels (op(B) k×n): panel jp at jp·stride, b[jp·stride + p·32 + jj] = op(B)[p, jp·32+jj]
//
// A B operand packed with k = all of a head's rows (stride rows·32) serves
// any consecutive range of those rows as k: its panels start r0·32 later.

// attnPanelsA is the length of op(A)'s A panels, m×k.
func attnPanelsA(m, k int) int { return (m + packedMR - 1) / packedMR * packedMR * k }

// attnPanelsB is the length of op(B)'s B panels, k×n.
func attnPanelsB(k, n int) int { return (n + packedNR - 1) / packedNR * packedNR * k }

// packAN packs op(A) = src (rows×cols, row-major; m = rows, k = cols).
func packAN(dst, src []float32, rows, cols int) []float32 {
	dst = grow(dst, attnPanelsA(rows, cols))
	if rows%packedMR != 0 {
		clear(dst[rows/packedMR*packedMR*cols:])
	}
	for i := range rows {
		base := i/packedMR*packedMR*cols + i%packedMR
		for p, v := range src[i*cols : (i+1)*cols] {
			dst[base+p*packedMR] = v
		}
	}
	return dst
}

// packAT packs op(A) = srcᵀ (src rows×cols; m = cols, k = rows).
func packAT(dst, src []float32, rows, cols int) []float32 {
	dst = grow(dst, attnPanelsA(cols, rows))
	if cols%packedMR != 0 {
		clear(dst[cols/packedMR*packedMR*rows:])
	}
	for p := range rows {
		row := src[p*cols : (p+1)*cols]
		for ip := 0; ip*packedMR < cols; ip++ {
			d := dst[ip*packedMR*rows+p*packedMR:][:packedMR]
			copy(d, row[ip*packedMR:min(cols, (ip+1)*packedMR)])
		}
	}
	return dst
}

// packBN packs op(B) = src (rows×cols; k = rows, n = cols), stride rows·32.
func packBN(dst, src []float32, rows, cols int) []float32 {
	dst = grow(dst, attnPanelsB(rows, cols))
	if cols%packedNR != 0 {
		clear(dst[cols/packedNR*packedNR*rows:])
	}
	for p := range rows {
		row := src[p*cols : (p+1)*cols]
		for jp := 0; jp*packedNR < cols; jp++ {
			copy(dst[jp*packedNR*rows+p*packedNR:][:packedNR], row[jp*packedNR:min(cols, (jp+1)*packedNR)])
		}
	}
	return dst
}

// packBT packs op(B) = srcᵀ (src rows×cols; k = cols, n = rows), stride
// cols·32.
func packBT(dst, src []float32, rows, cols int) []float32 {
	dst = grow(dst, attnPanelsB(cols, rows))
	if rows%packedNR != 0 {
		clear(dst[rows/packedNR*packedNR*cols:])
	}
	for j := range rows {
		base := j/packedNR*packedNR*cols + j%packedNR
		for p, v := range src[j*cols : (j+1)*cols] {
			dst[base+p*packedNR] = v
		}
	}
	return dst
}

// mulPanels computes c (m×n, row stride ldc) = alpha·op(A)·op(B) (beta 0)
// or c + alpha·op(A)·op(B) (beta 1) from A panels a (m×k) and B panels b
// (k×n, panel stride bStride).
func mulPanels(m, n, k int, alpha float32, a, b []float32, bStride int, beta float32, c []float32, ldc int) {
	if beta != 0 && beta != 1 {
		panic("gpu/cpu: mulPanels: beta must be 0 or 1")
	}
	var piece [packedMR * packedNR]float32
	for jp := 0; jp*packedNR < n; jp++ {
		cols := min(packedNR, n-jp*packedNR)
		bp := b[jp*bStride:][:k*packedNR]
		for ip := 0; ip*packedMR < m; ip++ {
			rows := min(packedMR, m-ip*packedMR)
			if k > 0 {
				ap := a[ip*packedMR*k:][:k*packedMR]
				sgemmKernel6x32(k, &ap[0], &bp[0], &piece[0])
			}
			for i := range rows {
				dst := c[(ip*packedMR+i)*ldc+jp*packedNR:][:cols]
				src := piece[i*packedNR:][:cols]
				switch {
				case beta == 0 && alpha == 1:
					copy(dst, src)
				case beta == 0:
					for j, v := range src {
						dst[j] = alpha * v
					}
				case alpha == 1:
					for j, v := range src {
						dst[j] += v
					}
				default:
					for j, v := range src {
						dst[j] += alpha * v
					}
				}
			}
		}
	}
}

// attnMul is one tile product c = alpha·op(a)·op(b) + beta·c (beta 0 or
// 1; c row-major m×n): without the packed kernel o.sgemm of the row-major
// a and b; with it mulPanels from the A panels pa (nil: a packed here into
// w.pa) and the B panels pb of stride bStride.
func (o *kernels) attnMul(w *attnWork, transA, transB bool, m, n, k int, alpha float32, a, b []float32, beta float32, c []float32, pa, pb []float32, bStride int) {
	if !w.packed {
		o.sgemm(transA, transB, m, n, k, alpha, a, b, beta, c)
		return
	}
	if pa == nil {
		if transA {
			w.pa = packAT(w.pa, a, k, m)
		} else {
			w.pa = packAN(w.pa, a, m, k)
		}
		pa = w.pa
	}
	mulPanels(m, n, k, alpha, pa, pb, bStride, beta, c, n)
}

// from is s[off:], or nil for nil s (the panels of the gonum path).
func from(s []float32, off int) []float32 {
	if s == nil {
		return nil
	}
	return s[off:]
}

// packTiles packs src (rows×hd) as A panels one tile of attnTile rows at a
// time, tile t at t·attnPanelsA(attnTile, hd).
func packTiles(dst, src []float32, rows, hd int) []float32 {
	tile := attnPanelsA(attnTile, hd)
	dst = grow(dst, (rows+attnTile-1)/attnTile*tile)
	for r0 := 0; r0 < rows; r0 += attnTile {
		packAN(dst[r0/attnTile*tile:r0/attnTile*tile], src[r0*hd:min(rows, r0+attnTile)*hd], min(attnTile, rows-r0), hd)
	}
	return dst
}
