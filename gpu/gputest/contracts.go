package gputest

import (
	"math"
	"runtime"
	"slices"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// alien is a Buffer, and alienStream a Stream, of no backend.
type alien struct{ gpu.Buffer }

type alienStream struct{ gpu.Stream }

// refusal is one call that breaks a contract of the gpu interfaces.
type refusal struct {
	what string
	call func()
}

// refused checks that every call panics when enqueued, with a message of
// the backend and not a crash of its own (a runtime error: nil
// dereference, index out of range).
func refused(t *testing.T, calls []refusal) {
	t.Helper()
	for _, c := range calls {
		r := recovered(c.call)
		switch r.(type) {
		case nil:
			t.Errorf("%s: not refused", c.what)
		case runtime.Error:
			t.Errorf("%s: crashed instead of refusing: %v", c.what, r)
		}
	}
}

func recovered(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

// testContracts: every Device, Ops and Comm call with a bad argument
// (length, dtype, dimension, device, stream, freed or foreign buffer,
// range, op, root) is refused when it is enqueued, enqueues nothing (the
// streams report no error and the buffers are unchanged), and consumes no
// collective round (the next collective still pairs up).
func testContracts(t *testing.T, nb NewBackend) {
	devs, comms := nb(t, 2)
	d, d1 := devs[0], devs[1]
	s, s1 := d.DefaultStream(), d1.DefaultStream()
	ops := d.Ops()
	vals := randVals(newRand(41), 64, 1)
	x := upload(t, d, s, vals, gpu.F32)
	y := upload(t, d, s, vals, gpu.F32)
	h := alloc(t, d, 64, gpu.BF16)
	ids := alloc(t, d, 8, gpu.I32)
	f64 := alloc(t, d, 2, gpu.F64)
	other := alloc(t, d1, 64, gpu.F32)
	freed, err := d.Alloc(64, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "freed"})
	if err != nil {
		t.Fatal(err)
	}
	d.Free(freed)
	host := make([]byte, 64*4)
	args := contractArgs{d: d, d1: d1, s: s, s1: s1, ops: ops, comms: comms, x: x, y: y, h: h, ids: ids, f64: f64, other: other, freed: freed, host: host}
	refused(t, slices.Concat(bufferRefusals(args), layerRefusals(args), kernelRefusals(args)))
	// Nothing was enqueued: no stream error, no buffer changed, and the
	// collectives still pair up (a refused call takes no round).
	for r, st := range []gpu.Stream{s, s1} {
		if err := st.Synchronize(); err != nil {
			t.Errorf("device %d: a refused call left an error: %v", r, err)
		}
	}
	if got := download(t, d, s, x); !equalBits(got, stored(vals, gpu.F32)) {
		t.Error("a refused call changed a buffer")
	}
	a := upload(t, d, s, []float64{1, 2}, gpu.F32)
	b := upload(t, d1, s1, []float64{10, 20}, gpu.F32)
	comms[0].AllReduce(s, a, gpu.Sum)
	comms[1].AllReduce(s1, b, gpu.Sum)
	if ga, gb := download(t, d, s, a), download(t, d1, s1, b); ga[0] != 11 || ga[1] != 22 || !equalBits(ga, gb) {
		t.Errorf("all-reduce after refused collectives: %v and %v, want [11 22]", ga, gb)
	}
}

// contractArgs are the devices, streams and buffers the refused calls of
// testContracts are made with.
type contractArgs struct {
	d, d1                           gpu.Device
	s, s1                           gpu.Stream
	ops                             gpu.Ops
	comms                           []gpu.Comm
	x, y, h, ids, f64, other, freed gpu.Buffer
	host                            []byte
}

// bufferRefusals are the refused calls on device, buffer and stream arguments: allocation, free, slicing, copies, and an op on a buffer or stream it may not use.
func bufferRefusals(a contractArgs) []refusal {
	d, s, s1, ops, x, other, freed, host := a.d, a.s, a.s1, a.ops, a.x, a.other, a.freed, a.host
	return []refusal{
		{"alloc of -1 elements", func() { d.Alloc(-1, gpu.F32, gpu.Tag{}) }},
		{"alloc of an unknown kind", func() { d.Alloc(4, gpu.F32, gpu.Tag{Kind: gpu.Kind(gpu.KindCount)}) }},
		{"free of a foreign buffer", func() { d.Free(alien{}) }},
		{"free on another device", func() { d.Free(other) }},
		{"free of a view", func() { d.Free(x.Slice(0, 4)) }},
		{"double free", func() { d.Free(freed) }},
		{"slice past the end", func() { x.Slice(60, 5) }},
		{"slice at a negative offset", func() { x.Slice(-1, 2) }},
		{"h2d at a negative offset", func() { d.CopyHostToDevice(s, x, -4, host[:4]) }},
		{"h2d past the end", func() { d.CopyHostToDevice(s, x, 4, host) }},
		{"d2h past the end", func() { d.CopyDeviceToHost(s, append(host, 0), x, 0) }},
		{"d2d source past the end", func() { d.CopyDeviceToDevice(s, x, 0, other, 8, 256) }},
		{"d2d into another device's buffer", func() { d.CopyDeviceToDevice(s, other, 0, x, 0, 4) }},
		{"op on a freed buffer", func() { ops.Fill(s, freed, 1) }},
		{"op on a foreign buffer", func() { ops.Fill(s, alien{}, 1) }},
		{"op on a nil buffer", func() { ops.Fill(s, nil, 1) }},
		{"op on another device's buffer", func() { ops.Scale(s, other, 2) }},
		{"op on another device's stream", func() { ops.Fill(s1, x, 1) }},
		{"op on a foreign stream", func() { ops.Fill(alienStream{}, x, 1) }},
	}
}

// layerRefusals are the refused calls on the layers' kernels: GEMM, bias, layer norm and attention (forward, backward and cached).
func layerRefusals(a contractArgs) []refusal {
	s, ops, x, y, h, ids := a.s, a.ops, a.x, a.y, a.h, a.ids
	return []refusal{
		{"gemm with a negative dimension", func() { ops.Gemm(s, false, false, -8, 8, 1, 1, x, x, 0, y) }},
		{"gemm with a short c", func() { ops.Gemm(s, false, false, 8, 8, 8, 1, x, x, 0, y.Slice(0, 63)) }},
		{"gemm of i32", func() { ops.Gemm(s, false, false, 2, 2, 2, 1, ids.Slice(0, 4), ids.Slice(4, 4), 0, x.Slice(0, 4)) }},
		{"bias-add with a short bias", func() { ops.BiasAdd(s, x, y.Slice(0, 7), 8, 8) }},
		{"bias-grad with a long dbias", func() { ops.BiasGrad(s, x, y.Slice(0, 9), 8, 8) }},
		{"layernorm with bf16 statistics", func() {
			ops.LayerNormForward(s, x, y.Slice(0, 8), y.Slice(8, 8), y, h.Slice(0, 8), h.Slice(8, 8), 8, 8, 1e-5)
		}},
		{"layernorm-backward with short dx", func() {
			ops.LayerNormBackward(s, x, x, y.Slice(0, 8), y.Slice(8, 8), y.Slice(16, 8), y.Slice(0, 60), y.Slice(24, 8), y.Slice(32, 8), 8, 8)
		}},
		{"attention with a bf16 lse", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), h.Slice(0, 8), nil, 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention with f32 positions", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), y.Slice(24, 8), 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention with 3 heads over 2 key/value heads", func() {
			ops.AttentionForward(s, x.Slice(0, 28), y.Slice(0, 12), y.Slice(16, 6), nil, 1, 2, 3, 2, 2, gpu.AttnOptions{})
		}},
		{"attention with no key/value head", func() {
			ops.AttentionForward(s, x.Slice(0, 16), y.Slice(0, 16), y.Slice(16, 8), nil, 1, 8, 1, 0, 2, gpu.AttnOptions{})
		}},
		{"attention with short positions", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), ids.Slice(0, 7), 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-backward with a short dqkv", func() {
			ops.AttentionBackward(s, y.Slice(0, 16), x.Slice(0, 48), y.Slice(16, 16), y.Slice(32, 8), nil, x.Slice(0, 47), 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-backward with a short out", func() {
			ops.AttentionBackward(s, y.Slice(0, 16), x.Slice(0, 48), y.Slice(16, 15), y.Slice(32, 8), nil, x.Slice(0, 48), 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-backward into its own qkv", func() {
			ops.AttentionBackward(s, y.Slice(0, 16), x.Slice(0, 48), y.Slice(16, 16), y.Slice(32, 8), nil, x.Slice(8, 48), 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-backward into its dout", func() {
			ops.AttentionBackward(s, y.Slice(0, 16), x.Slice(0, 48), x.Slice(48, 16), y.Slice(56, 8), nil, y.Slice(0, 48), 1, 8, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-cached with a short k cache", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 6), y.Slice(8, 8), y.Slice(16, 4), 2, 2, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-cached with an i32 v cache", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 8), ids, y.Slice(16, 4), 2, 2, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-cached with overlapping caches", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 8), y.Slice(4, 8), y.Slice(16, 4), 2, 2, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-cached writing out into its k cache", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 8), y.Slice(8, 8), y.Slice(4, 4), 2, 2, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-cached at a negative start", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 8), y.Slice(8, 8), y.Slice(16, 4), -1, 2, 1, 1, 2, gpu.AttnOptions{})
		}},
		{"attention-cached with 3 heads over 2 key/value heads", func() {
			ops.AttentionCached(s, x.Slice(0, 14), y.Slice(0, 8), y.Slice(8, 8), y.Slice(16, 6), 0, 1, 3, 2, 2, gpu.AttnOptions{})
		}},
		{"attention with a negative window", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), nil, 1, 8, 1, 1, 2, gpu.AttnOptions{Window: -1})
		}},
		{"attention with a NaN soft cap", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), nil, 1, 8, 1, 1, 2, gpu.AttnOptions{SoftCap: float32(math.NaN())})
		}},
		{"attention with a negative soft cap", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), nil, 1, 8, 1, 1, 2, gpu.AttnOptions{SoftCap: -30})
		}},
		{"attention with an infinite scale", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), nil, 1, 8, 1, 1, 2, gpu.AttnOptions{Scale: float32(math.Inf(1))})
		}},
		{"attention with a negative scale", func() {
			ops.AttentionForward(s, x.Slice(0, 48), y.Slice(0, 16), y.Slice(16, 8), nil, 1, 8, 1, 1, 2, gpu.AttnOptions{Scale: -0.125})
		}},
		{"attention-backward with a negative window", func() {
			ops.AttentionBackward(s, y.Slice(0, 8), x.Slice(0, 24), y.Slice(8, 8), y.Slice(16, 4), nil, x.Slice(24, 24), 1, 4, 1, 1, 2, gpu.AttnOptions{Window: -3})
		}},
		{"attention-backward with a NaN soft cap", func() {
			ops.AttentionBackward(s, y.Slice(0, 8), x.Slice(0, 24), y.Slice(8, 8), y.Slice(16, 4), nil, x.Slice(24, 24), 1, 4, 1, 1, 2, gpu.AttnOptions{SoftCap: float32(math.NaN())})
		}},
		{"attention-cached with a negative window", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 8), y.Slice(8, 8), y.Slice(16, 4), 0, 2, 1, 1, 2, gpu.AttnOptions{Window: -1})
		}},
		{"attention-cached with a NaN soft cap", func() {
			ops.AttentionCached(s, x.Slice(0, 12), y.Slice(0, 8), y.Slice(8, 8), y.Slice(16, 4), 0, 2, 1, 1, 2, gpu.AttnOptions{SoftCap: float32(math.NaN())})
		}},
	}
}

