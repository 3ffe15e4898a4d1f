package prefetch

import (
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestComputeHistory checks that the planner predicts each access's compute
// as the shortest of the last Options.ComputeSteps traces of the same
// accesses, forgets the oldest, and starts again when the accesses change.
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
		{trace(abc, 10, 20, 30), []int{10, 20, 30}, "first step"},
		{trace(abc, 5, 40, 30), []int{5, 20, 30}, "shortest of two"},
		{trace(abc, 8, 25, 12), []int{5, 20, 12}, "shortest of three"},
		{trace(abc, 9, 26, 13), []int{5, 25, 12}, "the first step forgotten"},
		{trace(abc, 50, 50, 50), []int{8, 25, 12}, "the second forgotten"},
		{trace([]int{2, 1, 0}, 50, 60, 70), []int{50, 60, 70}, "other accesses: history restarts"},
		{trace([]int{2, 1, 0}, 40, 70, 80), []int{40, 60, 70}, "after the restart"},
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

	opts.ComputeSteps = -1
	if _, err := New(res, opts); err == nil {
		t.Error("New accepted ComputeSteps -1")
	}
}
