package report_test

import (
	"fmt"
	"time"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/prefetch"
)

// ExamplePrefetchCounts sums two ranks' planner counters into the figures
// an engine reports for a step, and the host optimizer's exposed share.
func ExamplePrefetchCounts() {
	ranks := []prefetch.Stats{
		{Accesses: 40, Hits: 36, Late: 3, Misses: 1},
		{Accesses: 40, Hits: 30, Late: 6, Misses: 2, Dependent: 2},
	}
	var total report.PrefetchCounts
	for _, s := range ranks {
		total.Add(report.CountsOf(s), nil)
	}
	fmt.Printf("accesses %d hits %d late %d misses %d hit rate %.3f\n",
		total.Accesses, total.Hits, total.Late, total.Misses, total.HitRate)

	opt := report.HostOptStats{Adam: 80 * time.Millisecond, AdamExposed: 20 * time.Millisecond}
	opt.Add(report.HostOptStats{Adam: 20 * time.Millisecond, AdamExposed: 5 * time.Millisecond})
	fmt.Println("cpuadam", opt.Adam, "exposed", opt.AdamExposedFraction())
	// Output:
	// accesses 80 hits 66 late 9 misses 3 hit rate 0.846
	// cpuadam 100ms exposed 0.25
}
