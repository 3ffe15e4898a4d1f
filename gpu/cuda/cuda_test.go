package cuda_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/gpu/cuda"
	"github.com/strata-ai/strata/gpu/gputest"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/units"
)

// newBackend skips the test where there is no CUDA driver or GPU (CI) and
// fails it when the driver loads but anything else breaks.
func newBackend(t testing.TB, devices int, hbm int64) *cuda.Backend {
	t.Helper()
	b, err := cuda.New(cuda.Options{Devices: devices, HBMBytes: hbm})
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Skipf("no CUDA driver or GPU here: %v", err)
	}
	if err != nil {
		t.Fatalf("cuda backend: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return b
}

func TestProbe(t *testing.T) {
	inf, err := cuda.Probe()
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Skipf("no CUDA driver or GPU here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s (CUDA %d), nvrtc %s (%s), cublas %s; %s; %s", inf.DriverPath, inf.DriverVersion, inf.NVRTCVersion, inf.NVRTCPath, inf.CublasPath, inf.Gemm, inf.KernelCache)
	for _, g := range inf.GPUs {
		t.Logf("GPU %d: %s, compute %s, %d SMs, %s, stream memory ops %v", g.Ordinal, g.Name, g.ComputeCapability, g.Multiprocessors, units.FormatBytes(g.TotalBytes), g.StreamMemoryOps)
	}
}

func TestConformance(t *testing.T) {
	gputest.Run(t, func(t *testing.T, devices int) ([]gpu.Device, []gpu.Comm) {
		b := newBackend(t, devices, 256*units.MiB)
		return b.Devices(), b.Comms()
	})
}

func f32bytes(v []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

func u16bytes(v []uint16) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 2*len(v))
}

func put(t *testing.T, d gpu.Device, data []byte, n int, dt gpu.DType) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(n, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(b) })
	s := d.DefaultStream()
	d.CopyHostToDevice(s, b, 0, data)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

func get(t *testing.T, d gpu.Device, b gpu.Buffer) []byte { return gputest.ReadBytes(t, d, b) }

