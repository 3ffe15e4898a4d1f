package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// kernels are the Ops of one Device, behind the front end's checks
// (gpu.CheckedOps): NVRTC-compiled CUDA C (kernels.cu) and cuBLAS for
// GEMM. Each method enqueues on the stream and returns; a failed enqueue
// is reported by the stream's next Synchronize.
type kernels struct{ d *Device }

func dt(b *Buffer) int32 { return int32(b.DType()) }

// BiasAdd: y[r,c] += bias[c].
func (o *kernels) BiasAdd(s *Stream, y, bias *Buffer, rows, cols int) {
	s.launchN("bias_add", int64(rows*cols), y.p(), dt(y), bias.p(), dt(bias), int64(rows), int64(cols))
}

// BiasGrad: dbias[c] += sum_r dy[r,c], in fp32 in gpu.ColumnBlockRows
// order: bias_grad_part's block sums in stream-ordered scratch, then
// colsum_final.
func (o *kernels) BiasGrad(s *Stream, dy, dbias *Buffer, rows, cols int) {
	g := o.d.g
	s.columnSums(rows, cols, func(parts []devPtr, grid uint32) error {
		return g.launch(s.h, "bias_grad_part", grid, 256, 0, dy.p(), dt(dy), parts[0], int64(rows), int64(cols))
	}, dbias)
}

// columnSums enqueues a column sum over rows in gpu.ColumnBlockRows order
// into each of dst: part launches the *_part kernel on grid blocks of 256
// threads, writing the block sums of dst[i] to parts[i] (stream-ordered
// scratch, nb×cols floats each), then colsum_final adds each column's
// blocks in order into dst[i] (with no rows, dst[i] + 0, as gpu/cpu).
func (s *Stream) columnSums(rows, cols int, part func(parts []devPtr, grid uint32) error, dst ...*Buffer) {
	g, nb := s.dev.g, (rows+gpu.ColumnBlockRows-1)/gpu.ColumnBlockRows
	s.run(func() error {
		if cols == 0 {
			return nil
		}
		each := int64(nb*cols) * 4
		p, free, err := s.scratch(int64(len(dst)) * each)
		if err != nil {
			return err
		}
		defer free()
		parts := make([]devPtr, len(dst))
		for i := range parts {
			parts[i] = devPtr(p + uint64(int64(i)*each))
		}
		if nb > 0 {
			if err := part(parts, g.gridFor(int64(nb*cols), 256)); err != nil {
				return err
			}
		}
		for i, d := range dst {
			if err := g.launch(s.h, "colsum_final", g.gridFor(int64(cols), 256), 256, 0, parts[i], int64(nb), int64(cols), d.p(), dt(d)); err != nil {
				return err
			}
		}
		return nil
	})
}

// GeluForward: y = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), in double.
func (o *kernels) GeluForward(s *Stream, x, y *Buffer, n int) {
	s.launchN("gelu_fwd", int64(n), x.p(), dt(x), y.p(), dt(y), int64(n))
}

// BiasGeluForward: bias_gelu, one thread per chunk of 8 columns of a row
// (16-byte vectors where aligned): y += bias rounded once, then act =
// gelu(stored y), the bits of bias_add then gelu_fwd, y crossing DRAM once
// less.
func (o *kernels) BiasGeluForward(s *Stream, y, bias, act *Buffer, rows, cols int) {
	n := int64(rows) * int64((cols+vecElems-1)/vecElems)
	s.launchN("bias_gelu", n, y.p(), dt(y), bias.p(), dt(bias), act.p(), dt(act), int64(rows), int64(cols))
}

// GeluBackward: dx = dy * gelu'(x).
func (o *kernels) GeluBackward(s *Stream, x, dy, dx *Buffer, n int) {
	s.launchN("gelu_bwd", int64(n), x.p(), dt(x), dy.p(), dt(dy), dx.p(), dt(dx), int64(n))
}

// Add: out = a + b; out may alias a or b.
func (o *kernels) Add(s *Stream, a, b, out *Buffer, n int) {
	s.launchN("add", int64(n), a.p(), dt(a), b.p(), dt(b), out.p(), dt(out), int64(n))
}

// AddColumns: dst = beta·dst + src over a block of columns (beta 0: copy).
func (o *kernels) AddColumns(s *Stream, dst, src *Buffer, rows, cols, dstLd, dstOff, srcLd, srcOff int, beta float32) {
	s.launchN("add_columns", int64(rows*cols), dst.p(), dt(dst), src.p(), dt(src), int64(rows), int64(cols),
		int64(dstLd), int64(dstOff), int64(srcLd), int64(srcOff), beta)
}

// Dropout: y = x·scale where gpu.DropoutKeep, else 0.
func (o *kernels) Dropout(s *Stream, x, y *Buffer, n int, seed uint64, offset int64, threshold uint32, scale float32) {
	s.launchN("dropout", int64(n), x.p(), dt(x), y.p(), dt(y), int64(n), int64(seed), offset, threshold, scale) // seed's bits
}

