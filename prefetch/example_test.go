package prefetch_test

import (
	"fmt"
	"time"

	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
)

// ExamplePlan plans two steps of a forward pass over four chunks whose
// params live in host memory, with room in HBM for two of them. Each
// upload (1 MB at 1 GB/s: 1 ms) takes as long as a chunk's compute: only
// the first, which nothing comes before, stalls the compute; the planner
// hides every other upload behind the compute of the chunk before,
// evicting a chunk already used to make room.
func ExamplePlan() {
	const chunkBytes = 1_000_000
	var tr prefetch.Trace
	res := prefetch.Residency{}
	for c := range shard.ChunkID(4) {
		key := shard.Key{Chunk: c, State: shard.Param}
		tr.Accesses = append(tr.Accesses, shard.Access{Key: key, Phase: shard.Forward,
			Tier: shard.HBM, Kind: shard.Read, SizeBytes: chunkBytes, Compute: time.Millisecond})
		res[key] = prefetch.Placement{SizeBytes: chunkBytes, Home: shard.Host}
	}
	opts := prefetch.DefaultOptions()
	opts.BudgetBytes[shard.HBM] = 2 * chunkBytes
	opts.BandwidthBytesPerSec[shard.HostToHBM] = 1e9

	s, err := prefetch.Plan(tr, res, opts, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	st := s.Stats
	fmt.Println("accesses", st.Accesses, "hits", st.Hits, "late", st.Late, "misses", st.Misses)
	fmt.Println("prefetches", st.MoveCount[shard.Prefetch], "evictions", st.MoveCount[shard.Evict])
	fmt.Println("stall", s.Stall, "steps end at", s.StepEnd)
	// Output:
	// accesses 8 hits 7 late 1 misses 0
	// prefetches 8 evictions 6
	// stall 1ms steps end at [5ms 9ms]
}
