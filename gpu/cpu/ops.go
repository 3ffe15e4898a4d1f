package cpu

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
)

// Ops are the kernels of one Device. Arithmetic is fp32; row reductions
// (layernorm statistics, softmax normalisers, sums of squares) and
// transcendental functions are evaluated in float64 and rounded to fp32.
// Every reduction runs in a fixed order that does not depend on the worker
// count, so results are bit-reproducible.
type Ops struct{ d *Device }

// chunkElems is the number of elements an elementwise op converts at a time.
const chunkElems = 1 << 14

func (o *Ops) stream(s gpu.Stream) *Stream { return o.d.stream(s) }

// float checks that gb is an F32 or BF16 buffer of this device with n elements.
func (o *Ops) float(gb gpu.Buffer, what string, n int) *Buffer {
	b := o.d.buf(gb, what)
	if b.dt != gpu.F32 && b.dt != gpu.BF16 {
		panic(fmt.Sprintf("gpu/cpu: %s is %s, want f32 or bf16", what, b.dt))
	}
	if b.n != n {
		panic(fmt.Sprintf("gpu/cpu: %s has %d elements, want %d", what, b.n, n))
	}
	return b
}

// typed checks that gb is a buffer of dt with n elements.
func (o *Ops) typed(gb gpu.Buffer, what string, dt gpu.DType, n int) *Buffer {
	b := o.d.buf(gb, what)
	if b.dt != dt || b.n != n {
		panic(fmt.Sprintf("gpu/cpu: %s is %d×%s, want %d×%s", what, b.n, b.dt, n, dt))
	}
	return b
}

func nonNeg(op string, dims ...int) {
	for _, v := range dims {
		if v < 0 {
			panic(fmt.Sprintf("gpu/cpu: %s: negative dimension in %v", op, dims))
		}
	}
}

// elementwise runs fn over [0, n) in chunks, in parallel.
func (o *Ops) elementwise(n int, fn func(lo, hi int)) {
	o.d.parallel((n+chunkElems-1)/chunkElems, 1, func(clo, chi int) {
		for c := clo; c < chi; c++ {
			fn(c*chunkElems, min(n, (c+1)*chunkElems))
		}
	})
}

// BiasAdd: y[r,c] += bias[c].
func (o *Ops) BiasAdd(gs gpu.Stream, gy, gbias gpu.Buffer, rows, cols int) {
	nonNeg("bias-add", rows, cols)
	s, y, bias := o.stream(gs), o.float(gy, "bias-add y", rows*cols), o.float(gbias, "bias-add bias", cols)
	s.enqueue(func() error {
		bv := loadF32(bias, 0, cols, nil)
		o.d.parallel(rows, max(1, chunkElems/max(1, cols)), func(lo, hi int) {
			var tmp []float32
			for r := lo; r < hi; r++ {
				yr := loadF32(y, r*cols, (r+1)*cols, tmp)
				for c, v := range bv {
					yr[c] += v
				}
				storeF32(y, r*cols, yr)
				tmp = yr
			}
		})
		return nil
	})
}

// BiasGrad: dbias[c] += sum_r dy[r,c], summed in row order in fp32.
func (o *Ops) BiasGrad(gs gpu.Stream, gdy, gdbias gpu.Buffer, rows, cols int) {
	nonNeg("bias-grad", rows, cols)
	s, dy, dbias := o.stream(gs), o.float(gdy, "bias-grad dy", rows*cols), o.float(gdbias, "bias-grad dbias", cols)
	s.enqueue(func() error {
		o.d.parallel(cols, 64, func(lo, hi int) {
			acc := make([]float32, hi-lo)
			var tmp []float32
			for r := range rows {
				row := loadF32(dy, r*cols+lo, r*cols+hi, tmp)
				for i, v := range row {
					acc[i] += v
				}
				tmp = row
			}
			addInto(dbias, lo, acc)
		})
		return nil
	})
}

// addInto writes b[off+i] += v[i], rounding once.
func addInto(b *Buffer, off int, v []float32) {
	cur := loadF32(b, off, off+len(v), nil)
	for i, x := range v {
		cur[i] += x
	}
	storeF32(b, off, cur)
}

// GeluForward: y = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
func (o *Ops) GeluForward(gs gpu.Stream, gx, gy gpu.Buffer, n int) {
	nonNeg("gelu", n)
	s, x, y := o.stream(gs), o.float(gx, "gelu x", n), o.float(gy, "gelu y", n)
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int) {
			xv := loadF32(x, lo, hi, nil)
			out := make([]float32, hi-lo)
			for i, v := range xv {
				out[i] = geluF(v)
			}
			storeF32(y, lo, out)
		})
		return nil
	})
}