// Dequantize: dst = format's codec's decoding of src (dtype.Codecs:
// internal/nf4's, internal/absmax8's), by the kernel dequant_<codec name>
// of kernels.cu. A format with no codec fails the stream.
func (o *kernels) Dequantize(s *Stream, format gpu.DType, src, dst *Buffer, n int) {
	c, err := dtype.CodecOf(format)
	if err != nil {
		s.run(func() error { return fmt.Errorf("dequantize: %w", err) })
		return
	}
	s.launchN(dequantKernel(c), int64(n), src.p(), dst.p(), dt(dst), int64(n))
}

// dequantKernel is the kernels.cu kernel that decodes c's format.
func dequantKernel(c *dtype.Codec) string { return "dequant_" + c.Name }

// Cast: dst = src converted, as gpu/cpu converts (bf16: nearest even; f64
// to bf16 through f32; floats to i32 truncate). Same dtypes copy.
func (o *kernels) Cast(s *Stream, dst, src *Buffer) {
	if dst.DType() == src.DType() {
		if dst.Len() == 0 {
			return
		}
		drv := o.d.g.l.drv
		s.run(func() error {
			return drv.check(drv.cuMemcpyAsync(dst.Ptr(), src.Ptr(), uint64(dst.Bytes()), s.h), "cuMemcpyAsync (cast)")
		})
		return
	}
	s.launchN("cast", int64(dst.Len()), dst.p(), dt(dst), src.p(), dt(src), int64(dst.Len()))
}

// Fill writes value into every element of x (any dtype).
func (o *kernels) Fill(s *Stream, x *Buffer, value float32) {
	s.launchN("fill", int64(x.Len()), x.p(), dt(x), value, int64(x.Len()))
}

// Scale: x *= alpha (f64 buffers in float64).
func (o *kernels) Scale(s *Stream, x *Buffer, alpha float32) {
	s.launchN("scale", int64(x.Len()), x.p(), dt(x), alpha, int64(x.Len()))
}

// ScaleRows: x[r,:] *= scale[r], in fp32.
func (o *kernels) ScaleRows(s *Stream, x, scale *Buffer, rows, cols int) {
	s.launchN("scale_rows", int64(rows)*int64(cols), x.p(), dt(x), scale.p(), int64(rows), int64(cols))
}

// RowDots: out[r] = Σ_c a[r,c]·b[r,c], one thread per row summing the
// exact float64 products in column order: gpu/cpu's bits.
func (o *kernels) RowDots(s *Stream, a, b, out *Buffer, rows, cols int) {
	s.launchN("row_dots", int64(rows), a.p(), dt(a), b.p(), dt(b), out.p(), int64(rows), int64(cols))
}

// Axpy: y += alpha*x (fp32; float64 when both are f64).
func (o *kernels) Axpy(s *Stream, alpha float32, x, y *Buffer) {
	s.launchN("axpy", int64(x.Len()), alpha, x.p(), dt(x), y.p(), dt(y), int64(x.Len()))
}

// sumSquaresBlocks is SS_BLOCKS of kernels.cu.
const sumSquaresBlocks = 256

// SumSquares: out[index] = sum x[i]^2 in float64, in a fixed two-pass
// order (256 strided partial sums, each reduced by a fixed tree, then the
// partials by a fixed tree), so the result is reproducible; it differs
// from gpu/cpu's sequential sum only by float64 rounding.
func (o *kernels) SumSquares(s *Stream, x, out *Buffer, index int) {
	g := o.d.g
	s.run(func() error {
		partial, free, err := s.scratch(sumSquaresBlocks * 8)
		if err != nil {
			return err
		}
		defer free()
		if err := g.launch(s.h, "sumsq_partial", sumSquaresBlocks, 256, 0, x.p(), dt(x), int64(x.Len()), devPtr(partial)); err != nil {
			return err
		}
		return g.launch(s.h, "sumsq_final", 1, 256, 0, devPtr(partial), devPtr(out.Ptr()+uint64(index)*8))
	})
}

// AdamStep runs cpuadam's update on the device, operation for operation
// (the scalars of adam.Params.Scalars, as cpuadam takes them, FMAs where
// it fuses), so the bits equal cpuadam's. The front end has validated p.
func (o *kernels) AdamStep(s *Stream, param, grad, m, v, out *Buffer, p gpu.AdamParams) {
	var outP devPtr
	dout := int32(gpu.BF16)
	if out != nil {
		outP, dout = out.p(), dt(out)
	}
	k, useL2 := p.Scalars(), int32(0)
	if p.Mode == gpu.AdamL2 {
		useL2 = 1
	}
	s.launchN("adam_step", int64(param.Len()), param.p(), grad.p(), dt(grad), m.p(), v.p(), outP, dout, int64(param.Len()),
		k.GradScale, k.Beta1, k.OneMinusB1, k.Beta2, k.OneMinusB2, k.NegStep, k.InvSqrtBC2, k.Eps, k.Decay, k.L2, useL2)
}

