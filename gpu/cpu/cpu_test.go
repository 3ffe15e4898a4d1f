package cpu_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/bf16"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/gpu/gputest"
	"github.com/strata-ai/strata/internal/units"
)

// kernels are the GEMM kernels this CPU and build can run.
func kernels() []string {
	ks := []string{cpu.KernelGonum}
	if (cpu.Options{Kernel: cpu.KernelAVX512}).WithDefaults().Validate() == nil {
		ks = append(ks, cpu.KernelAVX512)
	}
	return ks
}

func TestConformance(t *testing.T) {
	for _, k := range kernels() {
		t.Run(k, func(t *testing.T) {
			if k == cpu.KernelAVX512 {
				// Tiles of 12×64 and k blocks of 16, so that the suite's
				// small matrices cross every blocking boundary; the
				// production blocking runs in TestWorkersDoNotChangeBits
				// and model tests.
				defer cpu.SetPackedTiles(12, 64, 16)()
			}
			gputest.Run(t, func(t *testing.T, devices int) ([]gpu.Device, []gpu.Comm) {
				devs, comms, err := cpu.New(cpu.Options{Devices: devices, HBMBytes: 64 * units.MiB, Workers: 3, Kernel: k})
				if err != nil {
					t.Fatal(err)
				}
				return cpu.Devices(devs), comms
			})
		})
	}
}