const geluScale = 0.7978845608028654 // sqrt(2/pi)

func geluF(x float32) float32 {
	xf := float64(x)
	return float32(0.5 * xf * (1 + math.Tanh(geluScale*(xf+0.044715*xf*xf*xf))))
}

func geluGrad(x float32) float32 {
	xf := float64(x)
	u := geluScale * (xf + 0.044715*xf*xf*xf)
	th := math.Tanh(u)
	sech2 := 1 - th*th
	return float32(0.5*(1+th) + 0.5*xf*sech2*geluScale*(1+3*0.044715*xf*xf))
}

// GeluBackward: dx = dy * gelu'(x).
func (o *Ops) GeluBackward(gs gpu.Stream, gx, gdy, gdx gpu.Buffer, n int) {
	nonNeg("gelu-backward", n)
	s, x, dy, dx := o.stream(gs), o.float(gx, "gelu x", n), o.float(gdy, "gelu dy", n), o.float(gdx, "gelu dx", n)
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int) {
			xv := loadF32(x, lo, hi, nil)
			dv := loadF32(dy, lo, hi, nil)
			out := make([]float32, hi-lo)
			for i, v := range xv {
				out[i] = dv[i] * geluGrad(v)
			}
			storeF32(dx, lo, out)
		})
		return nil
	})
}

// Add: out = a + b; out may alias a or b.
func (o *Ops) Add(gs gpu.Stream, ga, gb, gout gpu.Buffer, n int) {
	nonNeg("add", n)
	s, a, b, out := o.stream(gs), o.float(ga, "add a", n), o.float(gb, "add b", n), o.float(gout, "add out", n)
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int) {
			av := loadF32(a, lo, hi, nil)
			bv := loadF32(b, lo, hi, nil)
			res := make([]float32, hi-lo)
			for i := range res {
				res[i] = av[i] + bv[i]
			}
			storeF32(out, lo, res)
		})
		return nil
	})
}

// Cast: dst = src converted. Conversions into bf16 round to nearest even;
// f64 to bf16 rounds to f32 first (two roundings); floats to i32 truncate.
func (o *Ops) Cast(gs gpu.Stream, gdst, gsrc gpu.Buffer) {
	s, dst, src := o.stream(gs), o.d.buf(gdst, "cast dst"), o.d.buf(gsrc, "cast src")
	if dst.n != src.n {
		panic(fmt.Sprintf("gpu/cpu: cast: dst has %d elements, src %d", dst.n, src.n))
	}
	s.enqueue(func() error {
		n := src.n
		switch {
		case dst.dt == src.dt:
			copy(dst.raw(), src.raw())
		case dst.dt == gpu.F64 && src.dt == gpu.I32:
			d, sv := dst.f64(), src.i32()
			for i, v := range sv {
				d[i] = float64(v)
			}
		case dst.dt == gpu.I32 && src.dt == gpu.F64:
			d, sv := dst.i32(), src.f64()
			for i, v := range sv {
				d[i] = int32(v)
			}
		default:
			o.elementwise(n, func(lo, hi int) {
				storeF32(dst, lo, loadF32(src, lo, hi, nil))
			})
		}
		return nil
	})
}

// Fill writes value into every element of x (any dtype).
func (o *Ops) Fill(gs gpu.Stream, gx gpu.Buffer, value float32) {
	s, x := o.stream(gs), o.d.buf(gx, "fill x")
	s.enqueue(func() error {
		switch x.dt {
		case gpu.F32:
			v := x.f32()
			for i := range v {
				v[i] = value
			}
		case gpu.BF16:
			h, v := bf16.FromFloat32(value), x.u16()
			for i := range v {
				v[i] = h
			}
		case gpu.F64:
			v := x.f64()
			for i := range v {
				v[i] = float64(value)
			}
		case gpu.I32:
			v := x.i32()
			for i := range v {
				v[i] = int32(value)
			}
		}
		return nil
	})
}

// Scale: x *= alpha (f64 buffers in float64).
func (o *Ops) Scale(gs gpu.Stream, gx gpu.Buffer, alpha float32) {
	s, x := o.stream(gs), o.d.buf(gx, "scale x")
	if x.dt == gpu.I32 {
		panic("gpu/cpu: scale of an i32 buffer")
	}
	s.enqueue(func() error {
		if x.dt == gpu.F64 {
			v := x.f64()
			for i := range v {
				v[i] *= float64(alpha)
			}
			return nil
		}
		o.elementwise(x.n, func(lo, hi int) {
			v := loadF32(x, lo, hi, nil)
			for i := range v {
				v[i] *= alpha
			}
			storeF32(x, lo, v)
		})
		return nil
	})
}

