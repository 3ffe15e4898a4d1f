package prefetch

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// randomStep builds a step of a model of `chunks` chunks on `ranks` ranks:
// forward reads params in HBM, backward reads them again and writes grads
// in HBM, the optimizer reads grads and updates master/m/v in host and
// writes the new param there. Homes are drawn at random.
func randomStep(r *rand.Rand, chunks, ranks int) (Trace, Residency) {
	res := Residency{}
	homes := []shard.Tier{shard.Host, shard.NVMe}
	for c := 0; c < chunks; c++ {
		for rk := 0; rk < ranks; rk++ {
			size := int64(100 * (1 + r.IntN(2)))
			ph := homes[r.IntN(2)]
			oh := homes[r.IntN(2)]
			for st := shard.Param; int(st) < shard.StateCount; st++ {
				k := shard.Key{Chunk: shard.ChunkID(c), Rank: int32(rk), State: st}
				h := oh
				switch st {
				case shard.Param:
					h = ph
				case shard.Grad:
					h = shard.Host
				}
				res[k] = Placement{SizeBytes: size, Home: h}
			}
		}
	}
	var tr Trace
	add := func(c, rk int, st shard.State, ph shard.Phase, t shard.Tier, k shard.Kind) {
		key := shard.Key{Chunk: shard.ChunkID(c), Rank: int32(rk), State: st}
		tr.Accesses = append(tr.Accesses, shard.Access{Key: key, Phase: ph, Tier: t, Kind: k, SizeBytes: res[key].SizeBytes,
			Compute: time.Duration(r.IntN(3000)) * time.Microsecond})
	}
	for c := 0; c < chunks; c++ {
		for rk := 0; rk < ranks; rk++ {
			add(c, rk, shard.Param, shard.Forward, shard.HBM, shard.Read)
		}
	}
	for c := chunks - 1; c >= 0; c-- {
		for rk := 0; rk < ranks; rk++ {
			add(c, rk, shard.Param, shard.Backward, shard.HBM, shard.Read)
			add(c, rk, shard.Grad, shard.Backward, shard.HBM, shard.Write)
		}
	}
	for c := chunks - 1; c >= 0; c-- {
		for rk := 0; rk < ranks; rk++ {
			add(c, rk, shard.Grad, shard.Optimizer, shard.Host, shard.Read)
			for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
				add(c, rk, st, shard.Optimizer, shard.Host, shard.Update)
			}
			add(c, rk, shard.Param, shard.Optimizer, shard.Host, shard.Write)
		}
	}
	return tr, res
}

// TestPropertyBudgetsAndResidency replays every schedule with its own
// accounting, independent of the planner's: no pool ever goes over its
// budget, and every access finds its shard valid in its tier when it is
// ready (and at its start when reported a hit). Each case runs with the
// automatic window and with a window of 3 accesses.
func TestPropertyBudgetsAndResidency(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 60; iter++ {
		chunks, ranks := 1+r.IntN(4), 1+r.IntN(2)
		tr, res := randomStep(r, chunks, ranks)
		opts := DefaultOptions()
		for l := range opts.BandwidthBytesPerSec {
			opts.BandwidthBytesPerSec[l] = float64(20+r.IntN(300)) * 1000
		}
		var homeHost int64
		for _, pl := range res {
			if pl.Home == shard.Host {
				homeHost += pl.SizeBytes
			}
		}
		// Room for a few shards beyond the homes: a working set of the
		// largest access (200 B) plus something to prefetch into.
		opts.BudgetBytes[shard.HBM] = 400 + 100*int64(r.IntN(6))
		opts.BudgetBytes[shard.Host] = homeHost + 400 + 100*int64(r.IntN(6))
		opts.Slack = time.Duration(r.IntN(1000)) * time.Microsecond
		steps := make([]Trace, 3)
		for i := range steps {
			steps[i] = tr
		}
		known := tr
		if r.IntN(3) == 0 {
			known = Trace{} // record the first step
		}
		if r.IntN(3) == 0 { // a diverging middle step: another order of the optimizer
			alt := Trace{Accesses: append([]shard.Access(nil), tr.Accesses...)}
			r.Shuffle(len(alt.Accesses), func(i, j int) {})
			n := len(alt.Accesses)
			alt.Accesses[n-1], alt.Accesses[n-2] = alt.Accesses[n-2], alt.Accesses[n-1]
			steps[1] = alt
		}
		// The automatic window, then a horizon of 3 accesses that cuts
		// every trace: the invariants hold whatever the planner sees.
		for _, w := range []int{0, 3} {
			opts.Window = w
			s, err := Simulate(known, steps, res, opts)
			if err != nil {
				t.Fatalf("iter %d window %d: %v", iter, w, err)
			}
			replay(t, iter, s, res, opts)
		}
	}
}