// Fail records err on s: the next Synchronize returns it.
func (o *kernels) Fail(s *Stream, err error) { s.fail(err) }

// cuBLAS data types of the storage types.
func blasType(d gpu.DType) int32 {
	switch d {
	case gpu.BF16:
		return cudaR16BF
	case gpu.F16:
		return cudaR16F
	}
	return cudaR32F
}

// Gemm computes C = alpha*op(A)*op(B) + beta*C with fp32 compute: A and B
// both bf16 (or both f16) through cuBLASLt (tensor cores, fp32 accumulation; cublaslt.go)
// where it is loaded and has an algorithm for the shape, everything else
// through cublasGemmEx. cuBLAS is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ
// on the row-major buffers read as their transposes. A and B both bf16, or
// all three f32, go to cuBLAS directly; other mixes widen the bf16
// operands to f32 scratch (exactly), run the fp32 GEMM into an f32 C and
// round C once to bf16.
func (o *kernels) Gemm(s *Stream, transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer) {
	if m > math.MaxInt32 || n > math.MaxInt32 || k > math.MaxInt32 {
		panic(fmt.Sprintf("gpu/cuda: gemm %d×%d×%d: dimensions past 2^31", m, n, k))
	}
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 { // C = beta*C without reading A and B (beta = 0: zeros, even over NaN)
		if beta == 0 {
			s.launchN("fill", int64(c.Len()), c.p(), dt(c), float32(0), int64(c.Len()))
		} else {
			s.launchN("scale", int64(c.Len()), c.p(), dt(c), beta, int64(c.Len()))
		}
		return
	}
	s.run(func() error { return o.gemm(s, transA, transB, m, n, k, alpha, a, b, beta, c) })
}

func (o *kernels) gemm(s *Stream, transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer) error {
	g := o.d.g
	aPtr, bPtr, cPtr := a.Ptr(), b.Ptr(), c.Ptr()
	aT, bT, cT := blasType(a.DType()), blasType(b.DType()), blasType(c.DType())
	var frees []func()
	defer func() {
		for _, f := range frees {
			f()
		}
	}()
	widen := func(src *Buffer, count int, copyIn bool) (uint64, error) {
		p, free, err := s.scratch(int64(count) * 4)
		if err != nil {
			return 0, err
		}
		frees = append(frees, free)
		if copyIn && count > 0 {
			err = g.launch(s.h, "cast", g.gridFor(int64(count), 256), 256, 0, devPtr(p), int32(gpu.F32), src.p(), dt(src), int64(count))
		}
		return p, err
	}
	half := a.DType().Half() && b.DType() == a.DType() // bf16 or f16 operands, both the same
	if half {                                          // tensor cores through cuBLASLt (cublaslt.go), else cublasGemmEx below
		if ok, err := ltGemm(s, transA, transB, m, n, k, alpha, aPtr, aT, bPtr, bT, beta, cPtr, cT); ok || err != nil {
			return err
		}
	}
	native := half || (a.DType() == gpu.F32 && b.DType() == gpu.F32 && c.DType() == gpu.F32)
	narrowC := false
	if !native {
		var err error
		if a.DType().Half() {
			if aPtr, err = widen(a, m*k, true); err != nil {
				return err
			}
			aT = cudaR32F
		}
		if b.DType().Half() {
			if bPtr, err = widen(b, k*n, true); err != nil {
				return err
			}
			bT = cudaR32F
		}
		if c.DType().Half() {
			if cPtr, err = widen(c, m*n, beta != 0); err != nil {
				return err
			}
			cT, narrowC = cudaR32F, true
		}
	}
	opA, lda := int32(cublasOpN), int32(k)
	if transA {
		opA, lda = cublasOpT, int32(m)
	}
	opB, ldb := int32(cublasOpN), int32(n)
	if transB {
		opB, ldb = cublasOpT, int32(k)
	}
	lda, ldb = max(lda, 1), max(ldb, 1)
	al, be := alpha, beta
	g.blasMu.Lock()
	h, err := g.cublasHandle()
	if err == nil {
		err = cublasCheck(g.l.blas.cublasSetStream(h, s.h), "cublasSetStream")
	}
	if err == nil {
		err = cublasCheck(g.l.blas.cublasGemmEx(h, opB, opA, int32(n), int32(m), int32(k), unsafe.Pointer(&al),
			bPtr, bT, ldb, aPtr, aT, lda, unsafe.Pointer(&be), cPtr, cT, int32(n), cublasCompute32F, cublasGemmDefault),
			fmt.Sprintf("cublasGemmEx %d×%d×%d", m, n, k))
	}
	g.blasMu.Unlock()
	if err != nil {
		return err
	}
	if narrowC {
		return g.launch(s.h, "cast", g.gridFor(int64(m*n), 256), 256, 0, c.p(), dt(c), devPtr(cPtr), int32(gpu.F32), int64(m*n))
	}
	return nil
}