// Axpy: y += alpha*x (fp32; float64 when both are f64).
func (o *Ops) Axpy(gs gpu.Stream, alpha float32, gx, gy gpu.Buffer) {
	s, x, y := o.stream(gs), o.d.buf(gx, "axpy x"), o.d.buf(gy, "axpy y")
	if x.n != y.n || x.dt == gpu.I32 || y.dt == gpu.I32 {
		panic(fmt.Sprintf("gpu/cpu: axpy: x %d×%s, y %d×%s", x.n, x.dt, y.n, y.dt))
	}
	s.enqueue(func() error {
		if x.dt == gpu.F64 && y.dt == gpu.F64 {
			xv, yv := x.f64(), y.f64()
			for i, v := range xv {
				yv[i] += float64(alpha) * v
			}
			return nil
		}
		o.elementwise(x.n, func(lo, hi int) {
			xv := loadF32(x, lo, hi, nil)
			yv := loadF32(y, lo, hi, nil)
			for i, v := range xv {
				yv[i] += alpha * v
			}
			storeF32(y, lo, yv)
		})
		return nil
	})
}

// SumSquares: out[index] = sum x[i]^2 in float64, in index order.
func (o *Ops) SumSquares(gs gpu.Stream, gx, gout gpu.Buffer, index int) {
	s, x, out := o.stream(gs), o.d.buf(gx, "sum-squares x"), o.d.buf(gout, "sum-squares out")
	if out.dt != gpu.F64 || index < 0 || index >= out.n {
		panic(fmt.Sprintf("gpu/cpu: sum-squares: out %d×%s, index %d", out.n, out.dt, index))
	}
	s.enqueue(func() error {
		var sum float64
		switch x.dt {
		case gpu.F32:
			for _, v := range x.f32() {
				sum += float64(v) * float64(v)
			}
		case gpu.BF16:
			for _, h := range x.u16() {
				v := float64(bf16.ToFloat32(h))
				sum += v * v
			}
		case gpu.F64:
			for _, v := range x.f64() {
				sum += v * v
			}
		case gpu.I32:
			for _, v := range x.i32() {
				sum += float64(v) * float64(v)
			}
		}
		out.f64()[index] = sum
		return nil
	})
}

// adamGrain is the number of parameters one cpuadam call updates.
const adamGrain = 1 << 16

// AdamStep calls cpuadam on chunks of the buffers, in parallel; the update
// is elementwise, so the bits equal one cpuadam call over the whole buffer.
// Hyper-parameters that cpuadam rejects are an error on the stream.
func (o *Ops) AdamStep(gs gpu.Stream, gparam, ggrad, gm, gv, gout gpu.Buffer, p gpu.AdamParams) {
	s := o.stream(gs)
	param := o.d.buf(gparam, "adam param")
	n := param.n
	param = o.typed(gparam, "adam param", gpu.F32, n)
	grad := o.float(ggrad, "adam grad", n)
	m := o.typed(gm, "adam m", gpu.F32, n)
	v := o.typed(gv, "adam v", gpu.F32, n)
	var out *Buffer
	if gout != nil {
		out = o.typed(gout, "adam out", gpu.BF16, n)
	}
	cp := cpuadam.Params{LR: p.LR, Beta1: p.Beta1, Beta2: p.Beta2, Eps: p.Eps, WeightDecay: p.WeightDecay,
		Step: p.Step, GradScale: p.GradScale, Mode: cpuadam.AdamW}
	if p.L2 {
		cp.Mode = cpuadam.AdamL2
	}
	s.enqueue(func() error {
		if err := cp.Validate(); err != nil {
			return fmt.Errorf("gpu/cpu: adam step: %w", err)
		}
		chunks := (n + adamGrain - 1) / adamGrain
		o.d.parallel(chunks, 1, func(clo, chi int) {
			for c := clo; c < chi; c++ {
				lo, hi := c*adamGrain, min(n, (c+1)*adamGrain)
				var ob []uint16
				if out != nil {
					ob = out.u16()[lo:hi]
				}
				if grad.dt == gpu.F32 {
					cpuadam.StepF32(cp, param.f32()[lo:hi], grad.f32()[lo:hi], m.f32()[lo:hi], v.f32()[lo:hi], ob)
				} else {
					cpuadam.StepBF16(cp, param.f32()[lo:hi], grad.u16()[lo:hi], m.f32()[lo:hi], v.f32()[lo:hi], ob)
				}
			}
		})
		return nil
	})
}
