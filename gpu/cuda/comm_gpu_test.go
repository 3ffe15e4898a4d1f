package cuda

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/units"
)

// These tests need a GPU (they skip without a driver, saying so); the
// NCCL ones also need libnccl (they skip without it, saying so). The
// rank-order collectives' results are checked by the conformance suite
// (TestConformance, gputest), bit for bit against the rank-order
// reference.

func gpuBackend(t *testing.T, o Options) *Backend {
	t.Helper()
	b, err := New(o)
	if errors.Is(err, ErrNoDriver) {
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

// encode stores vals as dt; the values are small integers and halves, so
// every dtype holds them exactly.
func encode(dt gpu.DType, vals []float64) []byte {
	out := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case gpu.F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
		case gpu.BF16:
			binary.LittleEndian.PutUint16(out[2*i:], bf16.FromFloat32(float32(v)))
		case gpu.F64:
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(v))
		}
	}
	return out
}

func upload(t *testing.T, d gpu.Device, vals []float64, dt gpu.DType) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(len(vals), dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(b) })
	s := d.DefaultStream()
	d.CopyHostToDevice(s, b, 0, encode(dt, vals))
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

func readBack(t *testing.T, d gpu.Device, b gpu.Buffer) []byte {
	t.Helper()
	out := make([]byte, b.Bytes())
	s := d.DefaultStream()
	d.CopyDeviceToHost(s, out, b, 0)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return out
}

func halves(n int, base float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = base + float64(i%97)/2 - 24
	}
	return v
}

// TestNCCLOneRank: a one-rank NCCL communicator (NCCL puts at most one
// rank on a GPU) runs every collective; with one rank each result is its
// input, exactly.
func TestNCCLOneRank(t *testing.T) {
	b := gpuBackend(t, Options{Devices: 1, HBMBytes: 256 * units.MiB, NCCL: true})
	if _, err := loadNCCL(newSearchPath(os.Getenv(EnvLibDir), filepath.Glob)); errors.Is(err, errNoNCCL) {
		t.Skipf("no NCCL here: %v", err)
	}
	if !strings.HasPrefix(b.Collectives(), "nccl ") {
		t.Fatalf("collectives: %q, want nccl", b.Collectives())
	}
	t.Logf("collectives: %s", b.Collectives())
	d, c := b.Devices()[0], b.Comms()[0]
	s := d.NewStream()
	const m = 1001
	for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F64} {
		x := halves(m, 3)
		want := encode(dt, x)
		check := func(what string, buf gpu.Buffer) {
			t.Helper()
			if err := s.Synchronize(); err != nil {
				t.Fatalf("%s %s: %v", dt, what, err)
			}
			if got := readBack(t, d, buf); string(got) != string(want) {
				t.Errorf("%s %s: the result is not the input", dt, what)
			}
		}
		for _, op := range []gpu.ReduceOp{gpu.Sum, gpu.Avg} {
			buf := upload(t, d, x, dt)
			c.AllReduce(s, buf, op)
			check("all-reduce", buf)
			recv := upload(t, d, halves(m, -7), dt)
			c.ReduceScatter(s, upload(t, d, x, dt), recv, op)
			check("reduce-scatter", recv)
			c.ReduceScatter(s, buf, buf, op)
			check("in-place reduce-scatter", buf)
		}
		recv := upload(t, d, halves(m, 11), dt)
		c.AllGather(s, upload(t, d, x, dt), recv)
		check("all-gather", recv)
		c.AllGather(s, recv, recv)
		check("in-place all-gather", recv)
		buf := upload(t, d, x, dt)
		c.Broadcast(s, buf, 0)
		c.Barrier(s)
		check("broadcast and barrier", buf)
	}
	if d.Counters().Collective != 0 {
		t.Errorf("one rank sent %d collective bytes", d.Counters().Collective)
	}
}

