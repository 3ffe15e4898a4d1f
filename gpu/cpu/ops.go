package cpu

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// kernels are the Ops of one Device behind the front end's checks
// (gpu.CheckedOps): every argument is checked and resolved when a method
// is called. Arithmetic is fp32; row reductions
// (layernorm statistics, softmax normalisers, sums of squares) and
// transcendental functions are evaluated in float64 and rounded to fp32.
// Every reduction runs in a fixed order that does not depend on the worker
// count, so results are bit-reproducible.
type kernels struct{ d *Device }

// chunkElems is the number of elements an elementwise op converts at a time.
const chunkElems = 1 << 14

// elementwise runs fn over [0, n) in chunks, in parallel, with the
// worker's temporaries reset before each chunk.
func (o *kernels) elementwise(n int, fn func(lo, hi int, t *temps)) {
	o.d.parallel((n+chunkElems-1)/chunkElems, 1, func(clo, chi int, t *temps) {
		for c := clo; c < chi; c++ {
			t.reset()
			fn(c*chunkElems, min(n, (c+1)*chunkElems), t)
		}
	})
}

// BiasAdd: y[r,c] += bias[c].
func (o *kernels) BiasAdd(s *Stream, y, bias *Buffer, rows, cols int) {
	s.enqueue(func() error {
		st := o.d.takeTemps()
		defer o.d.giveTemps(st)
		bv := loadF32(bias, 0, cols, st.get(cols))
		o.d.parallel(rows, max(1, chunkElems/max(1, cols)), func(lo, hi int, t *temps) {
			tmp := t.get(cols)
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

// BiasGrad: dbias[c] += sum_r dy[r,c], summed in fp32 in
// gpu.ColumnBlockRows order (endBlock).
func (o *kernels) BiasGrad(s *Stream, dy, dbias *Buffer, rows, cols int) {
	s.enqueue(func() error {
		o.d.parallel(cols, 64, func(lo, hi int, t *temps) {
			acc, part := t.get(hi-lo), t.get(hi-lo)
			clear(acc)
			clear(part)
			tmp := t.get(hi - lo)
			for r := range rows {
				row := loadF32(dy, r*cols+lo, r*cols+hi, tmp)
				for i, v := range row {
					part[i] += v
				}
				tmp = row
				endBlock(r, rows, acc, part)
			}
			addInto(dbias, lo, acc, t.get(hi-lo))
		})
		return nil
	})
}

// addInto writes b[off+i] += v[i], rounding once; tmp (len(v) long)
// holds b's values when b is not F32.
func addInto(b *Buffer, off int, v, tmp []float32) {
	cur := loadF32(b, off, off+len(v), tmp)
	for i, x := range v {
		cur[i] += x
	}
	storeF32(b, off, cur)
}

// GeluForward: y = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
func (o *kernels) GeluForward(s *Stream, x, y *Buffer, n int) {
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int, t *temps) {
			xv := loadF32(x, lo, hi, t.get(hi-lo))
			out := t.get(hi - lo)
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
func (o *kernels) GeluBackward(s *Stream, x, dy, dx *Buffer, n int) {
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int, t *temps) {
			xv := loadF32(x, lo, hi, t.get(hi-lo))
			dv := loadF32(dy, lo, hi, t.get(hi-lo))
			out := t.get(hi - lo)
			for i, v := range xv {
				out[i] = dv[i] * geluGrad(v)
			}
			storeF32(dx, lo, out)
		})
		return nil
	})
}

// Add: out = a + b; out may alias a or b.
func (o *kernels) Add(s *Stream, a, b, out *Buffer, n int) {
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int, t *temps) {
			av := loadF32(a, lo, hi, t.get(hi-lo))
			bv := loadF32(b, lo, hi, t.get(hi-lo))
			res := t.get(hi - lo)
			for i := range res {
				res[i] = av[i] + bv[i]
			}
			storeF32(out, lo, res)
		})
		return nil
	})
}

// AddColumns: dst[r, dstOff+j] = beta·dst[r, dstOff+j] + src[r, srcOff+j]
// (beta 0: a copy), in fp32, rounded once into dst's dtype.
func (o *kernels) AddColumns(s *Stream, dst, src *Buffer, rows, cols, dstLd, dstOff, srcLd, srcOff int, beta float32) {
	s.enqueue(func() error {
		o.d.parallel(rows, 1, func(lo, hi int, t *temps) {
			sv, dv := t.get(cols), t.get(cols)
			for r := lo; r < hi; r++ {
				sv = loadF32(src, r*srcLd+srcOff, r*srcLd+srcOff+cols, sv)
				if beta == 0 {
					storeF32(dst, r*dstLd+dstOff, sv)
					continue
				}
				dv = loadF32(dst, r*dstLd+dstOff, r*dstLd+dstOff+cols, dv)
				for j := range dv {
					dv[j] = float32(beta*dv[j]) + sv[j]
				}
				storeF32(dst, r*dstLd+dstOff, dv)
			}
		})
		return nil
	})
}

