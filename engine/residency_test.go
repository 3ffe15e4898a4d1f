package engine

import (
	"testing"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/shard"
)

// TestOffloadResidency: with offload_optimizer cpu (ZeRO-Offload) at
// stages 1-3 the host optimizer's state lives in the tier store, homed in
// host RAM: master, m, v and the reduced gradient of every (chunk, rank),
// registered at the rank's shard length; nothing moves between tiers, every
// access is a planned hit, the homes are the estimate's host model state
// and fill the pinned pool, and the optimizer writes the store's copies.
func TestOffloadResidency(t *testing.T) {
	for stage := 1; stage <= 3; stage++ {
		s := runSpec{stage: stage, n: 2, offload: true, micro: 1, accum: 1}
		t.Run(s.String(), func(t *testing.T) {
			e := newTestEngine(t, s)
			if e.tiers == nil {
				t.Fatal("ZeRO-Offload runs without the tier store")
			}
			for c, p := range e.chunks {
				for r := range e.n {
					for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV, shard.Grad} {
						w, err := e.tiers.store.Where(tkey(c, r, st))
						if err != nil {
							t.Fatalf("chunk %d rank %d %s: %v", c, r, st, err)
						}
						if w.Spec.Home != shard.Host || !w.Copies[shard.Host].Valid {
							t.Errorf("chunk %d rank %d %s: home %s, host copy %+v", c, r, st, w.Spec.Home, w.Copies[shard.Host])
						}
						if sp := e.tiers.specs[tkey(c, r, st)]; sp.Elems != p.shard {
							t.Errorf("chunk %d rank %d %s: %d elements, the shard is %d", c, r, st, sp.Elems, p.shard)
						}
					}
				}
			}
			// The homes never come and go: the pinned pool is the homes,
			// with no room against fragmentation.
			if pb, hb := e.tiers.pool.Options().BudgetBytes, e.tiers.hostBudget; pb != hb {
				t.Errorf("pinned pool %d B for %d B of host homes", pb, hb)
			}
			before := storeMaster(t, e)
			var stats []report.StepStats
			if err := e.Run(t.Context(), 3, func(st report.StepStats) error { stats = append(stats, st); return nil }); err != nil {
				t.Fatal(err)
			}
			after := storeMaster(t, e)
			for k, b := range before {
				if int(k.Rank)*e.chunks[k.Chunk].shard >= e.chunks[k.Chunk].len {
					continue // padding only: zero, and stays zero
				}
				if string(b) == string(after[k]) {
					t.Errorf("%s: the store's master weights did not change in 3 steps", k)
				}
			}
			for _, st := range stats {
				ts := st.Tier
				if ts == nil {
					t.Fatalf("step %d: no tier stats", st.Step)
				}
				if ts.Accesses == 0 || ts.Hits != ts.Accesses || ts.LinkBytes != [len(ts.LinkBytes)]int64{} {
					t.Errorf("step %d: %d accesses, %d hits, moved %v: host homes should serve every access in place", st.Step, ts.Accesses, ts.Hits, ts.LinkBytes)
				}
			}
			sum := e.Summary()
			if sum.HostBytes != sum.HostFormula || sum.Tier.HostHomeBytes != sum.Tier.EstimateHostBytes || sum.Tier.NVMeHomeBytes != 0 {
				t.Errorf("host model state %d, formula %d; homes host %d (estimate %d) nvme %d", sum.HostBytes, sum.HostFormula,
					sum.Tier.HostHomeBytes, sum.Tier.EstimateHostBytes, sum.Tier.NVMeHomeBytes)
			}
		})
	}
}

// storeMaster reads every master shard from the tier store.
func storeMaster(t *testing.T, e *Engine) map[shard.Key][]byte {
	t.Helper()
	if err := e.tiers.pause(); err != nil {
		t.Fatal(err)
	}
	defer e.tiers.resume()
	out := map[shard.Key][]byte{}
	for c := range e.chunks {
		for r := range e.n {
			b, err := e.tiers.readShard(tkey(c, r, shard.Master))
			if err != nil {
				t.Fatal(err)
			}
			out[tkey(c, r, shard.Master)] = b
		}
	}
	return out
}
