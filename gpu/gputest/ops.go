package gputest

import (
	"fmt"
	"math"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// storage configurations: every float buffer F32, or every float buffer
// BF16, or F16 (statistics and attention probabilities stay F32 as the
// interface says).
var storages = []gpu.DType{gpu.F32, gpu.BF16, gpu.F16}

func testOps(t *testing.T, nb NewBackend) {
	d, s := one(t, nb)
	t.Run("Gemm", func(t *testing.T) { testGemm(t, d, s) })
	for _, dt := range storages {
		t.Run("LayerNorm/"+dt.String(), func(t *testing.T) { testLayerNorm(t, d, s, dt) })
		t.Run("AddLayerNorm/"+dt.String(), func(t *testing.T) { testAddLayerNorm(t, d, s, dt) })
		t.Run("Attention/"+dt.String(), func(t *testing.T) { testAttention(t, d, s, dt) })
		t.Run("AttentionCached/"+dt.String(), func(t *testing.T) { testAttentionCached(t, d, s, dt) })
		t.Run("RMSNorm/"+dt.String(), func(t *testing.T) { testRMSNorm(t, d, s, dt) })
		t.Run("AddRMSNorm/"+dt.String(), func(t *testing.T) { testAddRMSNorm(t, d, s, dt) })
		t.Run("Rope/"+dt.String(), func(t *testing.T) { testRope(t, d, s, dt) })
		t.Run("GLU/"+dt.String(), func(t *testing.T) { testGLU(t, d, s, dt) })
		t.Run("Gelu/"+dt.String(), func(t *testing.T) { testGelu(t, d, s, dt) })
		t.Run("BiasGelu/"+dt.String(), func(t *testing.T) { testBiasGelu(t, d, s, dt) })
		t.Run("CrossEntropy/"+dt.String(), func(t *testing.T) { testCrossEntropy(t, d, s, dt) })
		t.Run("Embedding/"+dt.String(), func(t *testing.T) { testEmbedding(t, d, s, dt) })
		t.Run("BiasAdd/"+dt.String(), func(t *testing.T) { testBiasAdd(t, d, s, dt) })
		t.Run("Add/"+dt.String(), func(t *testing.T) { testAdd(t, d, s, dt) })
		t.Run("AddColumns/"+dt.String(), func(t *testing.T) { testAddColumns(t, d, s, dt) })
		t.Run("Dropout/"+dt.String(), func(t *testing.T) { testDropout(t, d, s, dt) })
		t.Run("Dequantize/"+dt.String(), func(t *testing.T) { testDequantize(t, d, s, dt) })
		t.Run("ScaleAxpy/"+dt.String(), func(t *testing.T) { testScaleAxpy(t, d, s, dt) })
		t.Run("Adam/"+dt.String(), func(t *testing.T) { testAdam(t, d, s, dt) })
		t.Run("ScaleRowsDots/"+dt.String(), func(t *testing.T) { testScaleRowsDots(t, d, s, dt) })
	}
	t.Run("CastFill", func(t *testing.T) { testCastFill(t, d, s) })
	t.Run("SumSquares", func(t *testing.T) { testSumSquares(t, d, s) })
}

func testGemm(t *testing.T, d gpu.Device, s gpu.Stream) {
	r := newRand(10)
	sizes := [][3]int{{1, 1, 1}, {7, 13, 33}, {67, 131, 45}, {3, 5, 0}}
	configs := [][3]gpu.DType{{gpu.F32, gpu.F32, gpu.F32}, {gpu.BF16, gpu.BF16, gpu.BF16}, {gpu.BF16, gpu.F32, gpu.F32}, {gpu.F32, gpu.BF16, gpu.BF16},
		{gpu.F16, gpu.F16, gpu.F16}, {gpu.F16, gpu.F16, gpu.F32}, {gpu.F32, gpu.F16, gpu.F16}}
	for _, cfg := range configs {
		for _, sz := range sizes {
			m, n, k := sz[0], sz[1], sz[2]
			for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				for _, beta := range []float64{0, 1} {
					name := fmt.Sprintf("%s/%dx%dx%d/tA=%v,tB=%v/beta=%v", dtName(cfg[:]...), m, n, k, tr[0], tr[1], beta)
					a := stored(randVals(r, m*k, 1), cfg[0])
					b := stored(randVals(r, k*n, 1), cfg[1])
					c0 := stored(randVals(r, m*n, 1), cfg[2])
					if beta == 0 {
						c0 = constVals(m*n, math.NaN()) // must be ignored
					}
					alpha := 0.75
					ga, gb := upload(t, d, s, a, cfg[0]), upload(t, d, s, b, cfg[1])
					gc := upload(t, d, s, c0, cfg[2])
					d.Ops().Gemm(s, tr[0], tr[1], m, n, k, float32(alpha), ga, gb, float32(beta), gc)
					got := download(t, d, s, gc)
					want, mag := gemmRef(tr[0], tr[1], m, n, k, alpha, a, b, beta, c0)
					checkClose(t, name, got, want, mag, cfg[2], rtolF32)
				}
			}
		}
	}
}

