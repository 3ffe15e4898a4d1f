package prefetch

import (
	"reflect"
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestSimUnrecorded checks that the harness the benchmarks time (sim
// without a kept timeline, its moves in flight in reused slots) runs the
// planner exactly as Simulate does: the same counters, stall, step ends
// and peak bytes per pool, on a model whose host budget forces evictions
// and write-backs (so that slots are freed and reused while others fly).
func TestSimUnrecorded(t *testing.T) {
	const paramBytes = 100
	tr, res := modelStep(4, 2, paramBytes, 4*time.Millisecond, 3*time.Millisecond)
	opts := DefaultOptions()
	opts.BandwidthBytesPerSec = [shard.LinkCount]float64{shard.NVMeToHost: 400e3, shard.HostToNVMe: 400e3, shard.HostToHBM: 4000e3, shard.HBMToHost: 4000e3}
	opts.DisableWriteBehind = true // write-backs on eviction
	opts.BudgetBytes[shard.HBM] = 3 * paramBytes
	opts.BudgetBytes[shard.Host] = 8*paramBytes + 8*paramBytes + 12*paramBytes
	const steps = 4
	want, err := Plan(tr, res, opts, steps)
	if err != nil {
		t.Fatal(err)
	}
	if want.Stats.MoveCount[shard.WriteBack] == 0 || want.Stats.MoveCount[shard.Evict] == 0 {
		t.Fatalf("the model no longer evicts and writes back: %v", want.Stats.MoveCount)
	}

	p, err := New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetTrace(tr); err != nil {
		t.Fatal(err)
	}
	p.limit = steps * int64(len(tr.Accesses)) // as Plan knows that nothing follows
	s := newSim(p, res, false)
	for i := 0; i < steps; i++ {
		if err := s.runStep(tr); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if len(s.sched.Moves) != 0 || len(s.sched.Accesses) != 0 {
		t.Errorf("unrecorded sim kept %d moves and %d accesses", len(s.sched.Moves), len(s.sched.Accesses))
	}
	if got := p.Stats(); got != want.Stats {
		t.Errorf("stats:\n got %+v\nwant %+v", got, want.Stats)
	}
	if s.sched.Stall != want.Stall {
		t.Errorf("stall %v, want %v", s.sched.Stall, want.Stall)
	}
	if !reflect.DeepEqual(s.sched.StepEnd, want.StepEnd) {
		t.Errorf("step ends %v, want %v", s.sched.StepEnd, want.StepEnd)
	}
	if !reflect.DeepEqual(s.sched.PeakBytes, want.PeakBytes) {
		t.Errorf("peak bytes %v, want %v", s.sched.PeakBytes, want.PeakBytes)
	}
	if n := len(s.flying) - len(s.free); n != 0 {
		t.Errorf("%d moves still in flight after the last step", n)
	}
}