// kernelRefusals are the refused calls on the other kernels and the collectives: norms, rope, activations, cross-entropy, embedding, casts, Adam, all-gather to barrier.
func kernelRefusals(a contractArgs) []refusal {
	s, s1, ops, comms, x, y, h, ids, f64, other := a.s, a.s1, a.ops, a.comms, a.x, a.y, a.h, a.ids, a.f64, a.other
	return []refusal{
		{"rmsnorm with bf16 rstd", func() { ops.RMSNormForward(s, x, y.Slice(0, 8), y, h.Slice(0, 8), 8, 8, 1e-5) }},
		{"add-rmsnorm with a short sum", func() {
			ops.AddRMSNormForward(s, x.Slice(0, 8), x.Slice(8, 8), y.Slice(0, 7), y.Slice(8, 4), y.Slice(16, 8), y.Slice(24, 2), 2, 4, 1e-5)
		}},
		{"add-rmsnorm with sum half over a", func() {
			ops.AddRMSNormForward(s, x.Slice(0, 8), x.Slice(8, 8), x.Slice(4, 8), y.Slice(8, 4), y.Slice(16, 8), y.Slice(24, 2), 2, 4, 1e-5)
		}},
		{"add-rmsnorm writing y over sum", func() {
			ops.AddRMSNormForward(s, x.Slice(0, 8), x.Slice(8, 8), y.Slice(0, 8), y.Slice(8, 4), y.Slice(0, 8), y.Slice(24, 2), 2, 4, 1e-5)
		}},
		{"add-rmsnorm with bf16 rstd", func() {
			ops.AddRMSNormForward(s, x.Slice(0, 8), x.Slice(8, 8), y.Slice(0, 8), y.Slice(8, 4), y.Slice(16, 8), h.Slice(0, 2), 2, 4, 1e-5)
		}},
		{"add-layernorm writing y over sum", func() {
			ops.AddLayerNormForward(s, x.Slice(0, 8), x.Slice(8, 8), y.Slice(0, 8), y.Slice(8, 4), y.Slice(12, 4), y.Slice(0, 8), y.Slice(24, 2), y.Slice(26, 2), 2, 4, 1e-5)
		}},
		{"add-layernorm with sum half over b", func() {
			ops.AddLayerNormForward(s, x.Slice(0, 8), x.Slice(8, 8), x.Slice(12, 8), y.Slice(8, 4), y.Slice(12, 4), y.Slice(16, 8), y.Slice(24, 2), y.Slice(26, 2), 2, 4, 1e-5)
		}},
		{"add-layernorm with bf16 mean", func() {
			ops.AddLayerNormForward(s, x.Slice(0, 8), x.Slice(8, 8), y.Slice(0, 8), y.Slice(8, 4), y.Slice(12, 4), y.Slice(16, 8), h.Slice(0, 2), y.Slice(26, 2), 2, 4, 1e-5)
		}},
		{"bias-gelu with a short bias", func() { ops.BiasGeluForward(s, x.Slice(0, 56), y.Slice(0, 7), y.Slice(8, 56), 7, 8) }},
		{"bias-gelu writing act over y", func() { ops.BiasGeluForward(s, x.Slice(0, 32), y.Slice(0, 8), x.Slice(16, 32), 4, 8) }},
		{"rmsnorm-backward with a short dgamma", func() {
			ops.RMSNormBackward(s, x, x, y.Slice(0, 8), y.Slice(8, 8), y, y.Slice(16, 7), 8, 8)
		}},
		{"rope with an odd head dimension", func() {
			ops.RopeForward(s, x.Slice(0, 18), nil, 1, 2, 1, 1, 3, gpu.Rope{InvFreq: []float32{1}, Scale: 1, Dims: 3})
		}},
		{"rope with an inverse frequency 0", func() {
			ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{InvFreq: []float32{1, 0}, Scale: 1, Dims: 4})
		}},
		{"rope with more rotated dims than the head", func() { ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.DefaultRope(6, 10000)) }},
		{"rope with too few inverse frequencies", func() {
			ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{InvFreq: []float32{1}, Scale: 1, Dims: 4})
		}},
		{"rope with odd rotated dims", func() {
			ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{InvFreq: []float32{1}, Scale: 1, Dims: 3})
		}},
		{"rope with too many inverse frequencies", func() {
			ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{InvFreq: []float32{1, 0.5, 0.25}, Scale: 1, Dims: 4})
		}},
		{"rope with a NaN inverse frequency", func() {
			ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{InvFreq: []float32{1, float32(math.NaN())}, Scale: 1, Dims: 4})
		}},
		{"rope with scale 0", func() {
			ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{InvFreq: []float32{1, 0.5}, Scale: 0, Dims: 4})
		}},
		{"rope with no rotated dims", func() { ops.RopeForward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.Rope{Scale: 1}) }},
		{"rope-backward with more rotated dims than the head", func() { ops.RopeBackward(s, x.Slice(0, 24), nil, 1, 2, 1, 1, 4, gpu.DefaultRope(8, 10000)) }},
		{"rope-backward with a short dqkv", func() { ops.RopeBackward(s, x.Slice(0, 23), nil, 1, 2, 1, 1, 4, gpu.DefaultRope(4, 10000)) }},
		{"glu with a short y", func() { ops.GLUForward(s, x.Slice(0, 32), y.Slice(0, 15), 4, 4, gpu.Silu) }},
		{"glu-backward into its own input", func() { ops.GLUBackward(s, x.Slice(0, 32), y.Slice(0, 16), x.Slice(16, 32), 4, 4, gpu.GeluTanh) }},
		{"glu with an unknown activation", func() { ops.GLUForward(s, x.Slice(0, 32), y.Slice(0, 16), 4, 4, gpu.GLUAct(9)) }},
		{"gelu of i32", func() { ops.GeluForward(s, ids, ids, 8) }},
		{"gelu-backward with a short dx", func() { ops.GeluBackward(s, x, y, y.Slice(0, 63), 64) }},
		{"add with a negative length", func() { ops.Add(s, x, y, y, -1) }},
		{"cross-entropy with f32 targets", func() { ops.CrossEntropyForward(s, x, y.Slice(0, 8), y.Slice(8, 8), 8, 8, 0) }},
		{"cross-entropy with a NaN soft cap", func() { ops.CrossEntropyForward(s, x, ids, y.Slice(8, 8), 8, 8, float32(math.NaN())) }},
		{"cross-entropy with a negative soft cap", func() { ops.CrossEntropyForward(s, x, ids, y.Slice(8, 8), 8, 8, -30) }},
		{"cross-entropy-backward with an infinite soft cap", func() { ops.CrossEntropyBackward(s, x, ids, y, 8, 8, 1, float32(math.Inf(1))) }},
		{"cross-entropy-backward with short dlogits", func() { ops.CrossEntropyBackward(s, x, ids, y.Slice(0, 32), 8, 8, 1, 0) }},
		{"embedding with a ragged table", func() { ops.EmbeddingForward(s, ids, nil, x.Slice(0, 63), y.Slice(0, 32), h.Slice(0, 32), 2, 4, 4) }},
		{"embedding with f32 positions", func() { ops.EmbeddingForward(s, ids, y.Slice(0, 8), x, nil, h.Slice(0, 32), 2, 4, 4) }},
		{"embedding-backward with a short position table", func() { ops.EmbeddingBackward(s, ids, nil, x.Slice(0, 32), y, y.Slice(0, 12), 2, 4, 4) }},
		{"cast between lengths", func() { ops.Cast(s, h.Slice(0, 63), x) }},
		{"scale of i32", func() { ops.Scale(s, ids, 2) }},
		{"axpy between lengths", func() { ops.Axpy(s, 1, x, y.Slice(0, 63)) }},
		{"sum-squares into f32", func() { ops.SumSquares(s, x, y, 0) }},
		{"sum-squares past out", func() { ops.SumSquares(s, x, f64, 2) }},
		{"adam with bf16 params", func() { ops.AdamStep(s, h, x, y, y, nil, gpu.AdamParams{}) }},
		{"adam with an f32 out", func() { ops.AdamStep(s, x, x, y, y, y, gpu.AdamParams{}) }},
		{"all-gather into a short recv", func() { comms[0].AllGather(s, x.Slice(0, 32), y.Slice(0, 63)) }},
		{"reduce-scatter of i32", func() { comms[0].ReduceScatter(s, ids, ids.Slice(0, 4), gpu.Sum) }},
		{"all-reduce with an unknown op", func() { comms[0].AllReduce(s, x, gpu.ReduceOp(7)) }},
		{"all-reduce of another device's buffer", func() { comms[0].AllReduce(s, other, gpu.Sum) }},
		{"broadcast from rank 2 of 2", func() { comms[0].Broadcast(s, x, 2) }},
		{"barrier on another device's stream", func() { comms[0].Barrier(s1) }},
	}
}