func testLayerNorm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(11)
	for _, sz := range [][2]int{{1, 1}, {5, 37}, {17, 300}} {
		rows, cols := sz[0], sz[1]
		x := stored(randVals(r, rows*cols, 2), dt)
		for i := range x { // an offset, so that the mean matters
			x[i] = stored([]float64{x[i] + 0.5}, dt)[0]
		}
		g, b := stored(randVals(r, cols, 1.5), dt), stored(randVals(r, cols, 0.5), dt)
		gx, gg, gb := upload(t, d, s, x, dt), upload(t, d, s, g, dt), upload(t, d, s, b, dt)
		gy, gm, gr := alloc(t, d, rows*cols, dt), alloc(t, d, rows, gpu.F32), alloc(t, d, rows, gpu.F32)
		d.Ops().LayerNormForward(s, gx, gg, gb, gy, gm, gr, rows, cols, 1e-5)
		y, mean, rstd := layerNormRef(x, g, b, rows, cols, 1e-5)
		mag := make([]float64, rows*cols)
		meanMag := make([]float64, rows)
		for i := range mag {
			c := i % cols
			mag[i] = math.Abs((y[i] - b[c])) + math.Abs(b[c]) + math.Abs(g[c])
			meanMag[i/cols] += math.Abs(x[i]) / float64(cols)
		}
		name := fmt.Sprintf("%dx%d", rows, cols)
		checkClose(t, name+" y", download(t, d, s, gy), y, mag, dt, rtolF32)
		checkClose(t, name+" mean", download(t, d, s, gm), mean, meanMag, gpu.F32, rtolF32)
		checkClose(t, name+" rstd", download(t, d, s, gr), rstd, nil, gpu.F32, rtolF32)
	}
}

