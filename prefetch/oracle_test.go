package prefetch

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// The oracles below search every eviction choice of a demand-paged cache
// over a short access sequence (memoized on the cache contents), so they
// give the minimum bytes any policy must fetch. A planner that prefetches
// still needs a shard in the tier when it is used, so it can never fetch
// less; with uniform sizes Belady's rule (furthest next use) reaches the
// minimum, which the planner must match exactly. With varied sizes
// furthest-next-use is a heuristic (the problem is NP-hard in general):
// the tests require it to be no worse than LRU and state the worst ratio
// to the optimum observed on the fixed seeds.

// oracleOneTier is the minimum bytes fetched into a cache of capacity
// budget for the sequence seq of shard indices with the given sizes,
// starting empty.
func oracleOneTier(seq []int, sizes []int64, budget int64) int64 {
	memo := map[[2]int]int64{}
	var best func(i int, mask int) int64
	best = func(i int, mask int) int64 {
		if i == len(seq) {
			return 0
		}
		key := [2]int{i, mask}
		if v, ok := memo[key]; ok {
			return v
		}
		x := seq[i]
		var r int64
		if mask&(1<<x) != 0 {
			r = best(i+1, mask)
		} else {
			r = -1
			// Every subset of the cached shards may be evicted.
			for sub := mask; ; sub = (sub - 1) & mask {
				keep := mask &^ sub
				if used(keep, sizes)+sizes[x] <= budget {
					if v := sizes[x] + best(i+1, keep|1<<x); r < 0 || v < r {
						r = v
					}
				}
				if sub == 0 {
					break
				}
			}
		}
		memo[key] = r
		return r
	}
	return best(0, 0)
}

func used(mask int, sizes []int64) int64 {
	var u int64
	for i := range sizes {
		if mask&(1<<i) != 0 {
			u += sizes[i]
		}
	}
	return u
}

// lruOneTier is demand paging with least-recently-used eviction.
func lruOneTier(seq []int, sizes []int64, budget int64) int64 {
	var cache []int // most recent last
	var fetched, u int64
	for _, x := range seq {
		hit := -1
		for i, c := range cache {
			if c == x {
				hit = i
			}
		}
		if hit >= 0 {
			cache = append(append(cache[:hit:hit], cache[hit+1:]...), x)
			continue
		}
		for u+sizes[x] > budget {
			u -= sizes[cache[0]]
			cache = cache[1:]
		}
		cache = append(cache, x)
		u += sizes[x]
		fetched += sizes[x]
	}
	return fetched
}

// oracleTwoTier is the minimum bytes moved over NVMe->host plus host->HBM
// for shards homed on NVMe and read in HBM, with a host cache and an HBM
// cache, starting empty. A shard reaches HBM through host RAM.
func oracleTwoTier(seq []int, sizes []int64, hbmBudget, hostBudget int64) int64 {
	memo := map[[3]int]int64{}
	var best func(i, hbm, host int) int64
	subsets := func(mask int, f func(sub int)) {
		for sub := mask; ; sub = (sub - 1) & mask {
			f(sub)
			if sub == 0 {
				return
			}
		}
	}
	best = func(i, hbm, host int) int64 {
		if i == len(seq) {
			return 0
		}
		key := [3]int{i, hbm, host}
		if v, ok := memo[key]; ok {
			return v
		}
		x := seq[i]
		bit := 1 << x
		r := int64(-1)
		take := func(v int64) {
			if r < 0 || v < r {
				r = v
			}
		}
		switch {
		case hbm&bit != 0:
			r = best(i+1, hbm, host)
		default:
			cost := sizes[x]
			hosts := []int{host}
			if host&bit == 0 {
				cost += sizes[x]
				hosts = nil
				subsets(host, func(sub int) {
					if keep := host &^ sub; used(keep, sizes)+sizes[x] <= hostBudget {
						hosts = append(hosts, keep|bit)
					}
				})
			}
			for _, h := range hosts {
				subsets(hbm, func(sub int) {
					keep := hbm &^ sub
					if used(keep, sizes)+sizes[x] > hbmBudget {
						return
					}
					take(cost + best(i+1, keep|bit, h))
					take(cost + best(i+1, keep|bit, h&^bit)) // drop the staging copy
				})
			}
		}
		memo[key] = r
		return r
	}
	return best(0, 0, 0)
}

