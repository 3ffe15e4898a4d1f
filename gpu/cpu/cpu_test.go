package cpu_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/strata-ai/strata/cpuadam"
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

func bytesOf(t *testing.T, d *cpu.Device, b gpu.Buffer) []byte {
	t.Helper()
	out := make([]byte, b.Bytes())
	s := d.DefaultStream()
	d.CopyDeviceToHost(s, out, b, 0)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return out
}

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

	B, T, H, hd := 2, 40, 3, 8
	C := H * hd
	qkv := upload(t, d, randF32(r, B*T*3*C), dt)
	out, att := upload(t, d, make([]float32, B*T*C), dt), upload(t, d, make([]float32, B*H*T*T), gpu.F32)
	dout, dqkv := upload(t, d, randF32(r, B*T*C), dt), upload(t, d, make([]float32, B*T*3*C), dt)
	ops.AttentionForward(s, qkv, out, att, B, T, H, hd)
	ops.AttentionBackward(s, dout, qkv, att, dqkv, B, T, H, hd)

	rows, cols := B*T, 3*C
	g := upload(t, d, randF32(r, cols), dt)
	mean, rstd := upload(t, d, make([]float32, rows), gpu.F32), upload(t, d, make([]float32, rows), gpu.F32)
	y := upload(t, d, make([]float32, rows*cols), dt)
	ops.LayerNormForward(s, qkv, g, g, y, mean, rstd, rows, cols, 1e-5)
	dx, dg, db := upload(t, d, randF32(r, rows*cols), dt), upload(t, d, randF32(r, cols), dt), upload(t, d, randF32(r, cols), dt)
	ops.LayerNormBackward(s, dqkv, qkv, g, mean, rstd, dx, dg, db, rows, cols)
	ops.BiasGrad(s, dqkv, db, rows, cols)

	vocab := 50
	ids := make([]float32, B*T)
	for i := range ids {
		ids[i] = float32(r.IntN(vocab))
	}
	idb := upload(t, d, ids, gpu.I32)
	dwte, dwpe := upload(t, d, randF32(r, vocab*C), dt), upload(t, d, randF32(r, T*C), dt)
	ops.EmbeddingBackward(s, idb, dout, dwte, dwpe, B, T, C)
	logits := upload(t, d, randF32(r, B*T*vocab), dt)
	losses := upload(t, d, make([]float32, B*T), gpu.F32)
	ops.CrossEntropyForward(s, logits, idb, losses, B*T, vocab)
	ops.CrossEntropyBackward(s, logits, idb, logits, B*T, vocab, 0.1)
	ss, _ := d.Alloc(1, gpu.F64, gpu.Tag{Purpose: "norm"})
	ops.SumSquares(s, dqkv, ss, 0)

	var res [][]byte
	for _, x := range []gpu.Buffer{c, c2, out, att, dqkv, y, mean, rstd, dx, dg, db, dwte, dwpe, losses, logits, ss} {
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

// TestAdamMatchesCPUAdam: the device step gives the bits of one cpuadam
// call over the whole buffer.
func TestAdamMatchesCPUAdam(t *testing.T) {
	devs, _, err := cpu.New(cpu.Options{HBMBytes: 64 * units.MiB, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	d := devs[0]
	r := rand.New(rand.NewPCG(8, 8))
	n := 3<<16 + 123
	p := gpu.AdamParams{LR: 3e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 7, GradScale: 0.25}
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		param, grad, m := randF32(r, n), randF32(r, n), randF32(r, n)
		v := randF32(r, n)
		for i := range v {
			v[i] *= v[i]
		}
		gp, gg, gm, gv := upload(t, d, param, gpu.F32), upload(t, d, grad, dt), upload(t, d, m, gpu.F32), upload(t, d, v, gpu.F32)
		out, _ := d.Alloc(n, gpu.BF16, gpu.Tag{Purpose: "out"})
		d.Ops().AdamStep(d.DefaultStream(), gp, gg, gm, gv, out, p)

		hostOut := make([]uint16, n)
		cp := cpuadam.Params{LR: p.LR, Beta1: p.Beta1, Beta2: p.Beta2, Eps: p.Eps, WeightDecay: p.WeightDecay, Step: p.Step, GradScale: p.GradScale, Mode: cpuadam.AdamW}
		if dt == gpu.F32 {
			cpuadam.StepF32(cp, param, grad, m, v, hostOut)
		} else {
			g16 := make([]uint16, n)
			bf16.FromFloat32s(g16, grad)
			cpuadam.StepBF16(cp, param, g16, m, v, hostOut)
		}
		if !bytes.Equal(bytesOf(t, d, gp), f32bytes(param)) || !bytes.Equal(bytesOf(t, d, gm), f32bytes(m)) || !bytes.Equal(bytesOf(t, d, gv), f32bytes(v)) {
			t.Errorf("%s grads: device Adam differs from cpuadam", dt)
		}
		ob := bytesOf(t, d, out)
		for i, h := range hostOut {
			if binary.LittleEndian.Uint16(ob[2*i:]) != h {
				t.Fatalf("%s grads: bf16 out[%d] differs from cpuadam", dt, i)
			}
		}
	}
	// Hyper-parameters cpuadam rejects are a stream error.
	x, _ := d.Alloc(4, gpu.F32, gpu.Tag{Purpose: "x"})
	d.Ops().AdamStep(d.DefaultStream(), x, x, x, x, nil, gpu.AdamParams{LR: 1, Beta1: 0.9, Beta2: 0.9, Eps: 1e-8, Step: 0, GradScale: 1})
	if err := d.DefaultStream().Synchronize(); err == nil {
		t.Error("adam step 0: no error")
	}
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
