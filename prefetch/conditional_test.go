package prefetch

import (
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestConditionalAccesses drives a step of a dense shard, four
// conditional ones (a sparse layer's experts) and a dense one, with a
// different subset of the experts used in each step: the planner keeps
// the trace (no divergence, no re-recording), reads from NVMe none of the
// experts a step skips, and has each expert a step confirms ready in HBM
// by the time it is used (a hit).
func TestConditionalAccesses(t *testing.T) {
	const size = 4096
	key := func(c int) shard.Key { return shard.Key{Chunk: shard.ChunkID(c), State: shard.Param} }
	res := Residency{}
	for c := range 6 {
		res[key(c)] = Placement{SizeBytes: size, Home: shard.NVMe}
	}
	opts := DefaultOptions()
	opts.BudgetBytes[shard.Host] = 2 * size // nothing stays cached from one step to the next
	opts.BudgetBytes[shard.HBM] = 2 * size
	p, err := New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	var now time.Duration
	reads := map[int]int{}
	drain := func(ms []shard.Move) {
		for len(ms) > 0 {
			for _, m := range ms {
				if m.From == shard.NVMe && m.To == shard.Host {
					reads[int(m.Key.Chunk)]++
				}
				if !m.Instant() {
					p.Completed(m, now)
				}
			}
			ms = p.Next(now)
		}
	}
	access := func(c int, cond bool) bool {
		t.Helper()
		a := shard.Access{Key: key(c), Phase: shard.Forward, Tier: shard.HBM, Kind: shard.Read, SizeBytes: size, Conditional: cond}
		hit, ms, err := p.Access(a, now)
		if err != nil {
			t.Fatal(err)
		}
		drain(ms)
		for !p.Ready(a) {
			now += time.Millisecond
			drain(p.Next(now))
		}
		now += 5 * time.Millisecond // the compute
		drain(p.Next(now))
		p.Release(a.Key, now)
		drain(p.Next(now))
		return hit
	}
	expert := func(e int) shard.Access {
		return shard.Access{Key: key(1 + e), Phase: shard.Forward, Tier: shard.HBM, Kind: shard.Read, SizeBytes: size, Conditional: true}
	}
	step := func(used []bool) (hits []bool) {
		t.Helper()
		p.BeginStep(now)
		clear(reads)
		access(0, false)
		for e, u := range used { // the router has run: the step names its experts
			if u {
				drain(p.Confirm(expert(e), now))
			}
		}
		now += 5 * time.Millisecond // the router's compute: the reads land meanwhile
		drain(p.Next(now))
		for e, u := range used {
			if u {
				hits = append(hits, access(1+e, true))
				continue
			}
			ms, err := p.Skip(expert(e), now)
			if err != nil {
				t.Fatal(err)
			}
			drain(ms)
		}
		access(5, false)
		return hits
	}
	routes := [][]bool{
		{false, false, true, true}, // recorded
		{false, true, false, false},
		{true, false, false, true},
		{false, false, false, false},
		{true, true, true, true},
		{false, true, false, false},
	}
	skipped := int64(0)
	for i, used := range routes {
		hits := step(used)
		for e, u := range used {
			switch {
			case !u:
				skipped++
				if reads[1+e] != 0 {
					t.Errorf("step %d: expert %d, skipped, was read from NVMe %d times", i, e, reads[1+e])
				}
			case reads[1+e] != 1:
				t.Errorf("step %d: expert %d, used, was read from NVMe %d times, want 1", i, e, reads[1+e])
			}
		}
		for j, h := range hits {
			if i > 0 && !h {
				t.Errorf("step %d: used expert %d of %v missed: its read did not start at Confirm", i, j, used)
			}
		}
	}
	st := p.Stats()
	if st.Divergences != 0 || st.Rerecords != 0 {
		t.Errorf("%d divergences, %d re-recordings: a skip or a different routing diverged from the trace", st.Divergences, st.Rerecords)
	}
	if st.Skipped != skipped {
		t.Errorf("Stats.Skipped %d, want %d", st.Skipped, skipped)
	}
	if len(p.trace) != 6 {
		t.Errorf("the trace has %d accesses, want the 6 of the superset", len(p.trace))
	}

	// A skip where the trace has another access diverges, as an access does.
	p.BeginStep(now)
	ms, err := p.Skip(expert(3), now)
	if err != nil {
		t.Fatal(err)
	}
	drain(ms)
	if p.Stats().Divergences != 1 {
		t.Errorf("a skip out of place: %d divergences, want 1", p.Stats().Divergences)
	}
}