// oracleWindows are the look-aheads the oracle tests run the planner with:
// 0, the automatic window, which on these traces of 4-12 accesses is the
// whole trace (MinWindow), and 2 accesses, a horizon that cuts every
// trace. The guarantees are the same under both: the planner evicts by the
// next use of each copy, which it reads from the shard's occurrences in
// the trace, not from the window, so a short horizon delays prefetches
// (more stall) but chooses the same victims (the same fetched bytes).
var oracleWindows = []int{0, 2}

type randCase struct {
	seq   []int
	sizes []int64
	tr    Trace
	opts  Options
}

func randomCase(r *rand.Rand, window, keys, n int, uniform bool) randCase {
	c := randCase{sizes: make([]int64, keys)}
	for i := range c.sizes {
		c.sizes[i] = 100
		if !uniform {
			c.sizes[i] = 100 * int64(1+r.IntN(3))
		}
	}
	for i := 0; i < n; i++ {
		x := r.IntN(keys)
		c.seq = append(c.seq, x)
		c.tr.Accesses = append(c.tr.Accesses, shard.Access{
			Key: shard.Key{Chunk: shard.ChunkID(x)}, Phase: shard.Forward, Tier: shard.HBM, Kind: shard.Read,
			SizeBytes: c.sizes[x], Compute: time.Duration(r.IntN(4)) * time.Millisecond,
		})
	}
	c.opts = DefaultOptions()
	c.opts.Window = window
	for l := range c.opts.BandwidthBytesPerSec {
		c.opts.BandwidthBytesPerSec[l] = float64(25+r.IntN(200)) * 1000 // 25..225 B/ms
	}
	c.opts.Slack = time.Duration(r.IntN(2)) * time.Millisecond
	// These links are slow for the compute (0.4-4 ms per 100 B against
	// 0-3 ms of compute): most traces have deadline pressure, where by
	// default a prefetch takes a worse victim rather than wait and be late.
	// The oracle counts bytes only, so the planner here keeps MIN's rule.
	c.opts.WaitForVictim = true
	return c
}

func residency(sizes []int64, home shard.Tier) Residency {
	res := Residency{}
	for i, s := range sizes {
		res[shard.Key{Chunk: shard.ChunkID(i)}] = Placement{SizeBytes: s, Home: home}
	}
	return res
}

func fetchedInto(s *Schedule, to shard.Tier) int64 {
	var b int64
	for _, m := range s.Moves {
		if (m.Reason == shard.Prefetch || m.Reason == shard.Demand) && m.To == to {
			b += m.SizeBytes
		}
	}
	return b
}

func TestOracleOneTierUniform(t *testing.T) {
	for _, w := range oracleWindows {
		t.Run(fmt.Sprintf("window=%d", w), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			for iter := 0; iter < 400; iter++ {
				c := randomCase(r, w, 2+r.IntN(4), 4+r.IntN(9), true)
				budget := int64(100 * (1 + r.IntN(3)))
				c.opts.BudgetBytes[shard.HBM] = budget
				s, err := Plan(c.tr, residency(c.sizes, shard.Host), c.opts, 1)
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				got, want := fetchedInto(s, shard.HBM), oracleOneTier(c.seq, c.sizes, budget)
				if got != want {
					t.Fatalf("iter %d: seq %v budget %d: planner fetched %d B, optimum %d B\n%s", iter, c.seq, budget, got, want, s)
				}
			}
		})
	}
}

// TestOracleOneTierUniformLateVictims checks the default planner, which
// takes a worse victim when waiting for Belady's would make a transfer
// late, on the uniform traces with fast links (1-3 ms of compute, 100 ns
// per transfer): where it never did so (Stats.LateVictims = 0) it fetches
// exactly MIN's bytes; where it did, at most one extra shard per time, and
// it never stalls longer than MIN's rule (WaitForVictim) on the same trace.
func TestOracleOneTierUniformLateVictims(t *testing.T) {
	for _, w := range oracleWindows {
		t.Run(fmt.Sprintf("window=%d", w), func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 6))
			exact := 0
			for iter := 0; iter < 400; iter++ {
				c := randomCase(r, w, 2+r.IntN(4), 4+r.IntN(9), true)
				c.opts.WaitForVictim = false
				for l := range c.opts.BandwidthBytesPerSec {
					c.opts.BandwidthBytesPerSec[l] = 1e9 // 100 B in 100 ns
				}
				c.opts.Slack = 0
				for i := range c.tr.Accesses {
					c.tr.Accesses[i].Compute = time.Duration(1+r.IntN(3)) * time.Millisecond
				}
				budget := int64(100 * (1 + r.IntN(3)))
				c.opts.BudgetBytes[shard.HBM] = budget
				s, err := Plan(c.tr, residency(c.sizes, shard.Host), c.opts, 1)
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				mo := c.opts
				mo.WaitForVictim = true
				ms, err := Plan(c.tr, residency(c.sizes, shard.Host), mo, 1)
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				got, want := fetchedInto(s, shard.HBM), oracleOneTier(c.seq, c.sizes, budget)
				n := s.Stats.LateVictims
				if n == 0 {
					exact++
				}
				if got < want || got > want+100*n {
					t.Fatalf("iter %d: seq %v budget %d: planner fetched %d B after %d late victims, optimum %d B\n%s", iter, c.seq, budget, got, n, want, s)
				}
				if s.Stall > ms.Stall {
					t.Fatalf("iter %d: seq %v budget %d: stall %v, %v waiting for Belady's victim\n%s\n%s", iter, c.seq, budget, s.Stall, ms.Stall, s, ms)
				}
			}
			t.Logf("%d of 400 traces without a late victim", exact)
			if exact == 0 {
				t.Fatal("no trace without a late victim: the exact case is not exercised")
			}
		})
	}
}