// upload copies float32 values into a new buffer of dt.
func upload(t *testing.T, d *cpu.Device, vals []float32, dt gpu.DType) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(len(vals), gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s := d.DefaultStream()
	d.CopyHostToDevice(s, b, 0, f32bytes(vals))
	if dt == gpu.F32 {
		return b
	}
	c, err := d.Alloc(len(vals), dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	d.Ops().Cast(s, c, b)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	d.Free(b)
	return c
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesOf(t *testing.T, d *cpu.Device, b gpu.Buffer) []byte { return gputest.ReadBytes(t, d, b) }

func randF32(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// runWorkload runs GEMMs, attention and the reducing backward ops on one
// device and returns every output's bytes.
func runWorkload(t *testing.T, kernel string, workers int, dt gpu.DType) [][]byte {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 256 * units.MiB, Workers: workers, Kernel: kernel})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	if d.Workers() != workers {
		t.Fatalf("workers %d, want %d", d.Workers(), workers)
	}
	r := rand.New(rand.NewPCG(7, 7))
	s, ops := d.DefaultStream(), d.Ops()
	m, n, k := 130, 300, 270
	a, b := upload(t, d, randF32(r, m*k), dt), upload(t, d, randF32(r, k*n), dt)
	c := upload(t, d, randF32(r, m*n), dt)
	ops.Gemm(s, false, true, m, n, k, 1, a, b, 1, c)
	c2 := upload(t, d, randF32(r, k*n), dt)
	ops.Gemm(s, true, false, k, n, m, 0.5, a, c, 0, c2)

	// Attention over two query tiles with grouped heads (dK, dV sum over
	// the group) and packed examples.
	B, T, H, KV, hd := 2, 70, 4, 2, 8
	C := H * hd
	qkv := upload(t, d, randF32(r, B*T*(H+2*KV)*hd), dt)
	out, lse := upload(t, d, make([]float32, B*T*C), dt), upload(t, d, make([]float32, B*H*T), gpu.F32)
	pos := make([]float32, B*T)
	for i := range pos {
		pos[i] = float32(i % T % 45)
	}
	gpos := upload(t, d, pos, gpu.I32)
	dout, dqkv := upload(t, d, randF32(r, B*T*C), dt), upload(t, d, make([]float32, B*T*(H+2*KV)*hd), dt)
	ops.RopeForward(s, qkv, gpos, B, T, H, KV, hd, gpu.DefaultRope(hd, 10000))
	ops.AttentionForward(s, qkv, out, lse, gpos, B, T, H, KV, hd, gpu.AttnOptions{})
	ops.AttentionBackward(s, dout, qkv, out, lse, gpos, dqkv, B, T, H, KV, hd, gpu.AttnOptions{})
	ops.RopeBackward(s, dqkv, gpos, B, T, H, KV, hd, gpu.DefaultRope(hd, 10000))

	rows, cols := B*T, (H+2*KV)*hd
	g := upload(t, d, randF32(r, cols), dt)
	mean, rstd := upload(t, d, make([]float32, rows), gpu.F32), upload(t, d, make([]float32, rows), gpu.F32)
	y := upload(t, d, make([]float32, rows*cols), dt)
	ops.LayerNormForward(s, qkv, g, g, y, mean, rstd, rows, cols, 1e-5)
	dx, dg, db := upload(t, d, randF32(r, rows*cols), dt), upload(t, d, randF32(r, cols), dt), upload(t, d, randF32(r, cols), dt)
	ops.LayerNormBackward(s, dqkv, qkv, g, mean, rstd, dx, dg, db, rows, cols)
	ops.BiasGrad(s, dqkv, db, rows, cols)
	rs := upload(t, d, make([]float32, rows), gpu.F32)
	ops.RMSNormForward(s, qkv, g, y, rs, rows, cols, 1e-6)
	ops.RMSNormBackward(s, dqkv, qkv, g, rs, dx, dg, rows, cols)
	sw := upload(t, d, make([]float32, rows*cols/2), dt)
	ops.GLUForward(s, dqkv, sw, rows, cols/2, gpu.Silu)
	ops.GLUBackward(s, dqkv, sw, dx, rows, cols/2, gpu.Silu)

	vocab := 50
	ids := make([]float32, B*T)
	for i := range ids {
		ids[i] = float32(r.IntN(vocab))
	}
	idb := upload(t, d, ids, gpu.I32)
	dwte, dwpe := upload(t, d, randF32(r, vocab*C), dt), upload(t, d, randF32(r, T*C), dt)
	ops.EmbeddingBackward(s, idb, gpos, dout, dwte, dwpe, B, T, C)
	logits := upload(t, d, randF32(r, B*T*vocab), dt)
	losses := upload(t, d, make([]float32, B*T), gpu.F32)
	ops.CrossEntropyForward(s, logits, idb, losses, B*T, vocab, 0)
	ops.CrossEntropyBackward(s, logits, idb, logits, B*T, vocab, 0.1, 0)
	ss, _ := d.Alloc(1, gpu.F64, gpu.Tag{Purpose: "norm"})
	ops.SumSquares(s, dqkv, ss, 0)

	var res [][]byte
	for _, x := range []gpu.Buffer{c, c2, out, lse, dqkv, y, mean, rstd, rs, sw, dx, dg, db, dwte, dwpe, losses, logits, ss} {
		res = append(res, bytesOf(t, d, x))
	}
	return res
}

// TestWorkersDoNotChangeBits: every output is bit-identical for 1, 2 and
// 5 workers and across runs, with each GEMM kernel.
func TestWorkersDoNotChangeBits(t *testing.T) {
	for _, kernel := range kernels() {
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
			want := runWorkload(t, kernel, 1, dt)
			for _, w := range []int{2, 5, 5} {
				got := runWorkload(t, kernel, w, dt)
				for i := range want {
					if !bytes.Equal(got[i], want[i]) {
						t.Errorf("%s %s: output %d differs between 1 and %d workers", kernel, dt, i, w)
					}
				}
			}
		}
	}
}