// testAddLayerNorm checks AddLayerNormForward as testAddRMSNorm checks
// AddRMSNormForward: sum has Add's bits, y, mean and rstd those of
// LayerNormForward of the stored sum, with sum apart and in place of b;
// views at odd offsets and widths that are not multiples of 8 take a
// vector backend's unaligned paths and tails; y against the float64
// reference of the stored sum.
func testAddLayerNorm(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(17)
	ops := d.Ops()
	for _, sz := range [][3]int{{1, 1, 0}, {4, 64, 0}, {3, 37, 1}, {2, 2051, 3}, {2, 2072, 0}} {
		rows, cols, off := sz[0], sz[1], sz[2]
		n := rows * cols
		name := fmt.Sprintf("%dx%d+%d", rows, cols, off)
		av, bv := stored(randVals(r, n, 2), dt), stored(randVals(r, n, 1), dt)
		g, b := stored(randVals(r, cols, 1.5), dt), stored(randVals(r, cols, 0.5), dt)
		view := viewAt(t, d, s, off, dt)
		ga, gb, gg, gbeta := view(av), view(bv), view(g), view(b)
		gsum, gy := view(make([]float64, n)), view(make([]float64, n))
		gm, gr := alloc(t, d, rows, gpu.F32), alloc(t, d, rows, gpu.F32)
		ops.AddLayerNormForward(s, ga, gb, gsum, gg, gbeta, gy, gm, gr, rows, cols, 1e-5)
		wsum, wy := view(make([]float64, n)), view(make([]float64, n))
		wm, wr := alloc(t, d, rows, gpu.F32), alloc(t, d, rows, gpu.F32)
		ops.Add(s, ga, gb, wsum, n)
		ops.LayerNormForward(s, wsum, gg, gbeta, wy, wm, wr, rows, cols, 1e-5)
		for _, c := range []struct {
			what      string
			got, want gpu.Buffer
		}{{"sum", gsum, wsum}, {"y", gy, wy}, {"mean", gm, wm}, {"rstd", gr, wr}} {
			if !equalBits(download(t, d, s, c.got), download(t, d, s, c.want)) {
				t.Errorf("%s %s: not the bits of Add then LayerNormForward", name, c.what)
			}
		}
		sum := download(t, d, s, gsum)
		checkClose(t, name+" sum", sum, addVals(av, bv), addVals(absVals(av), absVals(bv)), dt, rtolF32)
		y, _, rstd := layerNormRef(sum, g, b, rows, cols, 1e-5)
		mag := make([]float64, n)
		for i := range mag {
			c := i % cols
			mag[i] = math.Abs(y[i]-b[c]) + math.Abs(b[c]) + math.Abs(g[c])
		}
		checkClose(t, name+" y", download(t, d, s, gy), y, mag, dt, rtolF32)
		checkClose(t, name+" rstd", download(t, d, s, gr), rstd, nil, gpu.F32, rtolF32)
		gy2, gm2, gr2 := view(make([]float64, n)), alloc(t, d, rows, gpu.F32), alloc(t, d, rows, gpu.F32)
		ops.AddLayerNormForward(s, ga, gb, gb, gg, gbeta, gy2, gm2, gr2, rows, cols, 1e-5)
		if !equalBits(download(t, d, s, gb), sum) || !equalBits(download(t, d, s, gy2), download(t, d, s, gy)) {
			t.Errorf("%s: in place of b, not the bits of a separate sum", name)
		}
	}
}

// testBiasGelu checks BiasGeluForward: y has BiasAdd's bits and act
// GeluForward's of the stored y, at odd offsets and widths (a vector
// backend's unaligned paths and tails), and act against the float64 gelu
// of the stored y.
func testBiasGelu(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(18)
	ops := d.Ops()
	for _, sz := range [][3]int{{1, 1, 0}, {9, 13, 0}, {3, 64, 0}, {5, 37, 3}, {2, 3072, 0}} {
		rows, cols, off := sz[0], sz[1], sz[2]
		n := rows * cols
		name := fmt.Sprintf("%dx%d+%d", rows, cols, off)
		yv, bv := stored(randVals(r, n, 3), dt), stored(randVals(r, cols, 1), dt)
		view := viewAt(t, d, s, off, dt)
		gy, gb, gact := view(yv), view(bv), view(make([]float64, n))
		ops.BiasGeluForward(s, gy, gb, gact, rows, cols)
		wy, wact := view(yv), view(make([]float64, n))
		ops.BiasAdd(s, wy, gb, rows, cols)
		ops.GeluForward(s, wy, wact, n)
		y := download(t, d, s, gy)
		if !equalBits(y, download(t, d, s, wy)) || !equalBits(download(t, d, s, gact), download(t, d, s, wact)) {
			t.Errorf("%s: not the bits of BiasAdd then GeluForward", name)
		}
		want, mag := make([]float64, n), make([]float64, n)
		for i := range want {
			want[i] = yv[i] + bv[i%cols]
			mag[i] = math.Abs(yv[i]) + math.Abs(bv[i%cols])
		}
		checkClose(t, name+" y", y, want, mag, dt, rtolF32)
		for i, v := range y {
			want[i], mag[i] = geluRef(v), math.Abs(v)
		}
		checkClose(t, name+" act", download(t, d, s, gact), want, mag, dt, rtolF32)
	}
}