// TestAdamMatchesCPUAdam: the device Adam gives cpuadam's bits exactly
// (the kernel follows cpuadam's reference operation for operation).
func TestAdamMatchesCPUAdam(t *testing.T) {
	d := newBackend(t, 1, 256*units.MiB).Device(0)
	r := rand.New(rand.NewPCG(1, 2))
	n := 100_003
	for _, gradDT := range []gpu.DType{gpu.F32, gpu.BF16} {
		for _, mode := range []gpu.AdamMode{gpu.AdamW, gpu.AdamL2} {
			p := gpu.AdamParams{LR: 3e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Step: 7, GradScale: 0.125, Mode: mode}
			param, grad, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range param {
				param[i], grad[i] = float32(r.NormFloat64()), float32(r.NormFloat64()*10)
				m[i], v[i] = float32(r.NormFloat64()*0.1), float32(r.Float64()*0.01)
			}
			param[0], grad[1] = 1e-40, 0 // a subnormal, a zero gradient
			gb := bf16s(grad)
			gp, gm, gv := put(t, d, f32bytes(param), n, gpu.F32), put(t, d, f32bytes(m), n, gpu.F32), put(t, d, f32bytes(v), n, gpu.F32)
			var gg gpu.Buffer
			if gradDT == gpu.F32 {
				gg = put(t, d, f32bytes(grad), n, gpu.F32)
			} else {
				gg = put(t, d, u16bytes(gb), n, gpu.BF16)
			}
			out, err := d.Alloc(n, gpu.BF16, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"})
			if err != nil {
				t.Fatal(err)
			}
			d.Ops().AdamStep(d.DefaultStream(), gp, gg, gm, gv, out, p)
			wantOut := make([]uint16, n)
			if gradDT == gpu.F32 {
				cpuadam.StepF32(p, param, grad, m, v, wantOut)
			} else {
				cpuadam.StepBF16(p, param, gb, m, v, wantOut)
			}
			for name, pair := range map[string][2][]byte{
				"param": {get(t, d, gp), f32bytes(param)}, "m": {get(t, d, gm), f32bytes(m)},
				"v": {get(t, d, gv), f32bytes(v)}, "out": {get(t, d, out), u16bytes(wantOut)},
			} {
				if diff := firstDiff(pair[0], pair[1]); diff >= 0 {
					t.Errorf("grad %s %s: %s differs from cpuadam first at byte %d", gradDT, mode, name, diff)
				}
			}
			d.Free(out)
		}
	}
	// Hyper-parameters cpuadam rejects are an error at Synchronize.
	x := put(t, d, f32bytes(make([]float32, 8)), 8, gpu.F32)
	s := d.DefaultStream()
	d.Ops().AdamStep(s, x, x, x, x, nil, gpu.AdamParams{LR: 1, Beta1: 2, Beta2: 0.9, Eps: 1e-8, Step: 1, GradScale: 1})
	if err := s.Synchronize(); err == nil {
		t.Error("adam with beta1 = 2: no error")
	}
}

func bf16s(v []float32) []uint16 {
	out := make([]uint16, len(v))
	bf16.FromFloat32s(out, v)
	return out
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestMatchesCPUBackend runs ops whose summation order gpu/cuda documents
// as gpu/cpu's (embedding backward, with and without pos, and the bias
// gradient) on both backends and compares bits.
func TestMatchesCPUBackend(t *testing.T) {
	d := newBackend(t, 1, 512*units.MiB).Device(0)
	cdevs, _, err := cpu.New(cpu.Options{HBMBytes: 512 * units.MiB})
	if err != nil {
		t.Fatal(err)
	}
	c := cdevs[0]
	r := rand.New(rand.NewPCG(3, 4))
	randF := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	both := func(data []byte, n int, dt gpu.DType) (gpu.Buffer, gpu.Buffer) {
		return put(t, d, data, n, dt), put(t, c, data, n, dt)
	}
	B, T, dim, vocab := 4, 64, 96, 50
	ids := make([]int32, B*T)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	idb := unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*len(ids))
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16} {
		enc := func(v []float32) []byte {
			if dt == gpu.F32 {
				return f32bytes(v)
			}
			return u16bytes(bf16s(v))
		}
		gi, ci := both(idb, B*T, gpu.I32)
		gdo, cdo := both(enc(randF(B*T*dim)), B*T*dim, dt)
		gwte, cwte := both(enc(randF(vocab*dim)), vocab*dim, dt)
		gwpe, cwpe := both(enc(randF(T*dim)), T*dim, dt)
		d.Ops().EmbeddingBackward(d.DefaultStream(), gi, nil, gdo, gwte, gwpe, B, T, dim)
		c.Ops().EmbeddingBackward(c.DefaultStream(), ci, nil, cdo, cwte, cwpe, B, T, dim)
		// packed examples: positions restart, so rows of dwpe repeat
		gp, cp := both(idb32(packedPos(r, B, T)), B*T, gpu.I32)
		gwpe2, cwpe2 := both(enc(randF(T*dim)), T*dim, dt)
		d.Ops().EmbeddingBackward(d.DefaultStream(), gi, gp, gdo, gwte, gwpe2, B, T, dim)
		c.Ops().EmbeddingBackward(c.DefaultStream(), ci, cp, cdo, cwte, cwpe2, B, T, dim)
		gb, cb := both(enc(randF(dim)), dim, dt)
		d.Ops().BiasGrad(d.DefaultStream(), gdo, gb, B*T, dim)
		c.Ops().BiasGrad(c.DefaultStream(), cdo, cb, B*T, dim)
		for name, pair := range map[string][2]gpu.Buffer{"dwte": {gwte, cwte}, "dwpe": {gwpe, cwpe}, "dwpe with pos": {gwpe2, cwpe2}, "dbias": {gb, cb}} {
			if i := firstDiff(get(t, d, pair[0]), get(t, c, pair[1])); i >= 0 {
				t.Errorf("%s %s: bits differ from gpu/cpu at byte %d", dt, name, i)
			}
		}
	}
}

