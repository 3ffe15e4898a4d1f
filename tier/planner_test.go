package tier

import (
	"bytes"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/internal/shard"
	"github.com/strata-ai/strata/prefetch"
)

// TestReasonsMatchPrefetch: tier.Move is prefetch.Move with tier.Reason for
// prefetch.Reason and the same numbering of links, so the engine converts
// with a field-by-field copy.
func TestReasonsMatchPrefetch(t *testing.T) {
	for r := prefetch.Prefetch; r <= prefetch.Alloc; r++ {
		if Reason(r).String() != r.String() {
			t.Errorf("reason %d: tier %q, prefetch %q", r, Reason(r), r)
		}
		m := prefetch.Move{Reason: r}
		if Instant := Reason(r) == Evict || Reason(r) == Alloc; Instant != m.Instant() {
			t.Errorf("reason %s: instant differs", r)
		}
	}
	for l := range prefetch.LinkCount {
		if Link(l).String() != prefetch.Link(l).String() {
			t.Errorf("link %d: tier %q, prefetch %q", l, Link(l), prefetch.Link(l))
		}
	}
}

func fromPlanner(m prefetch.Move) Move {
	return Move{ID: m.ID, Key: m.Key, From: m.From, To: m.To, SizeBytes: m.SizeBytes, Reason: Reason(m.Reason)}
}

