package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/gpu"
)

// Ops are the kernels of one Device: NVRTC-compiled CUDA C (kernels.cu)
// and cuBLAS for GEMM. Each method checks its contract, then enqueues on
// the stream and returns; a failed enqueue is reported by the stream's
// next Synchronize.
type Ops struct{ d *Device }

func (o *Ops) stream(s gpu.Stream) *Stream { return o.d.stream(s) }

func (o *Ops) float(gb gpu.Buffer, what string, n int) *Buffer {
	b := o.d.buf(gb, what)
	if b.dt != gpu.F32 && b.dt != gpu.BF16 {
		panic(fmt.Sprintf("gpu/cuda: %s is %s, want f32 or bf16", what, b.dt))
	}
	if b.n != n {
		panic(fmt.Sprintf("gpu/cuda: %s has %d elements, want %d", what, b.n, n))
	}
	return b
}

func (o *Ops) typed(gb gpu.Buffer, what string, dt gpu.DType, n int) *Buffer {
	b := o.d.buf(gb, what)
	if b.dt != dt || b.n != n {
		panic(fmt.Sprintf("gpu/cuda: %s is %d×%s, want %d×%s", what, b.n, b.dt, n, dt))
	}
	return b
}

func nonNeg(op string, dims ...int) {
	for _, v := range dims {
		if v < 0 {
			panic(fmt.Sprintf("gpu/cuda: %s: negative dimension in %v", op, dims))
		}
	}
}

func dt(b *Buffer) int32 { return int32(b.dt) }

// scratch takes n bytes from the GPU's stream-ordered pool, outside the
// budget, and returns them with free (also stream-ordered). Called with
// the context current.
func (s *Stream) scratch(n int64) (uint64, func(), error) {
	drv := s.dev.g.l.drv
	var p uint64
	if err := drv.check(drv.cuMemAllocAsync(&p, uint64(max(n, 1)), s.h), "cuMemAllocAsync %d bytes of scratch", n); err != nil {
		return 0, nil, err
	}
	return p, func() { drv.cuMemFreeAsync(p, s.h) }, nil
}

// BiasAdd: y[r,c] += bias[c].
func (o *Ops) BiasAdd(gs gpu.Stream, gy, gbias gpu.Buffer, rows, cols int) {
	nonNeg("bias-add", rows, cols)
	s, y, bias := o.stream(gs), o.float(gy, "bias-add y", rows*cols), o.float(gbias, "bias-add bias", cols)
	s.launchN("bias_add", int64(rows*cols), y.p(), dt(y), bias.p(), dt(bias), int64(rows), int64(cols))
}

// BiasGrad: dbias[c] += sum_r dy[r,c], summed in row order in fp32.
func (o *Ops) BiasGrad(gs gpu.Stream, gdy, gdbias gpu.Buffer, rows, cols int) {
	nonNeg("bias-grad", rows, cols)
	s, dy, db := o.stream(gs), o.float(gdy, "bias-grad dy", rows*cols), o.float(gdbias, "bias-grad dbias", cols)
	s.launchN("bias_grad", int64(cols), dy.p(), dt(dy), db.p(), dt(db), int64(rows), int64(cols))
}

// GeluForward: y = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), in double.
func (o *Ops) GeluForward(gs gpu.Stream, gx, gy gpu.Buffer, n int) {
	nonNeg("gelu", n)
	s, x, y := o.stream(gs), o.float(gx, "gelu x", n), o.float(gy, "gelu y", n)
	s.launchN("gelu_fwd", int64(n), x.p(), dt(x), y.p(), dt(y), int64(n))
}

// GeluBackward: dx = dy * gelu'(x).
func (o *Ops) GeluBackward(gs gpu.Stream, gx, gdy, gdx gpu.Buffer, n int) {
	nonNeg("gelu-backward", n)
	s, x, dy, dx := o.stream(gs), o.float(gx, "gelu x", n), o.float(gdy, "gelu dy", n), o.float(gdx, "gelu dx", n)
	s.launchN("gelu_bwd", int64(n), x.p(), dt(x), dy.p(), dt(dy), dx.p(), dt(dx), int64(n))
}

// Add: out = a + b; out may alias a or b.
func (o *Ops) Add(gs gpu.Stream, ga, gb, gout gpu.Buffer, n int) {
	nonNeg("add", n)
	s, a, b, out := o.stream(gs), o.float(ga, "add a", n), o.float(gb, "add b", n), o.float(gout, "add out", n)
	s.launchN("add", int64(n), a.p(), dt(a), b.p(), dt(b), out.p(), dt(out), int64(n))
}

