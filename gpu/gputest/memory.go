package gputest

import (
	"errors"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

func testMemory(t *testing.T, nb NewBackend) {
	d, s := one(t, nb)
	base := d.MemStats()
	if base.BudgetBytes <= 0 {
		t.Fatalf("budget %d", base.BudgetBytes)
	}

	// Zeroed memory and accounting per kind and purpose.
	p, err := d.Alloc(1000, gpu.F32, gpu.Tag{Kind: gpu.ModelState, Purpose: "params"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Alloc(333, gpu.BF16, gpu.Tag{Kind: gpu.Activation, Purpose: "acts"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 1000 || p.Bytes() != 4000 || p.DType() != gpu.F32 || p.DeviceIndex() != d.Index() {
		t.Fatalf("buffer: len %d bytes %d dtype %s device %d", p.Len(), p.Bytes(), p.DType(), p.DeviceIndex())
	}
	for i, v := range download(t, d, s, p) {
		if v != 0 {
			t.Fatalf("fresh allocation holds %v at %d, want zeros", v, i)
		}
	}
	st := d.MemStats()
	if got := st.InUseByKind[gpu.ModelState] - base.InUseByKind[gpu.ModelState]; got < 4000 || got > 8000 {
		t.Errorf("model-state in use grew by %d for 4000 bytes", got)
	}
	if got := st.InUseByKind[gpu.Activation] - base.InUseByKind[gpu.Activation]; got < 666 || got > 4666 {
		t.Errorf("activation in use grew by %d for 666 bytes", got)
	}
	if st.InUseByPurpose["params"] < 4000 || st.InUseByPurpose["acts"] < 666 {
		t.Errorf("by purpose: %v", st.InUseByPurpose)
	}
	if st.InUseBytes != base.InUseBytes+st.InUseByPurpose["params"]+st.InUseByPurpose["acts"] {
		t.Errorf("in use %d != base %d + params + acts %v", st.InUseBytes, base.InUseBytes, st.InUseByPurpose)
	}
	if st.PeakBytes < st.InUseBytes || st.PeakByKind[gpu.ModelState] < st.InUseByKind[gpu.ModelState] {
		t.Errorf("peaks below in-use: %+v", st)
	}
	d.Free(a)
	st2 := d.MemStats()
	if st2.InUseByKind[gpu.Activation] != base.InUseByKind[gpu.Activation] || st2.InUseByPurpose["acts"] != 0 {
		t.Errorf("after free: %+v", st2)
	}
	if st2.PeakBytes != st.PeakBytes || st2.PeakByKind[gpu.Activation] != st.PeakByKind[gpu.Activation] {
		t.Errorf("free changed the peak: %+v then %+v", st, st2)
	}
	d.ResetPeak()
	st3 := d.MemStats()
	if st3.PeakBytes != st3.InUseBytes || st3.PeakByKind != st3.InUseByKind {
		t.Errorf("after ResetPeak: %+v", st3)
	}

	// Views share memory and are not freed.
	host := encode([]float64{1, 2, 3}, gpu.F32)
	v := p.Slice(10, 3)
	if v.Len() != 3 || v.DeviceIndex() != d.Index() {
		t.Fatalf("view len %d", v.Len())
	}
	d.CopyHostToDevice(s, v, 0, host)
	all := download(t, d, s, p)
	if all[9] != 0 || all[10] != 1 || all[12] != 3 || all[13] != 0 {
		t.Errorf("write through a view: %v", all[8:14])
	}
	if got := download(t, d, s, v.Slice(1, 2)); got[0] != 2 || got[1] != 3 {
		t.Errorf("view of a view: %v", got)
	}
	if msg := catch(func() { p.Slice(999, 2) }); msg == "" {
		t.Error("out-of-range Slice did not panic")
	}
	if msg := catch(func() { d.Free(v) }); msg == "" {
		t.Error("freeing a view did not panic")
	}

	// Out of memory: the error is typed and names the purpose and the peak.
	left := st3.BudgetBytes - st3.InUseBytes
	_, err = d.Alloc(int(left/4)+1024, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "huge scratch"})
	var oom *gpu.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("alloc past the budget: %v, want *gpu.OutOfMemoryError", err)
	}
	if oom.Tag.Purpose != "huge scratch" || oom.RequestedBytes < left || oom.Stats.InUseByPurpose["params"] < 4000 {
		t.Errorf("oom fields: %+v", oom)
	}
	for _, want := range []string{"huge scratch", "params", "peak", "out of memory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("oom text %q does not mention %q", err, want)
		}
	}
	if d.MemStats().InUseBytes != st3.InUseBytes {
		t.Error("a failed alloc changed in-use bytes")
	}
	// What fits still fits.
	q, err := d.Alloc(16, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "small"})
	if err != nil {
		t.Fatalf("small alloc after an oom: %v", err)
	}
	d.Free(q)
	d.Free(p)
	if msg := catch(func() { d.Free(p) }); msg == "" {
		t.Error("double free did not panic")
	}
	if end := d.MemStats(); end.InUseBytes != base.InUseBytes {
		t.Errorf("in use %d after freeing everything, was %d", end.InUseBytes, base.InUseBytes)
	}
	z, err := d.Alloc(0, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "empty"})
	if err != nil || z.Len() != 0 {
		t.Fatalf("zero-length alloc: %v", err)
	}
	d.Free(z)
}