// TestAttentionHoldsNoSeqSquared: the attention forward and backward at
// seq 4096 allocate (Go heap, scratch included) less than a quarter of one
// seq×seq fp32 matrix (64 MiB): the tiled algorithm holds O(seq·headDim)
// per head plus attnTile² tiles, never the scores of a whole row block.
// It runs the gonum kernel: the packed kernel's scratch comes from a
// sync.Pool, which the race detector empties at random, and would count.
func TestAttentionHoldsNoSeqSquared(t *testing.T) {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 64 * units.MiB, Workers: 1, Kernel: "gonum"})
	if err != nil {
		t.Fatal(err)
	}
	d, r := devs[0], rand.New(rand.NewPCG(3, 3))
	const T, hd = 4096, 16
	qkv := upload(t, d, randF32(r, T*3*hd), gpu.F32)
	out, lse := upload(t, d, make([]float32, T*hd), gpu.F32), upload(t, d, make([]float32, T), gpu.F32)
	dout, dqkv := upload(t, d, randF32(r, T*hd), gpu.F32), upload(t, d, make([]float32, T*3*hd), gpu.F32)
	s := d.DefaultStream()
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	d.Ops().AttentionForward(s, qkv, out, lse, nil, 1, T, 1, 1, hd, gpu.AttnOptions{})
	d.Ops().AttentionBackward(s, dout, qkv, out, lse, nil, dqkv, 1, T, 1, 1, hd, gpu.AttnOptions{})
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(T*T*4/4); got > limit {
		t.Errorf("attention at seq %d allocated %d bytes, limit %d (a seq×seq fp32 matrix is %d)", T, got, limit, T*T*4)
	} else {
		t.Logf("attention at seq %d allocated %d bytes (a seq×seq fp32 matrix is %d)", T, got, T*T*4)
	}
}

// torchAdam is a float64 transcription of one step of PyTorch's
// torch.optim.AdamW (_single_tensor_adamw, amsgrad=False,
// maximize=False), and of torch.optim.Adam with weight_decay for
// gpu.AdamL2, with the gradient multiplied by GradScale first (the loss
// scale and clip coefficient the engine folds in):
//
//	grad = grad * grad_scale
//	param.mul_(1 - lr * weight_decay)              # AdamW only
//	grad = grad.add(param, alpha=weight_decay)     # Adam (L2) only
//	exp_avg.lerp_(grad, 1 - beta1)
//	exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//	bias_correction1 = 1 - beta1 ** step
//	bias_correction2 = 1 - beta2 ** step
//	denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//	param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
//
// It shares nothing with cpuadam, the device's implementation.
func torchAdam(p gpu.AdamParams, param, grad, m, v []float64) {
	bc1 := 1 - math.Pow(p.Beta1, float64(p.Step))
	bc2 := 1 - math.Pow(p.Beta2, float64(p.Step))
	for i := range param {
		g := grad[i] * p.GradScale
		if p.Mode == gpu.AdamL2 {
			g += p.WeightDecay * param[i]
		} else {
			param[i] *= 1 - p.LR*p.WeightDecay
		}
		m[i] += (g - m[i]) * (1 - p.Beta1)
		v[i] = v[i]*p.Beta2 + (1-p.Beta2)*g*g
		denom := math.Sqrt(v[i])/math.Sqrt(bc2) + p.Eps
		param[i] -= p.LR / bc1 * m[i] / denom
	}
}