// Cast: dst = src converted, as gpu/cpu converts (bf16: nearest even; f64
// to bf16 through f32; floats to i32 truncate). Same dtypes copy.
func (o *Ops) Cast(gs gpu.Stream, gdst, gsrc gpu.Buffer) {
	s, dst, src := o.stream(gs), o.d.buf(gdst, "cast dst"), o.d.buf(gsrc, "cast src")
	if dst.n != src.n {
		panic(fmt.Sprintf("gpu/cuda: cast: dst has %d elements, src %d", dst.n, src.n))
	}
	if dst.dt == src.dt {
		if dst.n == 0 {
			return
		}
		drv := o.d.g.l.drv
		s.run(func() error {
			return drv.check(drv.cuMemcpyAsync(dst.Ptr(), src.Ptr(), uint64(dst.Bytes()), s.h), "cuMemcpyAsync (cast)")
		})
		return
	}
	s.launchN("cast", int64(dst.n), dst.p(), dt(dst), src.p(), dt(src), int64(dst.n))
}

// Fill writes value into every element of x (any dtype).
func (o *Ops) Fill(gs gpu.Stream, gx gpu.Buffer, value float32) {
	s, x := o.stream(gs), o.d.buf(gx, "fill x")
	s.launchN("fill", int64(x.n), x.p(), dt(x), value, int64(x.n))
}

// Scale: x *= alpha (f64 buffers in float64).
func (o *Ops) Scale(gs gpu.Stream, gx gpu.Buffer, alpha float32) {
	s, x := o.stream(gs), o.d.buf(gx, "scale x")
	if x.dt == gpu.I32 {
		panic("gpu/cuda: scale of an i32 buffer")
	}
	s.launchN("scale", int64(x.n), x.p(), dt(x), alpha, int64(x.n))
}

// Axpy: y += alpha*x (fp32; float64 when both are f64).
func (o *Ops) Axpy(gs gpu.Stream, alpha float32, gx, gy gpu.Buffer) {
	s, x, y := o.stream(gs), o.d.buf(gx, "axpy x"), o.d.buf(gy, "axpy y")
	if x.n != y.n || x.dt == gpu.I32 || y.dt == gpu.I32 {
		panic(fmt.Sprintf("gpu/cuda: axpy: x %d×%s, y %d×%s", x.n, x.dt, y.n, y.dt))
	}
	s.launchN("axpy", int64(x.n), alpha, x.p(), dt(x), y.p(), dt(y), int64(x.n))
}

// sumSquaresBlocks is SS_BLOCKS of kernels.cu.
const sumSquaresBlocks = 256

// SumSquares: out[index] = sum x[i]^2 in float64, in a fixed two-pass
// order (256 strided partial sums, each reduced by a fixed tree, then the
// partials by a fixed tree), so the result is reproducible; it differs
// from gpu/cpu's sequential sum only by float64 rounding.
func (o *Ops) SumSquares(gs gpu.Stream, gx, gout gpu.Buffer, index int) {
	s, x, out := o.stream(gs), o.d.buf(gx, "sum-squares x"), o.d.buf(gout, "sum-squares out")
	if out.dt != gpu.F64 || index < 0 || index >= out.n {
		panic(fmt.Sprintf("gpu/cuda: sum-squares: out %d×%s, index %d", out.n, out.dt, index))
	}
	g := o.d.g
	s.run(func() error {
		partial, free, err := s.scratch(sumSquaresBlocks * 8)
		if err != nil {
			return err
		}
		defer free()
		if err := g.launch(s.h, "sumsq_partial", sumSquaresBlocks, 256, 0, x.p(), dt(x), int64(x.n), devPtr(partial)); err != nil {
			return err
		}
		return g.launch(s.h, "sumsq_final", 1, 256, 0, devPtr(partial), devPtr(out.Ptr()+uint64(index)*8))
	})
}

