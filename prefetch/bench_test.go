package prefetch

import (
	"fmt"
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// modelStep is one training step of a model of `layers` chunks on `ranks`
// ranks with all five states, offloaded the way issue 6 runs it: params and
// master/m/v homed on NVMe, gradients on host. Per rank a param shard is
// paramBytes (grad the same, master/m/v twice that). Forward reads each
// param in HBM, backward reads it again and writes the gradient in HBM, the
// optimizer reads the gradient in host, updates master, m and v there and
// writes the new param there.
func modelStep(layers, ranks int, paramBytes int64, layerCompute, optCompute time.Duration) (Trace, Residency) {
	return modelStepOrder(layers, ranks, paramBytes, layerCompute, optCompute, false)
}

// modelStepOrder is modelStep with the optimizer visiting the chunks in
// ascending order when optAscending is set (as backward leaves them, in
// descending order, otherwise).
func modelStepOrder(layers, ranks int, paramBytes int64, layerCompute, optCompute time.Duration, optAscending bool) (Trace, Residency) {
	res := Residency{}
	key := func(c, r int, st shard.State) shard.Key {
		return shard.Key{Chunk: shard.ChunkID(c), Rank: int32(r), State: st}
	}
	for c := 0; c < layers; c++ {
		for r := 0; r < ranks; r++ {
			res[key(c, r, shard.Param)] = Placement{SizeBytes: paramBytes, Home: shard.NVMe}
			res[key(c, r, shard.Grad)] = Placement{SizeBytes: paramBytes, Home: shard.Host}
			for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
				res[key(c, r, st)] = Placement{SizeBytes: 2 * paramBytes, Home: shard.NVMe}
			}
		}
	}
	var tr Trace
	add := func(c, r int, st shard.State, ph shard.Phase, t shard.Tier, k shard.Kind, d time.Duration) {
		kk := key(c, r, st)
		tr.Accesses = append(tr.Accesses, shard.Access{Key: kk, Phase: ph, Tier: t, Kind: k, SizeBytes: res[kk].SizeBytes, Compute: d})
	}
	// The ranks compute in parallel: the layer's time is on the last rank's access.
	last := func(r int, d time.Duration) time.Duration {
		if r == ranks-1 {
			return d
		}
		return 0
	}
	for c := 0; c < layers; c++ {
		for r := 0; r < ranks; r++ {
			add(c, r, shard.Param, shard.Forward, shard.HBM, shard.Read, last(r, layerCompute))
		}
	}
	for c := layers - 1; c >= 0; c-- {
		for r := 0; r < ranks; r++ {
			add(c, r, shard.Param, shard.Backward, shard.HBM, shard.Read, 0)
			add(c, r, shard.Grad, shard.Backward, shard.HBM, shard.Write, last(r, 2*layerCompute))
		}
	}
	for i := 0; i < layers; i++ {
		c := layers - 1 - i
		if optAscending {
			c = i
		}
		for r := 0; r < ranks; r++ {
			add(c, r, shard.Grad, shard.Optimizer, shard.Host, shard.Read, 0)
			add(c, r, shard.Master, shard.Optimizer, shard.Host, shard.Update, 0)
			add(c, r, shard.AdamM, shard.Optimizer, shard.Host, shard.Update, 0)
			add(c, r, shard.AdamV, shard.Optimizer, shard.Host, shard.Update, optCompute)
			add(c, r, shard.Param, shard.Optimizer, shard.Host, shard.Write, 0)
		}
	}
	return tr, res
}

// benchModel is the model of BenchmarkPlannerStep: 48 layers on 4 ranks,
// 50 MB param shards (3 GB of params, 24 GB of model state), HBM per rank
// room for 8 param shards, host room for the gradient homes plus 96
// optimizer shards.
func benchModel(layers int) (Trace, Residency, Options) { return benchModelRanks(layers, 4) }

// benchModelRanks is benchModel with the given number of ranks in one
// planner (the engine runs one planner per rank: ranks = 1, with the
// budgets of one rank).
func benchModelRanks(layers, ranks int) (Trace, Residency, Options) {
	const paramBytes = 50 << 20
	tr, res := modelStep(layers, ranks, paramBytes, 20*time.Millisecond, 5*time.Millisecond)
	opts := DefaultOptions()
	opts.BudgetBytes[shard.HBM] = 8 * paramBytes
	opts.BudgetBytes[shard.Host] = int64(layers*ranks)*paramBytes + int64(24*ranks)*2*paramBytes
	opts.BandwidthBytesPerSec[shard.NVMeToHost] = 12e9
	opts.BandwidthBytesPerSec[shard.HostToNVMe] = 8e9
	return tr, res, opts
}

// BenchmarkPlannerStep measures the planner's own cost: one training step
// of Access/Release/Completed/Next per iteration, after a warm-up step, in
// ns per access. The model of 48 layers is the one to quote; the smaller
// ones show how the cost grows with the trace.
func BenchmarkPlannerStep(b *testing.B) {
	for _, layers := range []int{12, 24, 48} {
		b.Run(fmt.Sprintf("layers=%d", layers), func(b *testing.B) { benchPlannerStep(b, layers) })
	}
}

// BenchmarkPlannerStepPerRank is the planner as the engine runs it: one
// planner per rank, each seeing only its rank's accesses and shards.
func BenchmarkPlannerStepPerRank(b *testing.B) {
	for _, layers := range []int{48, 96, 192} {
		b.Run(fmt.Sprintf("layers=%d", layers), func(b *testing.B) { benchPlannerStepRanks(b, layers, 1) })
	}
}

func benchPlannerStep(b *testing.B, layers int) { benchPlannerStepRanks(b, layers, 4) }

func benchPlannerStepRanks(b *testing.B, layers, ranks int) {
	tr, res, opts := benchModelRanks(layers, ranks)
	p, err := New(res, opts)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.SetTrace(tr); err != nil {
		b.Fatal(err)
	}
	// The harness of Simulate, keeping no timeline: what is timed is the
	// planner's work and the modeled engine's event queue.
	s := newSim(p, res, false)
	if err := s.runStep(tr); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.runStep(tr); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	n := float64(b.N) * float64(len(tr.Accesses))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/access")
	st := p.Stats()
	b.ReportMetric(100*st.HitRate(), "hit%")
}
