package gputest

import (
	"fmt"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

func testCollectives(t *testing.T, nb NewBackend) {
	for n := 1; n <= 4; n++ {
		for _, dt := range []gpu.DType{gpu.F32, gpu.BF16, gpu.F16, gpu.F64} {
			t.Run(fmt.Sprintf("N%d/%s", n, dt), func(t *testing.T) {
				first := runCollectives(t, nb, n, dt)
				second := runCollectives(t, nb, n, dt)
				for k, v := range first {
					if !equalBits(v, second[k]) {
						t.Errorf("%s: two runs differ", k)
					}
				}
			})
		}
	}
	t.Run("Disagree", func(t *testing.T) { testCollectiveErrors(t, nb) })
}

// reduceRef is the documented reduction: s = x_0; s += x_1 ... in fp32
// (float64 for F64), Avg divides by N, then one rounding to dt.
func reduceRef(xs [][]float64, op gpu.ReduceOp, dt gpu.DType) []float64 {
	out := make([]float64, len(xs[0]))
	n := len(xs)
	for i := range out {
		if dt == gpu.F64 {
			s := xs[0][i]
			for q := 1; q < n; q++ {
				s += xs[q][i]
			}
			if op == gpu.Avg {
				s /= float64(n)
			}
			out[i] = s
			continue
		}
		s := float32(xs[0][i])
		for q := 1; q < n; q++ {
			s += float32(xs[q][i])
		}
		if op == gpu.Avg {
			s /= float32(n)
		}
		out[i] = float64(s)
	}
	return stored(out, dt)
}

// runCollectives runs every collective on n fresh devices and returns each
// result by name, after checking it against the reference on every rank.
func runCollectives(t *testing.T, nb NewBackend, n int, dt gpu.DType) map[string][]float64 {
	devs, comms := nb(t, n)
	if len(comms) != n {
		t.Fatalf("backend returned %d comms for %d devices", len(comms), n)
	}
	for r, c := range comms {
		if c.Rank() != r || c.Size() != n {
			t.Fatalf("comm %d: rank %d size %d", r, c.Rank(), c.Size())
		}
	}
	const m = 37 // elements per rank's share: odd, so that segments are uneven
	streams := make([]gpu.Stream, n)
	for r, d := range devs {
		streams[r] = d.NewStream()
	}
	results := map[string][]float64{}
	record := func(name string, r int, got []float64) {
		if r == 0 {
			results[name] = got
		} else if !equalBits(got, results[name]) {
			t.Errorf("%s: rank %d differs from rank 0", name, r)
		}
	}
	in := make([][]float64, n) // rank r's input, n*m values, rounded to dt
	bufs := make([]gpu.Buffer, n)
	for r := range n {
		in[r] = stored(randVals(newRand(uint64(100+r)), n*m, 3), dt)
	}

	// AllReduce Sum and Avg in place.
	for _, op := range []gpu.ReduceOp{gpu.Sum, gpu.Avg} {
		want := reduceRef(in, op, dt)
		for r, d := range devs {
			bufs[r] = upload(t, d, streams[r], in[r], dt)
			comms[r].AllReduce(streams[r], bufs[r], op)
		}
		for r, d := range devs {
			got := download(t, d, streams[r], bufs[r])
			if !equalBits(got, want) {
				t.Errorf("all-reduce op %d rank %d: got %v..., want %v...", op, r, got[:3], want[:3])
			}
			record(fmt.Sprintf("all-reduce %d", op), r, got)
		}
	}

	// ReduceScatter: rank r gets the reduction of segment r.
	for _, op := range []gpu.ReduceOp{gpu.Sum, gpu.Avg} {
		full := reduceRef(in, op, dt)
		recv := make([]gpu.Buffer, n)
		for r, d := range devs {
			bufs[r] = upload(t, d, streams[r], in[r], dt)
			recv[r] = alloc(t, d, m, dt)
			comms[r].ReduceScatter(streams[r], bufs[r], recv[r], op)
		}
		for r, d := range devs {
			got := download(t, d, streams[r], recv[r])
			if !equalBits(got, full[r*m:(r+1)*m]) {
				t.Errorf("reduce-scatter op %d rank %d: got %v..., want %v...", op, r, got[:3], full[r*m:r*m+3])
			}
			results[fmt.Sprintf("reduce-scatter %d rank %d", op, r)] = got
		}
	}

	// AllGather, out of place and in place (send is a view of recv).
	var want []float64
	for r := range n {
		want = append(want, in[r][:m]...)
	}
	recv := make([]gpu.Buffer, n)
	for r, d := range devs {
		bufs[r] = upload(t, d, streams[r], in[r][:m], dt)
		recv[r] = alloc(t, d, n*m, dt)
		comms[r].AllGather(streams[r], bufs[r], recv[r])
	}
	for r, d := range devs {
		got := download(t, d, streams[r], recv[r])
		if !equalBits(got, want) {
			t.Errorf("all-gather rank %d differs from the concatenation", r)
		}
		record("all-gather", r, got)
	}
	for r, d := range devs {
		vals := make([]float64, n*m)
		copy(vals[r*m:], in[r][:m])
		recv[r] = upload(t, d, streams[r], vals, dt)
		comms[r].AllGather(streams[r], recv[r].Slice(r*m, m), recv[r])
	}
	for r, d := range devs {
		if got := download(t, d, streams[r], recv[r]); !equalBits(got, want) {
			t.Errorf("in-place all-gather rank %d differs from the concatenation", r)
		}
	}

	// Broadcast from the last rank, then a barrier.
	root := n - 1
	for r, d := range devs {
		bufs[r] = upload(t, d, streams[r], in[r], dt)
		comms[r].Broadcast(streams[r], bufs[r], root)
		comms[r].Barrier(streams[r])
	}
	for r, d := range devs {
		got := download(t, d, streams[r], bufs[r])
		if !equalBits(got, in[root]) {
			t.Errorf("broadcast from %d: rank %d differs from the root's buffer", root, r)
		}
	}
	for r, d := range devs {
		if n > 1 && d.Counters().Collective <= 0 {
			t.Errorf("rank %d: collective counter %d after collectives", r, d.Counters().Collective)
		}
	}
	return results
}

// testCollectiveErrors: calls that disagree raise an error on every rank's
// stream instead of hanging, and the communicator keeps working.
func testCollectiveErrors(t *testing.T, nb NewBackend) {
	devs, comms := nb(t, 2)
	s := []gpu.Stream{devs[0].DefaultStream(), devs[1].DefaultStream()}
	a := alloc(t, devs[0], 10, gpu.F32)
	b := alloc(t, devs[1], 12, gpu.F32)
	comms[0].AllReduce(s[0], a, gpu.Sum)
	comms[1].AllReduce(s[1], b, gpu.Sum)
	for r := range 2 {
		if err := s[r].Synchronize(); err == nil {
			t.Errorf("rank %d: all-reduce of 10 against 12 elements: no error", r)
		}
	}
	comms[0].AllReduce(s[0], a, gpu.Sum)
	comms[1].Barrier(s[1])
	for r := range 2 {
		if err := s[r].Synchronize(); err == nil {
			t.Errorf("rank %d: all-reduce against barrier: no error", r)
		}
	}
	// Still usable.
	x := upload(t, devs[0], s[0], []float64{1, 2}, gpu.F32)
	y := upload(t, devs[1], s[1], []float64{10, 20}, gpu.F32)
	comms[0].AllReduce(s[0], x, gpu.Sum)
	comms[1].AllReduce(s[1], y, gpu.Sum)
	gx, gy := download(t, devs[0], s[0], x), download(t, devs[1], s[1], y)
	if gx[0] != 11 || gx[1] != 22 || !equalBits(gx, gy) {
		t.Errorf("after errors: %v %v", gx, gy)
	}
}