// Dropout: y = x·scale where gpu.DropoutKeep, else 0 (fp32, rounded once
// into y's dtype).
func (o *kernels) Dropout(s *Stream, x, y *Buffer, n int, seed uint64, offset int64, threshold uint32, scale float32) {
	s.enqueue(func() error {
		o.elementwise(n, func(lo, hi int, t *temps) {
			v := t.get(hi - lo)
			copy(v, loadF32(x, lo, hi, v)) // a copy when x is F32: y may be another buffer
			for i := range v {
				if gpu.DropoutKeep(seed, offset+int64(lo+i), threshold) {
					v[i] *= scale
				} else {
					v[i] = 0
				}
			}
			storeF32(y, lo, v)
		})
		return nil
	})
}

// Dequantize: dst = format's codec's decoding of src's bytes (dtype.Codecs:
// internal/nf4's, internal/absmax8's), rounded into dst's dtype, a range
// of blocks at a time. A format with no codec fails the stream.
func (o *kernels) Dequantize(s *Stream, format gpu.DType, src, dst *Buffer, n int) {
	s.enqueue(func() error {
		c, err := dtype.CodecOf(format)
		if err != nil {
			return fmt.Errorf("cpu: dequantize: %w", err)
		}
		o.elementwise(c.Blocks(n), func(lo, hi int, t *temps) {
			a, b := lo*c.BlockSize, min(hi*c.BlockSize, n)
			v := t.get(b - a)
			c.DequantizeBlocks(v, src.raw(), n, lo, hi)
			storeF32(dst, a, v)
		})
		return nil
	})
}

// Cast: dst = src converted. Conversions into bf16 or fp16 round to
// nearest even; f64 to bf16 or fp16 rounds to f32 first (two roundings);
// floats to i32 truncate.
func (o *kernels) Cast(s *Stream, dst, src *Buffer) {
	s.enqueue(func() error {
		n := src.Len()
		switch {
		case dst.DType() == src.DType():
			copy(dst.raw(), src.raw())
		case dst.DType() == gpu.F64 && src.DType() == gpu.I32:
			d, sv := dst.f64(), src.i32()
			for i, v := range sv {
				d[i] = float64(v)
			}
		case dst.DType() == gpu.I32 && src.DType() == gpu.F64:
			d, sv := dst.i32(), src.f64()
			for i, v := range sv {
				d[i] = int32(v)
			}
		default:
			o.elementwise(n, func(lo, hi int, t *temps) {
				storeF32(dst, lo, loadF32(src, lo, hi, t.get(hi-lo)))
			})
		}
		return nil
	})
}