// AdamStep runs cpuadam's update on the device, operation for operation
// (the scalars computed in float64 and rounded to fp32 as cpuadam does,
// FMAs where it fuses), so the bits equal cpuadam's. Hyper-parameters
// cpuadam rejects are an error on the stream.
func (o *Ops) AdamStep(gs gpu.Stream, gparam, ggrad, gm, gv, gout gpu.Buffer, p gpu.AdamParams) {
	s := o.stream(gs)
	n := o.d.buf(gparam, "adam param").n
	param := o.typed(gparam, "adam param", gpu.F32, n)
	grad := o.float(ggrad, "adam grad", n)
	m := o.typed(gm, "adam m", gpu.F32, n)
	v := o.typed(gv, "adam v", gpu.F32, n)
	var out devPtr
	if gout != nil {
		out = o.typed(gout, "adam out", gpu.BF16, n).p()
	}
	cp := cpuadam.Params{LR: p.LR, Beta1: p.Beta1, Beta2: p.Beta2, Eps: p.Eps, WeightDecay: p.WeightDecay,
		Step: p.Step, GradScale: p.GradScale, Mode: cpuadam.AdamW}
	if p.L2 {
		cp.Mode = cpuadam.AdamL2
	}
	if err := cp.Validate(); err != nil {
		s.fail(fmt.Errorf("gpu/cuda: adam step: %w", err))
		return
	}
	k := adamScalars(p)
	s.launchN("adam_step", int64(n), param.p(), grad.p(), dt(grad), m.p(), v.p(), out, int64(n),
		k.gs, k.b1, k.omb1, k.b2, k.omb2, k.negStep, k.invSqrtBC2, k.eps, k.decay, k.l2, k.useL2)
}

type adamConsts struct {
	gs, b1, omb1, b2, omb2, negStep, invSqrtBC2, eps, decay, l2 float32
	useL2                                                       int32
}

// adamScalars computes the per-step scalars as cpuadam's makeConsts does:
// in float64, each rounded once to float32.
func adamScalars(p gpu.AdamParams) adamConsts {
	bc1 := 1 - math.Pow(p.Beta1, float64(p.Step))
	bc2 := 1 - math.Pow(p.Beta2, float64(p.Step))
	k := adamConsts{gs: float32(p.GradScale), b1: float32(p.Beta1), omb1: float32(1 - p.Beta1), b2: float32(p.Beta2),
		omb2: float32(1 - p.Beta2), negStep: float32(-p.LR / bc1), invSqrtBC2: float32(1 / math.Sqrt(bc2)),
		eps: float32(p.Eps), decay: 1}
	if p.L2 {
		k.l2, k.useL2 = float32(p.WeightDecay), 1
	} else {
		k.decay = float32(1 - p.LR*p.WeightDecay)
	}
	return k
}

// cuBLAS data types of the storage types.
func blasType(d gpu.DType) int32 {
	if d == gpu.BF16 {
		return cudaR16BF
	}
	return cudaR32F
}

// Gemm computes C = alpha*op(A)*op(B) + beta*C through cublasGemmEx with
// fp32 compute. cuBLAS is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ
// on the row-major buffers read as their transposes. A and B both bf16, or
// all three f32, go to cuBLAS directly; other mixes widen the bf16
// operands to f32 scratch (exactly), run the fp32 GEMM into an f32 C and
// round C once to bf16.
func (o *Ops) Gemm(gs gpu.Stream, transA, transB bool, m, n, k int, alpha float32, ga, gb gpu.Buffer, beta float32, gc gpu.Buffer) {
	nonNeg("gemm", m, n, k)
	if m > math.MaxInt32 || n > math.MaxInt32 || k > math.MaxInt32 {
		panic(fmt.Sprintf("gpu/cuda: gemm %d×%d×%d: dimensions past 2^31", m, n, k))
	}
	s := o.stream(gs)
	a, b, c := o.float(ga, "gemm a", m*k), o.float(gb, "gemm b", k*n), o.float(gc, "gemm c", m*n)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 { // C = beta*C without reading A and B (beta = 0: zeros, even over NaN)
		if beta == 0 {
			s.launchN("fill", int64(c.n), c.p(), dt(c), float32(0), int64(c.n))
		} else {
			s.launchN("scale", int64(c.n), c.p(), dt(c), beta, int64(c.n))
		}
		return
	}
	s.run(func() error { return o.gemm(s, transA, transB, m, n, k, alpha, a, b, beta, c) })
}

func (o *Ops) gemm(s *Stream, transA, transB bool, m, n, k int, alpha float32, a, b *Buffer, beta float32, c *Buffer) error {
	g := o.d.g
	aPtr, bPtr, cPtr := a.Ptr(), b.Ptr(), c.Ptr()
	aT, bT, cT := blasType(a.dt), blasType(b.dt), blasType(c.dt)
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
	native := (a.dt == gpu.BF16 && b.dt == gpu.BF16) || (a.dt == gpu.F32 && b.dt == gpu.F32 && c.dt == gpu.F32)
	narrowC := false
	if !native {
		var err error
		if a.dt == gpu.BF16 {
			if aPtr, err = widen(a, m*k, true); err != nil {
				return err
			}
			aT = cudaR32F
		}
		if b.dt == gpu.BF16 {
			if bPtr, err = widen(b, k*n, true); err != nil {
				return err
			}
			bT = cudaR32F
		}
		if c.dt == gpu.BF16 {
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
