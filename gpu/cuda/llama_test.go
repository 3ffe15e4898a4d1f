package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/units"
)

// pair is one buffer on the CUDA device and its twin on a gpu/cpu device.
type pair struct{ g, c gpu.Buffer }

// twins runs ops on a CUDA device and a gpu/cpu device side by side.
type twins struct {
	t    *testing.T
	d, c gpu.Device
	r    *rand.Rand
}

func (w *twins) put(data []byte, n int, dt gpu.DType) pair {
	return pair{put(w.t, w.d, data, n, dt), put(w.t, w.c, data, n, dt)}
}

// rand returns n normal values (times sd) stored as dt on both devices.
func (w *twins) rand(n int, dt gpu.DType, sd float64) pair {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(w.r.NormFloat64() * sd)
	}
	if dt == gpu.BF16 {
		return w.put(u16bytes(bf16s(v)), n, dt)
	}
	return w.put(f32bytes(v), n, dt)
}

func (w *twins) ids(v []int32) pair { return w.put(idb32(v), len(v), gpu.I32) }

// run enqueues op on both devices' default streams and synchronizes.
func (w *twins) run(op func(o gpu.Ops, s gpu.Stream, side func(pair) gpu.Buffer)) {
	for i, dev := range []gpu.Device{w.d, w.c} {
		side := func(p pair) gpu.Buffer {
			if p.g == nil {
				return nil
			}
			if i == 0 {
				return p.g
			}
			return p.c
		}
		s := dev.DefaultStream()
		op(dev.Ops(), s, side)
		if err := s.Synchronize(); err != nil {
			w.t.Fatal(err)
		}
	}
}

func floats(t *testing.T, d gpu.Device, b gpu.Buffer) []float32 {
	raw := get(t, d, b)
	switch b.DType() {
	case gpu.BF16:
		h := unsafe.Slice((*uint16)(unsafe.Pointer(&raw[0])), len(raw)/2)
		out := make([]float32, len(h))
		bf16.ToFloat32s(out, h)
		return out
	default:
		return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4)...)
	}
}

// near checks |cuda - cpu| <= tol*max(1, max|cpu|) elementwise.
func (w *twins) near(what string, p pair, tol float64) {
	w.t.Helper()
	g, c := floats(w.t, w.d, p.g), floats(w.t, w.c, p.c)
	scale, worst, at := 1.0, 0.0, 0
	for _, v := range c {
		scale = max(scale, math.Abs(float64(v)))
	}
	for i := range c {
		e := math.Abs(float64(g[i]) - float64(c[i]))
		if math.IsInf(float64(c[i]), -1) && g[i] == c[i] {
			e = 0
		}
		if !(e <= worst) {
			worst, at = e, i
		}
	}
	if !(worst <= tol*scale) {
		w.t.Errorf("%s: element %d: cuda %v, cpu %v (worst error %.3g, tolerance %.3g)", what, at, g[at], c[at], worst, tol*scale)
	}
}