// TestAdamAgainstPyTorch runs 30 device Adam steps (f32 and bf16
// gradients, AdamW and L2, over several of the backend's parallel chunks)
// and the float64 transcription of PyTorch from the same start, with the
// gradients the device sees, and compares param, m and v after every step.
//
// Tolerances, and why: the device rounds each operation of a step to
// float32, about 3 roundings of |p| per step (≤ 1.5 ulp ≈ 1.8e-7 relative),
// and PyTorch's order differs by at most an ulp per step (cpuadam's doc);
// over T steps the error grows at most linearly, so |Δparam| ≤ T × 2 ulp ≈
// T × 2.4e-7 × max(1, |p|): we assert 1e-5 × max(1, |p|) for T = 30. m and
// v are contracting averages of g and g²; g = grad×gs (+ wd×p for L2) is
// rounded relative to its terms, not to itself (they may cancel), so m
// and v are compared with the same averages of the terms' magnitudes
// |grad×gs| + wd×max(1, |p|): |Δm| ≤ 1e-5 × avg|terms| and |Δv| ≤ 1e-5 ×
// avg|terms|² (a few ulp a step over T steps, with margin; measured:
// below 3e-6 for param, 1e-6 for m and v). A wrong
// formula is off by O(lr) = 1e-3 per step in param (O(1) relative in m or
// v), far outside these bounds.
func TestAdamAgainstPyTorch(t *testing.T) {
	devs, _, err := cpu.New(cpu.Options{HBMBytes: 64 * units.MiB, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	const steps = 30
	n := 3<<16 + 123 // four of AdamStep's parallel chunks, the last partial
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		for _, mode := range []gpu.AdamMode{gpu.AdamW, gpu.AdamL2} {
			r := rand.New(rand.NewPCG(8, uint64(mode)))
			p := gpu.AdamParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Mode: mode}
			param := randF32(r, n)
			p64, m64, v64, g64 := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
			mMag, vMag := make([]float64, n), make([]float64, n) // m and v of the magnitudes of g's terms
			for i, x := range param {
				p64[i] = float64(x)
			}
			gp, gm, gv := upload(t, d, param, gpu.F32), upload(t, d, make([]float32, n), gpu.F32), upload(t, d, make([]float32, n), gpu.F32)
			out, _ := d.Alloc(n, gpu.BF16, gpu.Tag{Purpose: "out"})
			var worst [3]float64 // largest |Δ| / magnitude of param, m and v
			for step := int64(1); step <= steps; step++ {
				p.Step, p.GradScale = step, 1/math.Pow(2, float64(step%4)) // a changing loss scale
				grad := randF32(r, n)
				for i := range grad {
					grad[i] = (grad[i] + 0.3) * float32(math.Pow(2, float64(step%4)))
				}
				gg := upload(t, d, grad, dt)
				gradSeen := f32s(bytesOf(t, d, gg), dt) // bf16: the rounded gradient
				d.Ops().AdamStep(d.DefaultStream(), gp, gg, gm, gv, out, p)
				for i, g := range gradSeen {
					g64[i] = float64(g)
				}
				torchAdam(p, p64, g64, m64, v64)
				gotP, gotM, gotV := f32s(bytesOf(t, d, gp), gpu.F32), f32s(bytesOf(t, d, gm), gpu.F32), f32s(bytesOf(t, d, gv), gpu.F32)
				d.Free(gg)
				for i := range n {
					pMag := max(1, math.Abs(p64[i]))
					gMag := math.Abs(g64[i])*p.GradScale + p.WeightDecay*pMag // the terms of g
					mMag[i] = p.Beta1*mMag[i] + (1-p.Beta1)*gMag
					vMag[i] = p.Beta2*vMag[i] + (1-p.Beta2)*gMag*gMag
					dp := math.Abs(float64(gotP[i])-p64[i]) / pMag
					dm, dv := math.Abs(float64(gotM[i])-m64[i])/mMag[i], math.Abs(float64(gotV[i])-v64[i])/vMag[i]
					worst = [3]float64{max(worst[0], dp), max(worst[1], dm), max(worst[2], dv)}
					if dp > 1e-5 || dm > 1e-5 || dv > 1e-5 {
						t.Fatalf("%s grads, %s, step %d, element %d: param %.9g m %.9g v %.9g, PyTorch %.9g %.9g %.9g",
							dt, mode, step, i, gotP[i], gotM[i], gotV[i], p64[i], m64[i], v64[i])
					}
				}
				if ob := bytesOf(t, d, out); !bytes.Equal(ob, bf16bytes(gotP)) {
					t.Fatalf("%s grads, %s, step %d: bf16 out is not the new params rounded", dt, mode, step)
				}
			}
			t.Logf("%s grads, %s: largest |Δ|/magnitude: param %.2g, m %.2g, v %.2g (bound 1e-5)", dt, mode, worst[0], worst[1], worst[2])
			d.Free(gp)
			d.Free(gm)
			d.Free(gv)
			d.Free(out)
		}
	}
	// Hyper-parameters the formula rejects are a stream error.
	x, _ := d.Alloc(4, gpu.F32, gpu.Tag{Purpose: "x"})
	d.Ops().AdamStep(d.DefaultStream(), x, x, x, x, nil, gpu.AdamParams{LR: 1, Beta1: 0.9, Beta2: 0.9, Eps: 1e-8, Step: 0, GradScale: 1})
	if err := d.DefaultStream().Synchronize(); err == nil {
		t.Error("adam step 0: no error")
	}
}