// TestDeterministic: the same ops twice give the same bits.
func TestDeterministic(t *testing.T) {
	d := newBackend(t, 1, 512*units.MiB).Device(0)
	r := rand.New(rand.NewPCG(5, 6))
	m, n, k := 512, 384, 1000
	a, b := make([]uint16, m*k), make([]uint16, k*n)
	for i := range a {
		a[i] = bf16.FromFloat32(float32(r.NormFloat64()))
	}
	for i := range b {
		b[i] = bf16.FromFloat32(float32(r.NormFloat64()))
	}
	ga, gb := put(t, d, u16bytes(a), m*k, gpu.BF16), put(t, d, u16bytes(b), k*n, gpu.BF16)
	// grouped-query attention over packed examples, head dimension 64
	B, T, H, KV, hd := 2, 200, 4, 2, 64
	qkv := make([]float32, B*T*(H+2*KV)*hd)
	for i := range qkv {
		qkv[i] = float32(r.NormFloat64())
	}
	gq := put(t, d, f32bytes(qkv), len(qkv), gpu.F32)
	gp := put(t, d, idb32(packedPos(r, B, T)), B*T, gpu.I32)
	var prev [][]byte
	for run := range 2 {
		c, _ := d.Alloc(m*n, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "c"})
		out, _ := d.Alloc(B*T*H*hd, gpu.BF16, gpu.Tag{Kind: gpu.Workspace, Purpose: "out"})
		lse, _ := d.Alloc(B*H*T, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "lse"})
		dq, _ := d.Alloc(len(qkv), gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "dqkv"})
		ss, _ := d.Alloc(1, gpu.F64, gpu.Tag{Kind: gpu.Workspace, Purpose: "ss"})
		s := d.DefaultStream()
		d.Ops().Gemm(s, false, true, m, n, k, 1, ga, gb.Slice(0, k*n), 0, c)
		d.Ops().AttentionForward(s, gq, out, lse, gp, B, T, H, KV, hd, gpu.AttnOptions{})
		d.Ops().AttentionBackward(s, out, gq, out, lse, gp, dq, B, T, H, KV, hd, gpu.AttnOptions{})
		d.Ops().SumSquares(s, dq, ss, 0)
		res := [][]byte{get(t, d, c), get(t, d, out), get(t, d, lse), get(t, d, dq), get(t, d, ss)}
		if run == 1 {
			for i := range res {
				if firstDiff(res[i], prev[i]) >= 0 {
					t.Errorf("result %d differs between two runs", i)
				}
			}
		}
		prev = res
		for _, x := range []gpu.Buffer{c, out, lse, dq, ss} {
			d.Free(x)
		}
	}
	if v := math.Float64frombits(leU64(prev[4])); !(v > 0) {
		t.Errorf("sum of squares of dqkv %v", v)
	}
}

func leU64(b []byte) uint64 { return *(*uint64)(unsafe.Pointer(&b[0])) }

func idb32(v []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

// packedPos returns positions of batch rows of seq tokens packed with
// examples of random lengths (each position restarts at 0).
func packedPos(r *rand.Rand, batch, seq int) []int32 {
	pos := make([]int32, batch*seq)
	for b := range batch {
		start := 0
		for t := range seq {
			if t > 0 && r.IntN(9) == 0 {
				start = t
			}
			pos[b*seq+t] = int32(t - start)
		}
	}
	return pos
}

// TestHostRegistrar: page-locked host memory round-trips through the
// device, and unregistering works.
func TestHostRegistrar(t *testing.T) {
	b := newBackend(t, 1, 64*units.MiB)
	d := b.Device(0)
	mem := make([]byte, 1<<20)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	reg := b.HostRegistrar()
	if err := reg.Register(0, mem); err != nil {
		t.Fatal(err)
	}
	x := put(t, d, mem, len(mem)/4, gpu.F32)
	clear(mem)
	s := d.DefaultStream()
	d.CopyDeviceToHost(s, mem, x, 0)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i := range mem {
		if mem[i] != byte(i*7) {
			t.Fatalf("byte %d = %d after a round trip through registered memory", i, mem[i])
		}
	}
	if err := reg.Unregister(0, mem); err != nil {
		t.Fatal(err)
	}
	if err := reg.Unregister(0, mem); err == nil {
		t.Error("a second Unregister of the same memory succeeded")
	}
}