func replay(t *testing.T, iter int, s *Schedule, res Residency, opts Options) {
	t.Helper()
	type ev struct {
		seq  int
		kind int // 0 move issue, 1 move done, 2 access start, 3 access ready, 4 access end
		i    int
	}
	var evs []ev
	for i, m := range s.Moves {
		evs = append(evs, ev{m.IssueSeq, 0, i})
		if !m.Instant() {
			evs = append(evs, ev{m.DoneSeq, 1, i})
		}
	}
	for i, a := range s.Accesses {
		evs = append(evs, ev{a.StartSeq, 2, i}, ev{a.ReadySeq, 3, i}, ev{a.EndSeq, 4, i})
	}
	sort.Slice(evs, func(a, b int) bool {
		if evs[a].seq != evs[b].seq {
			return evs[a].seq < evs[b].seq
		}
		return evs[a].kind < evs[b].kind
	})
	pool := func(k shard.Key, t shard.Tier) [2]int32 {
		if t == shard.HBM {
			return [2]int32{int32(t), k.Rank}
		}
		return [2]int32{int32(t), 0}
	}
	used := map[[2]int32]int64{}
	type st struct {
		have  [shard.TierCount]bool
		stale [shard.TierCount]bool // overwritten elsewhere, evicted later
		dirty bool                  // home is stale
	}
	state := map[shard.Key]*st{}
	for k, pl := range res {
		x := &st{}
		for tt := shard.Tier(0); int(tt) < shard.TierCount; tt++ {
			if tt == pl.Home || pl.Cached.Has(tt) {
				x.have[tt] = true
				used[pool(k, tt)] += pl.SizeBytes
			}
		}
		state[k] = x
	}
	valid := func(k shard.Key, tt shard.Tier) bool {
		x := state[k]
		return x.have[tt] && !x.stale[tt] && (tt != res[k].Home || !x.dirty)
	}
	check := func(what string) {
		for p, u := range used {
			if b := opts.BudgetBytes[p[0]]; b > 0 && u > b {
				t.Fatalf("iter %d: %s: %s (rank %d) holds %d B, budget %d B", iter, what, shard.Tier(p[0]), p[1], u, b)
			}
		}
	}
	for _, e := range evs {
		switch e.kind {
		case 0:
			m := s.Moves[e.i]
			x := state[m.Key]
			switch m.Reason {
			case shard.Evict:
				if !x.have[m.From] {
					t.Fatalf("iter %d: evict of %s from %s where it is not", iter, m.Key, m.From)
				}
				x.have[m.From], x.stale[m.From] = false, false
				used[pool(m.Key, m.From)] -= m.SizeBytes
			case shard.Alloc:
				used[pool(m.Key, m.To)] += m.SizeBytes
				x.have[m.To], x.stale[m.To] = true, false
			default:
				if !valid(m.Key, m.From) {
					t.Fatalf("iter %d: %s reads %s from %s, which has no valid copy", iter, m.Reason, m.Key, m.From)
				}
				if m.To != res[m.Key].Home {
					used[pool(m.Key, m.To)] += m.SizeBytes
				}
			}
			check(m.Move.String())
		case 1:
			m := s.Moves[e.i]
			x := state[m.Key]
			x.have[m.To], x.stale[m.To] = true, false
			if m.To == res[m.Key].Home {
				x.dirty = false
			}
			if m.Reason == shard.WriteBack {
				x.have[m.From] = false
				used[pool(m.Key, m.From)] -= m.SizeBytes
			}
		case 3:
			a := s.Accesses[e.i]
			ok := valid(a.Key, a.Tier)
			if a.Kind == shard.Write {
				ok = state[a.Key].have[a.Tier]
			}
			if !ok {
				t.Fatalf("iter %d: step %d access #%d (%s) ready at %v without a valid copy in %s", iter, a.Step, a.Index, a.Key, a.Ready, a.Tier)
			}
			if a.Outcome == Hit && a.Ready != a.Start {
				t.Fatalf("iter %d: access %d reported a hit but waited %v", iter, a.Index, a.Ready-a.Start)
			}
			if a.Outcome != Hit && a.Ready == a.Start && a.Kind != shard.Write {
				t.Fatalf("iter %d: access %d reported %s without a stall", iter, a.Index, a.Outcome)
			}
		case 4:
			a := s.Accesses[e.i]
			if a.Kind != shard.Read {
				x := state[a.Key]
				x.dirty = a.Tier != res[a.Key].Home
				for tt := shard.Tier(0); int(tt) < shard.TierCount; tt++ {
					if tt != a.Tier && tt != res[a.Key].Home && x.have[tt] {
						x.stale[tt] = true // the planner evicts it (a move follows)
					}
				}
			}
		}
	}
}
