package tier

import (
	"bytes"
	"testing"
	"time"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
)

// TestPlannerDriven runs three training steps of a two-chunk model whose
// optimizer state lives on NVMe, as the engine does: a Runner executes the
// planner's moves on the store and serves the accesses with leases. Every
// access sees the newest data (params written by the optimizer, master
// weights updated in place and written back to NVMe), every move the
// planner issues is accepted (a refusal fails Use), no eviction the
// planner thought clean has to write back, and no budget is exceeded.
func TestPlannerDriven(t *testing.T) {
	const unit = 4096 // every size a multiple of the pinned and swap alignment: the planner's bytes are the store's
	budget := [shard.TierCount]int64{shard.HBM: 3 * unit, shard.Host: 6 * unit}
	r := newRig(t, rigConfig{hbmBudgetBytes: budget[shard.HBM], hostBudgetBytes: budget[shard.Host], swapBytes: 4 << 20})
	specs := plannedSpecs(unit)
	want := map[shard.Key][]byte{}
	res := prefetch.Residency{}
	for k, sp := range specs {
		if err := r.s.Register(k, sp); err != nil {
			t.Fatal(err)
		}
		res[k] = prefetch.Placement{SizeBytes: sp.SizeBytes(), Home: sp.Home}
		want[k] = make([]byte, sp.SizeBytes())
	}
	// Initial params in their host homes.
	for c := range shard.ChunkID(2) {
		k := plannedKey(c, shard.Param)
		want[k] = pattern(k, 100, specs[k].SizeBytes())
		r.put(t, k, shard.Host, want[k])
	}
	opts := prefetch.DefaultOptions()
	opts.BudgetBytes = budget
	p, err := prefetch.New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	tr := plannedTrace(specs)
	if err := p.SetTrace(tr); err != nil {
		t.Fatal(err)
	}
	run, err := NewRunner(r.s, p, RunnerOptions{OnMove: func(sp MoveSpan) {
		if sp.Move.Instant() && sp.Err == nil {
			t.Errorf("the planner's %s is instant, the store's is not (a dirty copy?)", sp.Move)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	version := uint64(0)
	for step := range 3 {
		if err := run.BeginStep(); err != nil {
			t.Fatal(err)
		}
		for _, a := range tr.Accesses {
			l, err := run.Use(a)
			if err != nil {
				t.Fatalf("step %d: %s: %v", step, a, err)
			}
			if a.Kind != shard.Write && !bytes.Equal(r.contents(t, l), want[a.Key]) {
				t.Fatalf("step %d: %s sees data that is not the newest", step, a)
			}
			if a.Kind != shard.Read {
				version++
				want[a.Key] = pattern(a.Key, version, specs[a.Key].SizeBytes())
				if a.Tier == shard.HBM {
					writeDevice(t, r, l.Buffer(), want[a.Key])
				} else {
					copy(l.Bytes(), want[a.Key])
				}
			}
			time.Sleep(a.Compute)
			run.Done(l, nil)
			checkBudgets(t, r.s.Stats())
		}
	}
	if err := run.Pause(); err != nil {
		t.Fatal(err)
	}
	st := r.s.Stats()
	checkBudgets(t, st)
	if st.InFlight != 0 {
		t.Errorf("%d moves in flight after Pause", st.InFlight)
	}
	if st.Links[shard.HostToNVMe].Moves == 0 || st.Links[shard.NVMeToHost].Moves == 0 {
		t.Errorf("master weights never went through NVMe: %s", st)
	}
	checkMasters(t, r, want)
	var ps prefetch.Stats
	run.Do(func() { ps = p.Stats() })
	t.Logf("planner: hit rate %.2f, moves %v; stall %v; store: %s", ps.HitRate(), ps.MoveCount, run.Stall(), st)
}

func plannedKey(c shard.ChunkID, s shard.State) shard.Key { return shard.Key{Chunk: c, State: s} }

// plannedSpecs are two chunks of params and grads (home host, a unit each) and master
// weights (home NVMe, two units each).
func plannedSpecs(unit int) map[shard.Key]Spec {
	specs := map[shard.Key]Spec{}
	for c := range shard.ChunkID(2) {
		specs[plannedKey(c, shard.Param)] = Spec{Elems: unit / 2, DType: dtype.BF16, Home: shard.Host}
		specs[plannedKey(c, shard.Grad)] = Spec{Elems: unit / 2, DType: dtype.BF16, Home: shard.Host}
		specs[plannedKey(c, shard.Master)] = Spec{Elems: unit / 2, DType: dtype.F32, Home: shard.NVMe}
	}
	return specs
}

// plannedTrace is one step: forward, backward (params read, grads
// written in HBM), optimizer (grads read, master updated, params written
// in host).
func plannedTrace(specs map[shard.Key]Spec) prefetch.Trace {
	ms := time.Millisecond
	acc := func(ph shard.Phase, k shard.Key, tr shard.Tier, kind shard.Kind, d time.Duration) shard.Access {
		return shard.Access{Key: k, Phase: ph, Tier: tr, Kind: kind, SizeBytes: specs[k].SizeBytes(), Compute: d}
	}
	var tr prefetch.Trace
	for c := range shard.ChunkID(2) {
		tr.Accesses = append(tr.Accesses, acc(shard.Forward, plannedKey(c, shard.Param), shard.HBM, shard.Read, 5*ms))
	}
	for c := shard.ChunkID(1); c >= 0; c-- {
		tr.Accesses = append(tr.Accesses,
			acc(shard.Backward, plannedKey(c, shard.Param), shard.HBM, shard.Read, 5*ms),
			acc(shard.Backward, plannedKey(c, shard.Grad), shard.HBM, shard.Write, ms))
	}
	for c := shard.ChunkID(1); c >= 0; c-- {
		tr.Accesses = append(tr.Accesses,
			acc(shard.Optimizer, plannedKey(c, shard.Grad), shard.Host, shard.Read, 0),
			acc(shard.Optimizer, plannedKey(c, shard.Master), shard.Host, shard.Update, 3*ms),
			acc(shard.Optimizer, plannedKey(c, shard.Param), shard.Host, shard.Write, 0))
	}
	return tr
}

// checkMasters reads the newest master weights from where the store says
// they are (the runner is paused: nothing is in flight).
func checkMasters(t *testing.T, r *rig, want map[shard.Key][]byte) {
	for c := range shard.ChunkID(2) {
		k := plannedKey(c, shard.Master)
		where, _ := r.s.Where(k)
		if where.Lost != nil {
			t.Fatal(where.Lost)
		}
		if !where.Copies[shard.Host].Valid {
			o := plannedKey(1-c, shard.Master) // make room: write the other one back
			if w, _ := r.s.Where(o); w.Copies[shard.Host].Present {
				r.mustWait(r.s.Evict(o, shard.Host))
			}
			r.mustWait(r.s.Fetch(k, shard.NVMe, shard.Host))
		}
		got, err := r.get(t, k, shard.Host)
		if err != nil || !bytes.Equal(got, want[k]) {
			t.Errorf("%s after three steps: err %v", k, err)
		}
	}
}