// Fill writes value into every element of x (any dtype).
func (o *kernels) Fill(s *Stream, x *Buffer, value float32) {
	s.enqueue(func() error {
		switch x.DType() {
		case gpu.F32:
			v := x.f32()
			for i := range v {
				v[i] = value
			}
		case gpu.BF16, gpu.F16:
			var h [1]uint16
			dtype.Narrow(x.DType(), h[:], []float32{value})
			h0, v := h[0], x.u16()
			for i := range v {
				v[i] = h0
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
func (o *kernels) Scale(s *Stream, x *Buffer, alpha float32) {
	s.enqueue(func() error {
		if x.DType() == gpu.F64 {
			v := x.f64()
			for i := range v {
				v[i] *= float64(alpha)
			}
			return nil
		}
		o.elementwise(x.Len(), func(lo, hi int, t *temps) {
			v := loadF32(x, lo, hi, t.get(hi-lo))
			for i := range v {
				v[i] *= alpha
			}
			storeF32(x, lo, v)
		})
		return nil
	})
}

// ScaleRows: x[r,:] *= scale[r], in fp32.
func (o *kernels) ScaleRows(s *Stream, x, scale *Buffer, rows, cols int) {
	s.enqueue(func() error {
		sc := scale.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int, t *temps) {
			tmp := t.get(cols)
			for r := lo; r < hi; r++ {
				v := loadF32(x, r*cols, (r+1)*cols, tmp)
				for i := range v {
					v[i] *= sc[r]
				}
				storeF32(x, r*cols, v)
			}
		})
		return nil
	})
}

// RowDots: out[r] = Σ_c a[r,c]·b[r,c], the products exact in float64 and
// summed in float64 in column order (the order gpu/cuda's row_dots sums
// in, so both give the same bits).
func (o *kernels) RowDots(s *Stream, a, b, out *Buffer, rows, cols int) {
	s.enqueue(func() error {
		ov := out.f32()
		o.d.parallel(rows, max(1, 4096/max(1, cols)), func(lo, hi int, t *temps) {
			ta, tb := t.get(cols), t.get(cols)
			for r := lo; r < hi; r++ {
				av, bv := loadF32(a, r*cols, (r+1)*cols, ta), loadF32(b, r*cols, (r+1)*cols, tb)
				var sum float64
				for c, x := range av {
					sum += float64(x) * float64(bv[c])
				}
				ov[r] = float32(sum)
			}
		})
		return nil
	})
}

// Axpy: y += alpha*x (fp32; float64 when both are f64).
func (o *kernels) Axpy(s *Stream, alpha float32, x, y *Buffer) {
	s.enqueue(func() error {
		if x.DType() == gpu.F64 && y.DType() == gpu.F64 {
			xv, yv := x.f64(), y.f64()
			for i, v := range xv {
				yv[i] += float64(alpha) * v
			}
			return nil
		}
		o.elementwise(x.Len(), func(lo, hi int, t *temps) {
			xv := loadF32(x, lo, hi, t.get(hi-lo))
			yv := loadF32(y, lo, hi, t.get(hi-lo))
			for i, v := range xv {
				yv[i] += alpha * v
			}
			storeF32(y, lo, yv)
		})
		return nil
	})
}

// SumSquares: out[index] = sum x[i]^2 in float64, in index order.
func (o *kernels) SumSquares(s *Stream, x, out *Buffer, index int) {
	s.enqueue(func() error {
		var sum float64
		switch x.DType() {
		case gpu.F32:
			for _, v := range x.f32() {
				sum += float64(v) * float64(v)
			}
		case gpu.BF16, gpu.F16:
			u := x.u16()
			t := o.d.takeTemps()
			defer o.d.giveTemps(t)
			w := t.get(min(len(u), 4096))
			for lo := 0; lo < len(u); lo += len(w) {
				part := w[:min(len(w), len(u)-lo)]
				dtype.Widen(x.DType(), part, u[lo:lo+len(part)])
				for _, f := range part {
					sum += float64(f) * float64(f)
				}
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
// The front end has validated p (a rejected set reaches Fail).
func (o *kernels) AdamStep(s *Stream, param, grad, m, v, out *Buffer, p gpu.AdamParams) {
	n := param.Len()
	s.enqueue(func() error {
		chunks := (n + adamGrain - 1) / adamGrain
		o.d.parallel(chunks, 1, func(clo, chi int, _ *temps) {
			for c := clo; c < chi; c++ {
				lo, hi := c*adamGrain, min(n, (c+1)*adamGrain)
				var ob []uint16
				if out != nil {
					ob = out.u16()[lo:hi]
				}
				switch {
				case grad.DType() == gpu.F16:
					cpuadam.StepF16(p, param.f32()[lo:hi], grad.u16()[lo:hi], m.f32()[lo:hi], v.f32()[lo:hi], ob)
				case grad.DType() == gpu.F32:
					cpuadam.StepF32(p, param.f32()[lo:hi], grad.f32()[lo:hi], m.f32()[lo:hi], v.f32()[lo:hi], ob)
				default:
					cpuadam.StepBF16(p, param.f32()[lo:hi], grad.u16()[lo:hi], m.f32()[lo:hi], v.f32()[lo:hi], ob)
				}
			}
		})
		return nil
	})
}

// Fail puts err on s, in order: the next Synchronize returns it.
func (o *kernels) Fail(s *Stream, err error) { s.enqueue(func() error { return err }) }

// endBlock, after row r of rows, adds the block sums part into acc and
// clears them when r ends a block of gpu.ColumnBlockRows rows (or is the
// last row): the column sums' order of every backend.
func endBlock(r, rows int, acc, part []float32) {
	if (r+1)%gpu.ColumnBlockRows != 0 && r+1 != rows {
		return
	}
	for i, p := range part {
		acc[i] += p
	}
	clear(part)
}