// TestLlamaOpsMatchCPUBackend runs the ops of the Llama family — grouped-
// query attention over packed examples (head dims 64 and 128, T not a
// multiple of any tile; plain, and with a sliding window, a soft cap and a
// custom scale), RoPE (whole heads, and partial with a scale), RMSNorm,
// SwiGLU and GeGLU, embedding without wpe and cross-entropy with ignored
// targets, with and without a soft cap — on both backends and compares.
// Tolerances: f32, 1e-4 of the largest magnitude (fp32 sums in different
// orders, over at most a few hundred terms, and expf against float64 exp);
// bf16 outputs, 1e-2 (one rounding of 2^-9 on either side, and the
// backward's row dots read the rounded out).
func TestLlamaOpsMatchCPUBackend(t *testing.T) {
	d := newBackend(t, 1, 1024*units.MiB).Device(0)
	cdevs, _, err := cpu.New(cpu.Options{HBMBytes: 1024 * units.MiB})
	if err != nil {
		t.Fatal(err)
	}
	w := &twins{t: t, d: d, c: cdevs[0], r: rand.New(rand.NewPCG(7, 8))}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		tol := 1e-4
		if dt == gpu.BF16 {
			tol = 1e-2
		}
		for _, c := range []struct {
			B, T, H, KV, D int
			opt            gpu.AttnOptions
			rope           gpu.Rope
		}{
			{2, 77, 8, 2, 64, gpu.AttnOptions{}, gpu.DefaultRope(64, 500000)},
			{1, 45, 4, 4, 128, gpu.AttnOptions{}, gpu.DefaultRope(128, 500000)},
			{3, 17, 6, 3, 32, gpu.AttnOptions{}, gpu.DefaultRope(32, 500000)},
			{2, 77, 8, 2, 64, gpu.AttnOptions{Window: 20, SoftCap: 30, Scale: 0.0625}, gpu.Rope{InvFreq: gpu.InvFreq(32, 10000), Scale: 1.25, Dims: 32}},
			{1, 45, 4, 4, 128, gpu.AttnOptions{Window: 1}, gpu.DefaultRope(128, 10000)},
		} {
			name := fmt.Sprintf("%s B%d T%d H%d KV%d D%d %+v", dt, c.B, c.T, c.H, c.KV, c.D, c.opt)
			W := (c.H + 2*c.KV) * c.D
			qkv, pos := w.rand(c.B*c.T*W, dt, 1), w.ids(packedPos(w.r, c.B, c.T))
			out, lse := w.rand(c.B*c.T*c.H*c.D, dt, 1), w.rand(c.B*c.H*c.T, gpu.F32, 1)
			dout, dqkv := w.rand(c.B*c.T*c.H*c.D, dt, 1), w.rand(c.B*c.T*W, dt, 1)
			w.run(func(o gpu.Ops, s gpu.Stream, x func(pair) gpu.Buffer) {
				o.RopeForward(s, x(qkv), x(pos), c.B, c.T, c.H, c.KV, c.D, c.rope)
				o.AttentionForward(s, x(qkv), x(out), x(lse), x(pos), c.B, c.T, c.H, c.KV, c.D, c.opt)
				o.AttentionBackward(s, x(dout), x(qkv), x(out), x(lse), x(pos), x(dqkv), c.B, c.T, c.H, c.KV, c.D, c.opt)
			})
			w.near(name+": rope", qkv, tol)
			w.near(name+": attention out", out, tol)
			w.near(name+": attention lse", lse, 1e-4)
			w.near(name+": attention dqkv", dqkv, tol)
			w.run(func(o gpu.Ops, s gpu.Stream, x func(pair) gpu.Buffer) {
				o.RopeBackward(s, x(dqkv), nil, c.B, c.T, c.H, c.KV, c.D, c.rope)
			})
			w.near(name+": rope backward", dqkv, tol)
		}
		rows, cols, ffn, vocab := 19, 300, 70, 500
		x, gamma, y, rstd := w.rand(rows*cols, dt, 2), w.rand(cols, dt, 1), w.rand(rows*cols, dt, 1), w.rand(rows, gpu.F32, 1)
		dy, dx, dgamma := w.rand(rows*cols, dt, 1), w.rand(rows*cols, dt, 1), w.rand(cols, dt, 1)
		gu, sy, sdy, dgu := w.rand(rows*2*ffn, dt, 3), w.rand(rows*ffn, dt, 1), w.rand(rows*ffn, dt, 1), w.rand(rows*2*ffn, dt, 1)
		w.run(func(o gpu.Ops, s gpu.Stream, b func(pair) gpu.Buffer) {
			o.RMSNormForward(s, b(x), b(gamma), b(y), b(rstd), rows, cols, 1e-5)
			o.RMSNormBackward(s, b(dy), b(x), b(gamma), b(rstd), b(dx), b(dgamma), rows, cols)
			o.GLUForward(s, b(gu), b(sy), rows, ffn, gpu.Silu)
			o.GLUBackward(s, b(gu), b(sdy), b(dgu), rows, ffn, gpu.Silu)
		})
		for name, p := range map[string]pair{"rmsnorm y": y, "rmsnorm rstd": rstd, "rmsnorm dx": dx, "rmsnorm dgamma": dgamma, "swiglu y": sy, "swiglu dgateUp": dgu} {
			w.near(fmt.Sprintf("%s %s", dt, name), p, tol)
		}
		w.run(func(o gpu.Ops, s gpu.Stream, b func(pair) gpu.Buffer) {
			o.GLUForward(s, b(gu), b(sy), rows, ffn, gpu.GeluTanh)
			o.GLUBackward(s, b(gu), b(sdy), b(dgu), rows, ffn, gpu.GeluTanh)
		})
		w.near(fmt.Sprintf("%s geglu y", dt), sy, tol)
		w.near(fmt.Sprintf("%s geglu dgateUp", dt), dgu, tol)
		ids, targets := make([]int32, rows), make([]int32, rows)
		for i := range ids {
			ids[i], targets[i] = int32(w.r.IntN(vocab)), int32(w.r.IntN(vocab))
		}
		targets[3], targets[7] = -1, -1
		gi, gt := w.ids(ids), w.ids(targets)
		wte, emb := w.rand(vocab*cols, dt, 1), w.rand(rows*cols, dt, 1)
		logits, losses, dlogits := w.rand(rows*vocab, dt, 3), w.rand(rows, dt, 1), w.rand(rows*vocab, dt, 1)
		w.run(func(o gpu.Ops, s gpu.Stream, b func(pair) gpu.Buffer) {
			o.EmbeddingForward(s, b(gi), nil, b(wte), nil, b(emb), 1, rows, cols)
			o.CrossEntropyForward(s, b(logits), b(gt), b(losses), rows, vocab, 0)
			o.CrossEntropyBackward(s, b(logits), b(gt), b(dlogits), rows, vocab, 0.5, 0)
		})
		w.near(fmt.Sprintf("%s embedding without wpe", dt), emb, 0)
		w.near(fmt.Sprintf("%s cross-entropy losses", dt), losses, tol)
		w.near(fmt.Sprintf("%s cross-entropy dlogits", dt), dlogits, tol)
		for _, r := range []int{3, 7} {
			if l := floats(t, d, losses.g)[r]; l != 0 {
				t.Errorf("%s: loss of ignored row %d is %v", dt, r, l)
			}
		}
	}
}