func testGelu(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(13)
	n := 40003 // crosses chunk boundaries of chunked backends
	x := stored(randVals(r, n, 5), dt)
	gx, gy := upload(t, d, s, x, dt), alloc(t, d, n, dt)
	d.Ops().GeluForward(s, gx, gy, n)
	want := make([]float64, n)
	for i, v := range x {
		want[i] = geluRef(v)
	}
	checkClose(t, "gelu", download(t, d, s, gy), want, absVals(x), dt, rtolF32)
}

func testBiasAdd(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(16)
	rows, cols := 9, 13
	y, b := stored(randVals(r, rows*cols, 1), dt), stored(randVals(r, cols, 1), dt)
	gy, gb := upload(t, d, s, y, dt), upload(t, d, s, b, dt)
	d.Ops().BiasAdd(s, gy, gb, rows, cols)
	want, mag := make([]float64, rows*cols), make([]float64, rows*cols)
	for i := range want {
		want[i] = y[i] + b[i%cols]
		mag[i] = math.Abs(y[i]) + math.Abs(b[i%cols])
	}
	checkClose(t, "bias-add", download(t, d, s, gy), want, mag, dt, rtolF32)
}

func testAdd(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(17)
	n := 20001
	a, b := stored(randVals(r, n, 1), dt), stored(randVals(r, n, 1), dt)
	ga, gb, gout := upload(t, d, s, a, dt), upload(t, d, s, b, dt), alloc(t, d, n, dt)
	d.Ops().Add(s, ga, gb, gout, n)
	want, mag := addVals(a, b), addVals(absVals(a), absVals(b))
	checkClose(t, "add", download(t, d, s, gout), want, mag, dt, rtolF32)
	d.Ops().Add(s, ga, gb, ga, n) // out aliases a
	checkClose(t, "add in place", download(t, d, s, ga), want, mag, dt, rtolF32)
}

// testAddColumns copies columns [2, 7) of a 9×11 matrix into columns [3, 8)
// of a 9×10 one (whose NaNs beta 0 must not read), then adds them again
// with beta 1; the columns outside stay as they were.
func testAddColumns(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(19)
	rows, srcLd, dstLd, cols, srcOff, dstOff := 9, 11, 10, 5, 2, 3
	src, dst := stored(randVals(r, rows*srcLd, 1), dt), stored(randVals(r, rows*dstLd, 1), dt)
	for i := range rows {
		for j := range cols {
			dst[i*dstLd+dstOff+j] = math.NaN()
		}
	}
	gs, gd := upload(t, d, s, src, dt), upload(t, d, s, dst, dt)
	want, mag := append([]float64(nil), dst...), make([]float64, rows*dstLd)
	for i := range rows {
		for j := range cols {
			want[i*dstLd+dstOff+j] = src[i*srcLd+srcOff+j]
		}
	}
	for i := range mag {
		mag[i] = math.Abs(want[i])
	}
	d.Ops().AddColumns(s, gd, gs, rows, cols, dstLd, dstOff, srcLd, srcOff, 0)
	checkClose(t, "add-columns copy", download(t, d, s, gd), want, mag, dt, rtolF32)
	for i := range rows {
		for j := range cols {
			want[i*dstLd+dstOff+j] *= 2
			mag[i*dstLd+dstOff+j] *= 2
		}
	}
	d.Ops().AddColumns(s, gd, gs, rows, cols, dstLd, dstOff, srcLd, srcOff, 1)
	checkClose(t, "add-columns add", download(t, d, s, gd), want, mag, dt, rtolF32)
}