// f32s decodes the bytes of a buffer of dt (F32 or BF16) as float32 values.
func f32s(b []byte, dt gpu.DType) []float32 {
	out := make([]float32, len(b)/dt.Size())
	for i := range out {
		if dt == gpu.F32 {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		} else {
			out[i] = bf16.ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out
}

// bf16bytes is v rounded to bf16, as bytes.
func bf16bytes(v []float32) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], bf16.FromFloat32(x))
	}
	return b
}

// TestCollectiveCounters: the ring-algorithm byte counts of comm.go.
func TestCollectiveCounters(t *testing.T) {
	devs, comms, err := cpu.New(cpu.Options{Devices: 4, HBMBytes: 16 * units.MiB})
	if err != nil {
		t.Fatal(err)
	}
	bufs := make([]gpu.Buffer, 4)
	recv := make([]gpu.Buffer, 4)
	for r, d := range devs {
		bufs[r], _ = d.Alloc(100, gpu.F32, gpu.Tag{Purpose: "b"})
		recv[r], _ = d.Alloc(400, gpu.F32, gpu.Tag{Purpose: "r"})
		comms[r].AllReduce(d.DefaultStream(), recv[r], gpu.Sum)              // 2*3/4*1600 = 2400
		comms[r].AllGather(d.DefaultStream(), bufs[r], recv[r])              // 3*400 = 1200
		comms[r].ReduceScatter(d.DefaultStream(), recv[r], bufs[r], gpu.Avg) // 3*400 = 1200
		comms[r].Broadcast(d.DefaultStream(), bufs[r], 2)                    // 400 except rank 1
	}
	for r, d := range devs {
		if err := d.DefaultStream().Synchronize(); err != nil {
			t.Fatal(err)
		}
		want := int64(2400 + 1200 + 1200 + 400)
		if r == 1 {
			want -= 400
		}
		if got := d.Counters().Collective; got != want {
			t.Errorf("rank %d: collective bytes %d, want %d", r, got, want)
		}
	}
}

func TestOptions(t *testing.T) {
	o := cpu.Options{}.WithDefaults()
	if o.Devices != 1 || o.HBMBytes != cpu.DefaultHBMBytes || o.Workers < 1 {
		t.Errorf("defaults: %v", o)
	}
	if o := (cpu.Options{Devices: 64}).WithDefaults(); o.Workers != 1 {
		t.Errorf("64 devices on few cores: workers %d, want 1", o.Workers)
	}
	for _, bad := range []cpu.Options{{Devices: -1}, {HBMBytes: -5}, {Workers: -2}} {
		if _, _, err := cpu.New(bad); err == nil {
			t.Errorf("New(%v): no error", bad)
		}
	}
}