func testCopies(t *testing.T, nb NewBackend) {
	devs, _ := nb(t, 2)
	d0, d1 := devs[0], devs[1]
	s0, s1 := d0.DefaultStream(), d1.NewStream()
	c0, c1 := d0.Counters(), d1.Counters()

	vals := randVals(newRand(1), 257, 10)
	src := encode(vals, gpu.F32)
	b0 := alloc(t, d0, 300, gpu.F32)
	d0.CopyHostToDevice(s0, b0, 8, src) // elements 2..258
	got := download(t, d0, s0, b0)
	if got[1] != 0 || got[2] != vals[0] || got[258] != vals[256] || got[259] != 0 {
		t.Fatalf("h2d at an offset: %v %v %v %v", got[1], got[2], got[258], got[259])
	}
	part := make([]byte, 40)
	d0.CopyDeviceToHost(s0, part, b0, 12)
	waitStream(t, s0)
	if p := decode(part, gpu.F32); p[0] != vals[1] || p[9] != vals[10] {
		t.Errorf("d2h at an offset: %v", p)
	}
	// Same device: no link traffic. Other device: DeviceToDevice.
	b0b := alloc(t, d0, 300, gpu.F32)
	d0.CopyDeviceToDevice(s0, b0b, 0, b0, 8, 257*4)
	b1 := alloc(t, d1, 300, gpu.F32)
	d1.CopyDeviceToDevice(s1, b1, 4, b0, 8, 257*4)
	if g := download(t, d0, s0, b0b); g[0] != vals[0] || g[256] != vals[256] {
		t.Errorf("d2d on one device: %v", g[:3])
	}
	if g := download(t, d1, s1, b1); g[0] != 0 || g[1] != vals[0] || g[257] != vals[256] {
		t.Errorf("d2d between devices: %v", g[:3])
	}
	e0, e1 := d0.Counters(), d1.Counters()
	if e0.HostToDevice-c0.HostToDevice != 257*4 {
		t.Errorf("h2d counter grew by %d, want %d", e0.HostToDevice-c0.HostToDevice, 257*4)
	}
	// download copies the whole buffer: 300*4 twice on d0 plus the 40-byte part.
	if e0.DeviceToHost-c0.DeviceToHost != 2*300*4+40 {
		t.Errorf("d2h counter grew by %d, want %d", e0.DeviceToHost-c0.DeviceToHost, 2*300*4+40)
	}
	if got := (e0.DeviceToDevice - c0.DeviceToDevice) + (e1.DeviceToDevice - c1.DeviceToDevice); got != 257*4 {
		t.Errorf("d2d counters grew by %d in all, want %d (only the copy between devices)", got, 257*4)
	}
	if msg := catch(func() { d0.CopyHostToDevice(s0, b0, 1200-3, []byte{1, 2, 3, 4}) }); msg == "" {
		t.Error("h2d past the end did not panic")
	}
}