// testDropout: Dropout keeps what gpu.DropoutKeep keeps (64 elements
// against a mask written down once, the one the CUDA emulator checks too),
// scaled; two calls at consecutive offsets give one call's elements; p 0.05
// keeps 95 % of 100,000 elements within four standard deviations.
func testDropout(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	const golden uint64 = 0xb4afd64de54dc8d5 // gpu.DropoutKeep(0x0123456789abcdef, 1000+i, 1<<23), i < 64
	for i := range int64(64) {
		if gpu.DropoutKeep(0x0123456789abcdef, 1000+i, 1<<23) != (golden>>i&1 == 1) {
			t.Fatalf("DropoutKeep's element %d is not the written-down mask's", i)
		}
	}
	r := newRand(20)
	x := stored(randVals(r, 64, 1), dt)
	gx, gy, g2 := upload(t, d, s, x, dt), alloc(t, d, 64, dt), alloc(t, d, 64, dt)
	d.Ops().Dropout(s, gx, gy, 64, 0x0123456789abcdef, 1000, 1<<23, 2)
	d.Ops().Dropout(s, gx.Slice(0, 32), g2.Slice(0, 32), 32, 0x0123456789abcdef, 1000, 1<<23, 2)
	d.Ops().Dropout(s, gx.Slice(32, 32), g2.Slice(32, 32), 32, 0x0123456789abcdef, 1032, 1<<23, 2)
	y, y2 := download(t, d, s, gy), download(t, d, s, g2)
	for i := range 64 {
		want := 0.0
		if golden>>i&1 == 1 {
			want = 2 * x[i]
		}
		if y[i] != want || y2[i] != y[i] {
			t.Fatalf("element %d: %v and %v (split), want %v", i, y[i], y2[i], want)
		}
	}
	const n = 100000
	thr, scale := gpu.DropoutThreshold(0.05)
	ones := upload(t, d, s, make1s(n), dt)
	d.Ops().Dropout(s, ones, ones, n, 42, 0, thr, scale)
	kept := 0
	for _, v := range download(t, d, s, ones) {
		if v != 0 {
			kept++
			if want := float64(stored([]float64{float64(scale)}, dt)[0]); v != want {
				t.Fatalf("a kept 1 is %v, want %v", v, want)
			}
		}
	}
	if sd := math.Sqrt(n * 0.05 * 0.95); math.Abs(float64(kept)-0.95*n) > 4*sd {
		t.Errorf("p 0.05 kept %d of %d, want %.0f ± %.0f", kept, n, 0.95*n, 4*sd)
	}
}

// testDequantize: 200 values (three blocks and a short one, one block all
// zeros) quantized by each codec of dtype.Codecs (internal/nf4,
// internal/absmax8) decode on the
// device to their Dequantize's values, rounded once into dt.
func testDequantize(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	for _, c := range dtype.Codecs {
		testDequantizeFormat(t, d, s, dt, c.DType, nil, c.Quantize, c.Dequantize)
	}
}