// TestStreamsLeaveNoGoroutines: a stream's goroutine exits once its queue
// is empty, so backends need no closing.
func TestStreamsLeaveNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	devs, comms, err := cpu.New(cpu.Options{Devices: 3, HBMBytes: 16 * units.MiB, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for r, d := range devs {
		x, _ := d.Alloc(1000, gpu.F32, gpu.Tag{Purpose: "x"})
		s := d.NewStream()
		d.Ops().Fill(s, x, float32(r))
		comms[r].AllReduce(s, x, gpu.Sum)
		e := d.NewEvent()
		s.Record(e)
		d.DefaultStream().Wait(e)
		d.Ops().Scale(d.DefaultStream(), x, 2)
	}
	for _, d := range devs {
		if err := d.DefaultStream().Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before the backend", runtime.NumGoroutine(), before)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEventStamps: a CPU event is a gpu.TimedEvent stamped when its stream
// reaches it: not before (an event behind a wait on another stream is
// stamped after the event it waited for), in the stream's order, and never
// after the host sees it complete; an event never recorded has no stamp.
func TestEventStamps(t *testing.T) {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 16 * units.MiB})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	var te gpu.TimedEvent
	if te, _ = d.NewEvent().(gpu.TimedEvent); te == nil {
		t.Fatal("a gpu/cpu event is not a gpu.TimedEvent")
	}
	if _, ok := te.CompletedAt(); ok {
		t.Fatal("an event never recorded has a stamp")
	}
	other, s := d.NewStream(), d.NewStream()
	x, _ := d.Alloc(1<<16, gpu.F32, gpu.Tag{Purpose: "x"})
	s.Record(te) // s reaches it at once
	blocker := d.NewEvent()
	d.Ops().Fill(other, x, 1) // work on the other stream
	other.Record(blocker)     // completes after that work
	s.Wait(blocker)           // s waits for the other stream
	late := d.NewEvent().(gpu.TimedEvent)
	s.Record(late) // reached only once blocker has completed
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	seen := time.Now()
	t0, ok0 := te.CompletedAt()
	t1, ok1 := late.CompletedAt()
	tb, okb := blocker.(gpu.TimedEvent).CompletedAt()
	switch {
	case !ok0 || !ok1 || !okb:
		t.Fatalf("complete events without stamps: %v %v %v", ok0, ok1, okb)
	case t1.Before(tb):
		t.Errorf("the event after the wait is stamped %v before the event it waited for (%v)", t1, tb)
	case t1.Before(t0) || seen.Before(t1):
		t.Errorf("stamps out of order: first %v, after the wait %v, seen %v", t0, t1, seen)
	}
}

// TestColumnSumOrder: BiasGrad and the norms' gamma (and beta) gradients
// sum each column in gpu.ColumnBlockRows order (the rows of each block in
// fp32 from 0, then the blocks' sums), the order gpu/cuda's kernels keep
// (its emulator test checks the same bits); 700 rows of values spanning
// six binades make the plain row-order sum differ, so the test tells the
// orders apart.
func TestColumnSumOrder(t *testing.T) {
	devs, _, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: 64 * units.MiB, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	rows, cols := 700, 9
	r := rand.New(rand.NewPCG(3, 4))
	dyv := make([]float32, rows*cols)
	for i := range dyv {
		dyv[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(6)))
	}
	db0 := randF32(r, cols)
	dy, db := upload(t, d, dyv, gpu.F32), upload(t, d, db0, gpu.F32)
	d.Ops().BiasGrad(d.DefaultStream(), dy, db, rows, cols)
	got := bytesOf(t, d, db)
	differs := false
	for c := range cols {
		var acc, part, plain float32
		for i := range rows {
			v := dyv[i*cols+c]
			part += v
			plain += v
			if (i+1)%gpu.ColumnBlockRows == 0 || i+1 == rows {
				acc += part
				part = 0
			}
		}
		if g := math.Float32frombits(binary.LittleEndian.Uint32(got[4*c:])); g != db0[c]+acc {
			t.Fatalf("column %d: %v, want %v (the blocked order)", c, g, db0[c]+acc)
		}
		differs = differs || acc != plain
	}
	if !differs {
		t.Fatal("the blocked and the plain row-order sums agree on every column: the test does not tell them apart")
	}
}

// TestScratchOneDevice: on one device an AllGather is a copy and a
// Broadcast nothing, so reserving their scratch takes none from the
// driver; on two it does (the gathered buffer).
func TestScratchOneDevice(t *testing.T) {
	for _, n := range []int{1, 2} {
		devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 64 * units.MiB})
		if err != nil {
			t.Fatal(err)
		}
		before := devs[0].DriverCounters()
		for _, k := range []gpu.Collective{gpu.CollAllGather, gpu.CollBroadcast} {
			if err := comms[0].(gpu.ScratchReserver).ReserveScratch(k, 1<<20, gpu.BF16); err != nil {
				t.Fatal(err)
			}
		}
		got := devs[0].DriverCounters().Allocs - before.Allocs
		if n == 1 && got != 0 {
			t.Errorf("one device: reserving the AllGather and Broadcast scratch took %d driver allocations", got)
		}
		if n == 2 && got == 0 {
			t.Errorf("two devices: reserving the AllGather scratch took no driver allocation")
		}
	}
}