func testStreams(t *testing.T, nb NewBackend) {
	devs, _ := nb(t, 2)
	d, s := devs[0], devs[0].DefaultStream()
	n := 1001
	ones := upload(t, d, s, constVals(n, 1), gpu.F32)

	// In order on one stream: ((1*3)+1)*2 = 8, repeated; any reordering
	// changes the value.
	x := alloc(t, d, n, gpu.F32)
	ops := d.Ops()
	for range 20 {
		ops.Fill(s, x, 1)
		ops.Scale(s, x, 3)
		ops.Axpy(s, 1, ones, x)
		ops.Scale(s, x, 2)
	}
	for i, v := range download(t, d, s, x) {
		if v != 8 {
			t.Fatalf("x[%d] = %v after an in-order chain, want 8", i, v)
		}
	}

	// Across streams: s2 waits for s1's work through an event.
	s1, s2 := d.NewStream(), d.NewStream()
	m := 96
	a := upload(t, d, s, randVals(newRand(2), m*m, 1), gpu.F32)
	c := alloc(t, d, m*m, gpu.F32)
	out := alloc(t, d, m*m, gpu.F32)
	e := d.NewEvent()
	if !e.Done() {
		t.Error("an event never recorded is not done")
	}
	e.Synchronize()
	for range 4 {
		ops.Gemm(s1, false, false, m, m, m, 1, a, a, 1, c)
	}
	s1.Record(e)
	s2.Wait(e)
	d.CopyDeviceToDevice(s2, out, 0, c, 0, c.Bytes())
	waitStream(t, s2)
	if !e.Done() {
		t.Error("event not done after the waiting stream completed")
	}
	want := download(t, d, s1, c)
	if got := download(t, d, s2, out); !equalBits(got, want) {
		t.Error("the waiting stream did not see the recorded work")
	}

	// Across devices: d1 waits for d0, then copies from d0.
	d1 := devs[1]
	t1 := d1.NewStream()
	e2 := d.NewEvent()
	y := alloc(t, d, n, gpu.F32)
	ops.Fill(s1, y, 5)
	ops.Axpy(s1, 2, ones, y)
	s1.Record(e2)
	t1.Wait(e2)
	z := alloc(t, d1, n, gpu.F32)
	d1.CopyDeviceToDevice(t1, z, 0, y, 0, y.Bytes())
	e2.Synchronize()
	if !e2.Done() {
		t.Error("event not done after Synchronize")
	}
	for i, v := range download(t, d1, t1, z) {
		if v != 7 {
			t.Fatalf("z[%d] = %v, want 7 (cross-device wait)", i, v)
		}
	}
	// Re-recording moves the event forward.
	ops.Fill(s1, y, 9)
	s1.Record(e2)
	t1.Wait(e2)
	d1.CopyDeviceToDevice(t1, z, 0, y, 0, y.Bytes())
	if got := download(t, d1, t1, z); got[0] != 9 || got[n-1] != 9 {
		t.Errorf("after re-recording: %v", got[0])
	}

	// Bad runtime data is an error at Synchronize, reported once.
	ids := upload(t, d, s, []float64{0, 3, 99, 1}, gpu.I32)
	wte := upload(t, d, s, randVals(newRand(3), 10*4, 1), gpu.F32)
	wpe := upload(t, d, s, randVals(newRand(4), 4*4, 1), gpu.F32)
	emb := alloc(t, d, 4*4, gpu.F32)
	ops.EmbeddingForward(s, ids, nil, wte, wpe, emb, 1, 4, 4)
	if err := s.Synchronize(); err == nil {
		t.Error("embedding with id 99 of a vocabulary of 10: no error")
	}
	if err := s.Synchronize(); err != nil {
		t.Errorf("second Synchronize repeated the error: %v", err)
	}
	losses := alloc(t, d, 4, gpu.F32)
	ops.CrossEntropyForward(s, wte.Slice(0, 40), ids, losses, 4, 10, 0)
	if err := s.Synchronize(); err == nil {
		t.Error("cross-entropy with target 99 of 10 classes: no error")
	}
	// Contract violations panic at enqueue.
	if msg := catch(func() { ops.Add(s, x, ones.Slice(0, 5), x, n) }); msg == "" {
		t.Error("add with a short operand did not panic")
	}
	if msg := catch(func() { ops.Add(s, x, z, x, n) }); msg == "" {
		t.Error("add with a buffer of another device did not panic")
	}
}

func constVals(n int, v float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}