// TestAttentionPositionErrors: an attention position outside [0, t] is an
// error at Synchronize naming the op, the token (row, column) and the
// value, in the forward and in the backward, and the op leaves out, lse
// and dqkv unchanged; attention without pos, enqueued after an op that
// found bad data (a target past the vocabulary), still runs. gpu/cpu runs
// the same checks (the contract of gpu.Ops, worded as gpu/cpu words it;
// its backward names itself "attention"), so this test is checked here
// without a GPU too.
func TestAttentionPositionErrors(t *testing.T) {
	t.Run("cpu", func(t *testing.T) {
		devs, _, err := cpu.New(cpu.Options{HBMBytes: 64 * units.MiB})
		if err != nil {
			t.Fatal(err)
		}
		attnPositionErrors(t, devs[0], "gpu/cpu: attention", "gpu/cpu: attention")
	})
	t.Run("cuda", func(t *testing.T) {
		attnPositionErrors(t, newBackend(t, 1, 64*units.MiB).Device(0), "gpu/cuda: attention", "gpu/cuda: attention-backward")
	})
}

func attnPositionErrors(t *testing.T, d gpu.Device, fwd, bwd string) {
	const B, T, H, KV, D, vocab = 2, 5, 2, 1, 4, 7
	W := (H + 2*KV) * D
	r := rand.New(rand.NewPCG(3, 4))
	randF32 := func(n int) gpu.Buffer {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return put(t, d, f32bytes(v), n, gpu.F32)
	}
	nan := func(n int) gpu.Buffer {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.NaN())
		}
		return put(t, d, f32bytes(v), n, gpu.F32)
	}
	s, o := d.DefaultStream(), d.Ops()
	qkv, dout := randF32(B*T*W), randF32(B*T*H*D)
	out, lse, dqkv := nan(B*T*H*D), nan(B*H*T), nan(B*T*W)
	for _, c := range []struct {
		at   int
		val  int32
		want string
	}{
		{3, -1, "position -1 of row 0, column 3 outside [0, 3]"},
		{7, 3, "position 3 of row 1, column 2 outside [0, 2]"},
		{0, math.MaxInt32, "position 2147483647 of row 0, column 0 outside [0, 0]"},
		{9, math.MinInt32, "position -2147483648 of row 1, column 4 outside [0, 4]"},
	} {
		pv := make([]int32, B*T)
		for i := range pv {
			pv[i] = int32(i % T)
		}
		pv[c.at] = c.val
		if c.at+1 < len(pv) {
			pv[c.at+1] = -2 // a later bad token: the first is reported
		}
		pos := put(t, d, idb32(pv), len(pv), gpu.I32)
		before := [][]byte{get(t, d, out), get(t, d, lse), get(t, d, dqkv)}
		o.AttentionForward(s, qkv, out, lse, pos, B, T, H, KV, D, gpu.AttnOptions{})
		if err := s.Synchronize(); err == nil || err.Error() != fwd+": "+c.want {
			t.Errorf("forward, pos %d at token %d: error %v, want %q", c.val, c.at, err, fwd+": "+c.want)
		}
		o.AttentionBackward(s, dout, qkv, out, lse, pos, dqkv, B, T, H, KV, D, gpu.AttnOptions{})
		if err := s.Synchronize(); err == nil || err.Error() != bwd+": "+c.want {
			t.Errorf("backward, pos %d at token %d: error %v, want %q", c.val, c.at, err, bwd+": "+c.want)
		}
		for i, b := range []gpu.Buffer{out, lse, dqkv} {
			if firstDiff(get(t, d, b), before[i]) != -1 {
				t.Errorf("pos %d at token %d: %s changed", c.val, c.at, []string{"out", "lse", "dqkv"}[i])
			}
		}
	}
	// A check that failed before (a bad target) does not stop attention
	// without pos, which checks nothing.
	targets := put(t, d, idb32([]int32{vocab}), 1, gpu.I32)
	o.CrossEntropyForward(s, randF32(vocab), targets, nan(1), 1, vocab, 0)
	o.AttentionForward(s, qkv, out, lse, nil, B, T, H, KV, D, gpu.AttnOptions{})
	if err := s.Synchronize(); err == nil || !strings.Contains(err.Error(), "cross-entropy: target") {
		t.Errorf("bad target: error %v", err)
	}
	for i, v := range floats(t, d, out) {
		if math.IsNaN(float64(v)) {
			t.Fatalf("attention without pos after a failed check: out[%d] not written", i)
		}
	}
}