// TestPlannerDriven runs three training steps of a two-chunk model whose
// optimizer state lives on NVMe, as the engine will: the planner decides
// the moves, the store executes them, leases serve the accesses. Every
// access sees the newest data (params written by the optimizer, master
// weights updated in place and written back to NVMe), every move the
// planner issues is accepted, and no budget is exceeded.
func TestPlannerDriven(t *testing.T) {
	const unit = 4096 // every size a multiple of the pinned and swap alignment: the planner's bytes are the store's
	budget := [shard.TierCount]int64{shard.HBM: 3 * unit, shard.Host: 6 * unit}
	r := newRig(t, rigConfig{hbmBudgetBytes: budget[shard.HBM], hostBudgetBytes: budget[shard.Host], swapBytes: 4 << 20})
	key := func(c shard.ChunkID, s shard.State) shard.Key { return shard.Key{Chunk: c, State: s} }
	specs := map[shard.Key]Spec{}
	res := prefetch.Residency{}
	want := map[shard.Key][]byte{}
	for c := range shard.ChunkID(2) {
		specs[key(c, shard.Param)] = Spec{Elems: unit / 2, DType: dtype.BF16, Home: shard.Host}
		specs[key(c, shard.Grad)] = Spec{Elems: unit / 2, DType: dtype.BF16, Home: shard.Host}
		specs[key(c, shard.Master)] = Spec{Elems: unit / 2, DType: dtype.F32, Home: shard.NVMe}
	}
	for k, sp := range specs {
		if err := r.s.Register(k, sp); err != nil {
			t.Fatal(err)
		}
		res[k] = prefetch.Placement{SizeBytes: sp.SizeBytes(), Home: sp.Home}
		want[k] = make([]byte, sp.SizeBytes())
	}
	// Initial params in their host homes.
	for c := range shard.ChunkID(2) {
		k := key(c, shard.Param)
		want[k] = pattern(k, 100, specs[k].SizeBytes())
		r.put(t, k, shard.Host, want[k])
	}
	opts := prefetch.DefaultOptions()
	opts.BudgetBytes = budget
	p, err := prefetch.New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Millisecond
	acc := func(ph prefetch.Phase, k shard.Key, tr shard.Tier, kind prefetch.Kind, d time.Duration) prefetch.Access {
		return prefetch.Access{Key: k, Phase: ph, Tier: tr, Kind: kind, SizeBytes: specs[k].SizeBytes(), Compute: d}
	}
	var tr prefetch.Trace
	for c := range shard.ChunkID(2) {
		tr.Accesses = append(tr.Accesses, acc(prefetch.Forward, key(c, shard.Param), shard.HBM, prefetch.Read, 5*ms))
	}
	for c := shard.ChunkID(1); c >= 0; c-- {
		tr.Accesses = append(tr.Accesses,
			acc(prefetch.Backward, key(c, shard.Param), shard.HBM, prefetch.Read, 5*ms),
			acc(prefetch.Backward, key(c, shard.Grad), shard.HBM, prefetch.Write, ms))
	}
	for c := shard.ChunkID(1); c >= 0; c-- {
		tr.Accesses = append(tr.Accesses,
			acc(prefetch.Optimizer, key(c, shard.Grad), shard.Host, prefetch.Read, 0),
			acc(prefetch.Optimizer, key(c, shard.Master), shard.Host, prefetch.Update, 3*ms),
			acc(prefetch.Optimizer, key(c, shard.Param), shard.Host, prefetch.Write, 0))
	}
	if err := p.SetTrace(tr); err != nil {
		t.Fatal(err)
	}

	type flight struct {
		m  prefetch.Move
		op *Op
	}
	var pending []flight
	now := time.Duration(0)
	exec := func(moves []prefetch.Move) {
		t.Helper()
		for _, m := range moves {
			op, err := r.s.Submit(fromPlanner(m))
			if err != nil {
				t.Fatalf("store refused the planner's %s: %v", m, err)
			}
			if m.Instant() {
				if !op.Done() {
					t.Fatalf("the planner's %s is instant, the store's is not (a dirty copy?)", m)
				}
				continue
			}
			pending = append(pending, flight{m, op})
		}
	}
	reap := func() {
		t.Helper()
		f := pending[0]
		pending = pending[1:]
		if err := f.op.Wait(); err != nil {
			t.Fatalf("%s: %v", f.m, err)
		}
		now += ms / 4
		p.Completed(f.m, now)
	}
	version := uint64(0)
	for step := range 3 {
		p.BeginStep(now)
		for _, a := range tr.Accesses {
			_, moves, err := p.Access(a, now)
			if err != nil {
				t.Fatal(err)
			}
			exec(moves)
			for i := 0; !p.Ready(a); i++ {
				if i > 1000 {
					t.Fatalf("step %d: %s never became ready", step, a)
				}
				if len(pending) > 0 {
					reap()
				} else if w, ok := p.WakeAt(); ok {
					now = max(now, w)
				} else {
					now += ms
				}
				exec(p.Next(now))
			}
			mode := Read
			if a.Kind != prefetch.Read {
				mode = Write
			}
			l, err := r.s.Acquire(a.Key, a.Tier, mode)
			if err != nil {
				t.Fatalf("step %d: %s: %v", step, a, err)
			}
			if a.Kind != prefetch.Write && !bytes.Equal(r.contents(t, l), want[a.Key]) {
				t.Fatalf("step %d: %s sees data that is not the newest", step, a)
			}
			if a.Kind != prefetch.Read {
				version++
				want[a.Key] = pattern(a.Key, version, specs[a.Key].SizeBytes())
				if a.Tier == shard.HBM {
					writeDevice(t, r, l.Buffer(), want[a.Key])
				} else {
					copy(l.Bytes(), want[a.Key])
				}
			}
			l.Release()
			p.Release(a.Key, now)
			now += a.Compute
			exec(p.Next(now))
			checkBudgets(t, r.s.Stats())
		}
	}
	for len(pending) > 0 {
		reap()
		exec(p.Next(now))
	}
	st := r.s.Stats()
	checkBudgets(t, st)
	if st.Links[HostToNVMe].Moves == 0 || st.Links[NVMeToHost].Moves == 0 {
		t.Errorf("master weights never went through NVMe: %s", st)
	}
	// The newest master weights are where the store says they are.
	for c := range shard.ChunkID(2) {
		k := key(c, shard.Master)
		where, _ := r.s.Where(k)
		if where.Lost != nil {
			t.Fatal(where.Lost)
		}
		if !where.Copies[shard.Host].Valid {
			o := key(1-c, shard.Master) // make room: write the other one back
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
	ps := p.Stats()
	t.Logf("planner: hit rate %.2f, moves %v; store: %s", ps.HitRate(), ps.MoveCount, st)
}