func testDequantizeFormat(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType, format gpu.DType, q []byte,
	quant func([]byte, []float32), dequant func([]float32, []byte)) {
	r := newRand(21)
	vals := randVals(r, 200, 3)
	for i := 64; i < 128; i++ {
		vals[i] = 0
	}
	f := make([]float32, len(vals))
	for i, v := range vals {
		f[i] = float32(v)
	}
	q = make([]byte, format.Bytes(len(f)))
	quant(q, f)
	want := make([]float32, len(f))
	dequant(want, q)
	src, err := d.Alloc(len(q), gpu.U8, gpu.Tag{Kind: gpu.Workspace, Purpose: "gputest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(src) })
	d.CopyHostToDevice(s, src, 0, q)
	dst := alloc(t, d, len(f), dt)
	d.Ops().Dequantize(s, format, src, dst, len(f))
	got := download(t, d, s, dst)
	for i := range want {
		w := float64(want[i])
		if dt.Half() {
			w = stored([]float64{w}, dt)[0]
		}
		if got[i] != w || math.Signbit(got[i]) != math.Signbit(w) {
			t.Fatalf("%s value %d: %v, want %v", format, i, got[i], w)
		}
	}
}

func make1s(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

func testScaleAxpy(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(18)
	n := 20001
	x, y := stored(randVals(r, n, 1), dt), stored(randVals(r, n, 1), dt)
	gx, gy := upload(t, d, s, x, dt), upload(t, d, s, y, dt)
	d.Ops().Scale(s, gx, 1.5)
	want := make([]float64, n)
	for i, v := range x {
		want[i] = float64(float32(v) * 1.5)
	}
	checkClose(t, "scale", download(t, d, s, gx), stored(want, dt), nil, dt, 0)
	d.Ops().Axpy(s, -0.5, gx, gy) // y += -0.5 * (1.5x)
	mag := make([]float64, n)
	for i := range want {
		mag[i] = math.Abs(y[i]) + math.Abs(0.5*want[i])
		want[i] = y[i] - 0.5*stored([]float64{want[i]}, dt)[0]
	}
	checkClose(t, "axpy", download(t, d, s, gy), want, mag, dt, rtolF32)
}

func testCastFill(t *testing.T, d gpu.Device, s gpu.Stream) {
	r := newRand(19)
	n := 1001
	vals := randVals(r, n, 1000)
	vals[0], vals[1], vals[2] = math.Inf(1), math.Inf(-1), 1e-40
	ints := make([]float64, n)
	for i := range ints {
		ints[i] = float64(r.IntN(2000) - 1000)
	}
	floats := []gpu.DType{gpu.F32, gpu.BF16, gpu.F16, gpu.F64}
	for _, src := range append(floats, gpu.I32) {
		for _, dst := range append(floats, gpu.I32) {
			in := vals
			if src == gpu.I32 || dst == gpu.I32 {
				in = ints
			}
			in = stored(in, src)
			gs, gd := upload(t, d, s, in, src), alloc(t, d, n, dst)
			d.Ops().Cast(s, gd, gs)
			if got, want := download(t, d, s, gd), stored(in, dst); !equalBits(got, want) {
				t.Errorf("cast %s to %s: got %v, want %v", src, dst, got[:4], want[:4])
			}
		}
	}
	for _, dt := range append(floats, gpu.I32) {
		x := alloc(t, d, 77, dt)
		d.Ops().Fill(s, x, 2.5)
		want := 2.5
		if dt == gpu.I32 {
			want = 2
		}
		for i, v := range download(t, d, s, x) {
			if v != want {
				t.Fatalf("fill %s: x[%d] = %v, want %v", dt, i, v, want)
			}
		}
	}
}

func testSumSquares(t *testing.T, d gpu.Device, s gpu.Stream) {
	r := newRand(20)
	out := alloc(t, d, 4, gpu.F64)
	for i, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16} {
		x := stored(randVals(r, 100003, 3), dt)
		d.Ops().SumSquares(s, upload(t, d, s, x, dt), out, i+1)
		var want float64
		for _, v := range x {
			want += v * v
		}
		got := download(t, d, s, out)
		if math.Abs(got[i+1]-want) > 1e-12*want || got[0] != 0 {
			t.Errorf("sum of squares %s: got %v (out %v), want %v", dt, got[i+1], got, want)
		}
	}
	x := upload(t, d, s, []float64{1, math.Inf(1), 2}, gpu.F32)
	d.Ops().SumSquares(s, x, out, 0)
	if got := download(t, d, s, out); !math.IsInf(got[0], 1) {
		t.Errorf("sum of squares with +Inf: %v", got[0])
	}
	x = upload(t, d, s, []float64{1, math.NaN(), 2}, gpu.F32)
	d.Ops().SumSquares(s, x, out, 0)
	if got := download(t, d, s, out); !math.IsNaN(got[0]) {
		t.Errorf("sum of squares with NaN: %v", got[0])
	}
}

// testAdam checks AdamStep against the Adam formula in float64. The
// backend rounds every operation to fp32, so the new parameter is compared
// within 1e-5 of the step size plus 1e-6 of the parameter.
func testAdam(t *testing.T, d gpu.Device, s gpu.Stream, gradDT gpu.DType) {
	r := newRand(21)
	n := 70001
	for _, mode := range []gpu.AdamMode{gpu.AdamW, gpu.AdamL2} {
		l2 := mode == gpu.AdamL2
		p := gpu.AdamParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 3, GradScale: 0.5, Mode: mode}
		param, grad := randVals(r, n, 1), stored(randVals(r, n, 1), gradDT)
		m, v := randVals(r, n, 0.1), absVals(randVals(r, n, 0.01))
		gp, gg, gm, gv := upload(t, d, s, param, gpu.F32), upload(t, d, s, grad, gradDT), upload(t, d, s, m, gpu.F32), upload(t, d, s, v, gpu.F32)
		outDT := gpu.BF16 // the params' dtype: f16 with f16 gradients
		if gradDT == gpu.F16 {
			outDT = gpu.F16
		}
		out := alloc(t, d, n, outDT)
		d.Ops().AdamStep(s, gp, gg, gm, gv, out, p)
		bc1, bc2 := 1-math.Pow(p.Beta1, 3), 1-math.Pow(p.Beta2, 3)
		wantP, wantM, wantV, mag, magM := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range n {
			g := grad[i] * p.GradScale
			decay := 1 - p.LR*p.WeightDecay
			if l2 {
				g += p.WeightDecay * param[i]
				decay = 1
			}
			wantM[i] = p.Beta1*m[i] + (1-p.Beta1)*g
			magM[i] = math.Abs(p.Beta1*m[i]) + math.Abs((1-p.Beta1)*g)
			wantV[i] = p.Beta2*v[i] + (1-p.Beta2)*g*g
			step := p.LR / bc1 * wantM[i] / (math.Sqrt(wantV[i])/math.Sqrt(bc2) + p.Eps)
			wantP[i] = param[i]*decay - step
			mag[i] = math.Abs(param[i])/10 + math.Abs(step)
		}
		name := fmt.Sprintf("l2=%v", l2)
		gotP := download(t, d, s, gp)
		checkClose(t, name+" param", gotP, wantP, mag, gpu.F32, rtolF32)
		checkClose(t, name+" m", download(t, d, s, gm), wantM, magM, gpu.F32, rtolF32)
		checkClose(t, name+" v", download(t, d, s, gv), wantV, nil, gpu.F32, rtolF32)
		if got := download(t, d, s, out); !equalBits(got, stored(gotP, outDT)) {
			t.Errorf("%s: %s out is not the new params rounded", name, outDT)
		}
	}
}

// testScaleRows: x[r,:] *= scale[r] in fp32, rounded once; RowDots: the
// float64 sum of exact products in column order, rounded once to fp32.
func testScaleRowsDots(t *testing.T, d gpu.Device, s gpu.Stream, dt gpu.DType) {
	r := newRand(21)
	for _, sz := range [][2]int{{1, 1}, {7, 33}, {130, 257}} {
		rows, cols := sz[0], sz[1]
		x, y := stored(randVals(r, rows*cols, 1), dt), stored(randVals(r, rows*cols, 1), dt)
		sc := stored(randVals(r, rows, 2), gpu.F32)
		gx, gy, gs, gout := upload(t, d, s, x, dt), upload(t, d, s, y, dt), upload(t, d, s, sc, gpu.F32), alloc(t, d, rows, gpu.F32)
		d.Ops().RowDots(s, gx, gy, gout, rows, cols)
		dots := make([]float64, rows)
		for i := range rows {
			var sum float64
			for c := range cols {
				sum += float64(float32(x[i*cols+c])) * float64(float32(y[i*cols+c]))
			}
			dots[i] = float64(float32(sum))
		}
		if got := download(t, d, s, gout); !equalBits(got, dots) {
			t.Errorf("row-dots %s %dx%d: got %v, want %v", dt, rows, cols, got[:min(4, rows)], dots[:min(4, rows)])
		}
		d.Ops().ScaleRows(s, gx, gs, rows, cols)
		want := make([]float64, rows*cols)
		for i := range want {
			want[i] = float64(float32(x[i]) * float32(sc[i/cols]))
		}
		checkClose(t, fmt.Sprintf("scale-rows %dx%d", rows, cols), download(t, d, s, gx), stored(want, dt), nil, dt, 0)
	}
}
