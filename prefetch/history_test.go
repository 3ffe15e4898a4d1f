package prefetch

import (
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestComputeHistory checks that the planner predicts the step's progress
// at each access as the least of the last Options.ComputeSteps traces of
// the same accesses (each access's compute is then the difference), forgets
// the oldest, and starts again when the accesses change.
func TestComputeHistory(t *testing.T) {
	key := func(c int) shard.Key { return shard.Key{Chunk: shard.ChunkID(c), State: shard.Param} }
	res := Residency{}
	for c := range 3 {
		res[key(c)] = Placement{SizeBytes: 4096, Home: shard.Host}
	}
	trace := func(keys []int, ms ...int) Trace {
		var tr Trace
		for i, c := range keys {
			tr.Accesses = append(tr.Accesses, shard.Access{Key: key(c), Phase: shard.Forward, Tier: shard.HBM, Kind: shard.Read, SizeBytes: 4096,
				Compute: time.Duration(ms[i]) * time.Millisecond})
		}
		return tr
	}
	planned := func(p *Planner) []time.Duration {
		var out []time.Duration
		for _, a := range p.trace {
			out = append(out, a.compute)
		}
		return out
	}
	want := func(p *Planner, what string, ms ...int) {
		t.Helper()
		got := planned(p)
		if len(got) != len(ms) {
			t.Fatalf("%s: planned %v, want %v ms", what, got, ms)
		}
		var sum time.Duration
		for i, m := range ms {
			if got[i] != time.Duration(m)*time.Millisecond {
				t.Fatalf("%s: planned %v, want %v ms", what, got, ms)
			}
			sum += got[i]
		}
		if p.cum[len(ms)] != sum {
			t.Fatalf("%s: deadlines sum to %v, want %v", what, p.cum[len(ms)], sum)
		}
	}
	opts := DefaultOptions()
	opts.ComputeSteps = 3
	p, err := New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	abc := []int{0, 1, 2}
	steps := []struct {
		tr   Trace
		want []int
		what string
	}{
		// progress (the sums) of each step in the history, and the least
		{trace(abc, 10, 20, 30), []int{10, 20, 30}, "first step"},             // 10 30 60
		{trace(abc, 5, 40, 30), []int{5, 25, 30}, "least of two"},             // 5 45 75: 5 30 60
		{trace(abc, 8, 25, 12), []int{5, 25, 15}, "least of three"},           // 8 33 45: 5 30 45
		{trace(abc, 9, 26, 13), []int{5, 28, 12}, "the first step forgotten"}, // 9 35 48: 5 33 45
		{trace(abc, 50, 50, 50), []int{8, 25, 12}, "the second forgotten"},    // 8 33 45 least
		{trace([]int{2, 1, 0}, 50, 60, 70), []int{50, 60, 70}, "other accesses: history restarts"},
		{trace([]int{2, 1, 0}, 40, 70, 80), []int{40, 70, 70}, "after the restart"}, // 50 110 180, 40 110 190
	}
	for _, s := range steps {
		if err := p.SetTrace(s.tr); err != nil {
			t.Fatal(err)
		}
		want(p, s.what, s.want...)
	}

	// ComputeSteps 1: the last step alone, as the trace measured it.
	opts.ComputeSteps = 1
	p, err = New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []Trace{trace(abc, 10, 20, 30), trace(abc, 50, 5, 60)} {
		if err := p.SetTrace(tr); err != nil {
			t.Fatal(err)
		}
	}
	want(p, "ComputeSteps 1", 50, 5, 60)

	// The time between two accesses moves to the neighbour from one step to
	// the next (the engine's backward: the rank blocks at the param's access
	// in one step, at the gradient's in the next). A least compute per access
	// would predict no time at all; the least progress keeps each step's 40 ms.
	opts.ComputeSteps = 4
	res[key(3)] = Placement{SizeBytes: 4096, Home: shard.Host}
	p, err = New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	abcd := []int{0, 1, 2, 3}
	for _, tr := range []Trace{trace(abcd, 0, 20, 0, 20), trace(abcd, 20, 0, 20, 0)} {
		if err := p.SetTrace(tr); err != nil {
			t.Fatal(err)
		}
	}
	want(p, "time moving between neighbours", 0, 20, 0, 20)

	opts.ComputeSteps = -1
	if _, err := New(res, opts); err == nil {
		t.Error("New accepted ComputeSteps -1")
	}
}