// TestNCCLNeedsAGPUPerRank: with more ranks than GPUs NCCL is not used and
// the backend says why; with a GPU per rank (and libnccl) it is, and an
// AllReduce of small integers (exact in any order) is right on every rank.
func TestNCCLNeedsAGPUPerRank(t *testing.T) {
	b := gpuBackend(t, Options{Devices: 2, HBMBytes: 256 * units.MiB, NCCL: true})
	_, nerr := loadNCCL(newSearchPath(os.Getenv(EnvLibDir), filepath.Glob))
	gpus := len(b.l.gpus)
	switch {
	case gpus < 2:
		if want := "rank-order (NCCL not used: 2 ranks on 1 GPU(s): NCCL needs a GPU per rank)"; b.Collectives() != want {
			t.Errorf("collectives: %q, want %q", b.Collectives(), want)
		}
	case errors.Is(nerr, errNoNCCL):
		if !strings.HasPrefix(b.Collectives(), "rank-order (NCCL not used: cuda: no NCCL library") {
			t.Errorf("collectives: %q", b.Collectives())
		}
	default:
		if !strings.HasPrefix(b.Collectives(), "nccl ") {
			t.Errorf("collectives: %q, want nccl", b.Collectives())
		}
	}
	t.Logf("collectives: %s", b.Collectives())
	const m = 4099
	bufs := make([]gpu.Buffer, 2)
	for r, d := range b.Devices() {
		bufs[r] = upload(t, d, halves(m, float64(10*r)), gpu.BF16)
		b.Comms()[r].AllReduce(d.DefaultStream(), bufs[r], gpu.Sum)
	}
	sum := make([]float64, m)
	for i := range sum {
		sum[i] = halves(m, 0)[i] + halves(m, 10)[i]
	}
	for r, d := range b.Devices() {
		if err := d.DefaultStream().Synchronize(); err != nil {
			t.Fatal(err)
		}
		if got := readBack(t, d, bufs[r]); string(got) != string(encode(gpu.BF16, sum)) {
			t.Errorf("rank %d: all-reduce of small integers is wrong", r)
		}
	}
}

// TestCollectiveScratchInBudget: the rank-order path's scratch is charged
// to the device budget as "collective scratch", about the buffer for an
// AllReduce (not n times it), held and reused (no growth for a collective
// no larger), and a collective whose scratch does not fit is an
// out-of-memory error at Synchronize naming it, with the communicator
// still usable.
func TestCollectiveScratchInBudget(t *testing.T) {
	const n, m = 2, 1 << 20 // 4 MiB of f32 per rank
	b := gpuBackend(t, Options{Devices: n, HBMBytes: 16 * units.MiB})
	devs, comms := b.Devices(), b.Comms()
	bufs := make([]gpu.Buffer, n)
	run := func(op func(r int, s gpu.Stream)) []error {
		errs := make([]error, n)
		for r := range n {
			op(r, devs[r].DefaultStream())
		}
		for r := range n {
			errs[r] = devs[r].DefaultStream().Synchronize()
		}
		return errs
	}
	for r := range n {
		bufs[r] = upload(t, devs[r], halves(m, float64(r)), gpu.F32)
	}
	for range 2 {
		for r, err := range run(func(r int, s gpu.Stream) { comms[r].AllReduce(s, bufs[r], gpu.Sum) }) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		for r, d := range devs {
			got := d.MemStats().InUseByPurpose[scratchPurpose]
			if want := int64(n) * int64(sliceOf(m, n, r).n) * 4; got != want {
				t.Errorf("rank %d: %d bytes of collective scratch, want %d (the buffer is %d)", r, got, want, bufs[r].Bytes())
			}
		}
	}
	// An in-place ReduceScatter of the same send needs as much: no growth.
	for r, err := range run(func(r int, s gpu.Stream) { comms[r].ReduceScatter(s, bufs[r], bufs[r].Slice(r*m/n, m/n), gpu.Sum) }) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if got := devs[0].MemStats().InUseByPurpose[scratchPurpose]; got != 4*m {
		t.Errorf("after a reduce-scatter of the same size: %d bytes of scratch, want %d", got, 4*m)
	}
	// A 7 MiB AllReduce fits in 16 MiB beside 4 MiB of buffer and 4 of
	// scratch, but its 7 MiB of scratch does not.
	big := make([]gpu.Buffer, n)
	for r, d := range devs {
		var err error
		if big[r], err = d.Alloc(7*m/4, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	for r, err := range run(func(r int, s gpu.Stream) { comms[r].AllReduce(s, big[r], gpu.Sum) }) {
		var oom *gpu.OutOfMemoryError
		if !errors.As(err, &oom) || oom.Tag.Purpose != scratchPurpose {
			t.Errorf("rank %d: %v, want an out-of-memory error for %q", r, err, scratchPurpose)
		}
	}
	for r, d := range devs {
		d.Free(big[r])
	}
	for r, err := range run(func(r int, s gpu.Stream) { comms[r].AllReduce(s, bufs[r], gpu.Sum) }) {
		if err != nil {
			t.Errorf("rank %d after the error: %v", r, err)
		}
	}
}