func TestOracleOneTierVaried(t *testing.T) {
	for _, w := range oracleWindows {
		t.Run(fmt.Sprintf("window=%d", w), func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, 4))
			worst := 1.0
			var sumRatio float64
			const iters = 300
			for iter := 0; iter < iters; iter++ {
				c := randomCase(r, w, 2+r.IntN(4), 4+r.IntN(8), false)
				budget := int64(300 + 100*r.IntN(4))
				c.opts.BudgetBytes[shard.HBM] = budget
				s, err := Plan(c.tr, residency(c.sizes, shard.Host), c.opts, 1)
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				got := fetchedInto(s, shard.HBM)
				opt := oracleOneTier(c.seq, c.sizes, budget)
				lru := lruOneTier(c.seq, c.sizes, budget)
				if got < opt {
					t.Fatalf("iter %d: planner fetched %d B, below the optimum %d B: the oracle or the accounting is wrong", iter, got, opt)
				}
				if got > lru {
					t.Fatalf("iter %d: seq %v sizes %v budget %d: planner fetched %d B, LRU %d B\n%s", iter, c.seq, c.sizes, budget, got, lru, s)
				}
				ratio := float64(got) / float64(opt)
				sumRatio += ratio
				if ratio > worst {
					worst = ratio
				}
			}
			t.Logf("varied sizes: planner/optimum mean %.3f worst %.3f", sumRatio/iters, worst)
			// Observed on these seeds: mean 1.004, worst 1.182.
			if worst > 1.25 {
				t.Fatalf("planner/optimum worst ratio %.3f, above 1.25", worst)
			}
		})
	}
}

// Two tiers: per-tier Belady with staging is not the joint optimum (the
// optimum may bypass or drop the staging copy at better moments).
func TestOracleTwoTier(t *testing.T) {
	for _, w := range oracleWindows {
		t.Run(fmt.Sprintf("window=%d", w), func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 6))
			worst := 1.0
			var sumRatio float64
			const iters = 200
			for iter := 0; iter < iters; iter++ {
				c := randomCase(r, w, 2+r.IntN(4), 4+r.IntN(7), true)
				hbm, host := int64(100*(1+r.IntN(2))), int64(100*(1+r.IntN(3)))
				c.opts.BudgetBytes[shard.HBM] = hbm
				c.opts.BudgetBytes[shard.Host] = host
				s, err := Plan(c.tr, residency(c.sizes, shard.NVMe), c.opts, 1)
				if err != nil {
					t.Fatalf("iter %d: %v", iter, err)
				}
				got := fetchedInto(s, shard.HBM) + fetchedInto(s, shard.Host)
				opt := oracleTwoTier(c.seq, c.sizes, hbm, host)
				if got < opt {
					t.Fatalf("iter %d: planner moved %d B, below the optimum %d B", iter, got, opt)
				}
				ratio := float64(got) / float64(opt)
				sumRatio += ratio
				if ratio > worst {
					worst = ratio
				}
				if ratio > 1.5 && testing.Verbose() {
					t.Logf("iter %d: seq %v hbm %d host %d: planner %d B, optimum %d B\n%s", iter, c.seq, hbm, host, got, opt, s)
				}
			}
			t.Logf("two tiers: planner/optimum mean %.3f worst %.3f", sumRatio/iters, worst)
			// Observed on these seeds: mean 1.015, worst 1.300.
			if worst > 1.35 {
				t.Fatalf("planner/optimum worst ratio %.3f, above 1.35", worst)
			}
		})
	}
}
