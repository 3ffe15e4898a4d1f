//go:build linux

package pinned

import (
	"testing"
	"time"
)

// BenchmarkFirstTouchVsReuse measures, side by side in every iteration, the
// bandwidth of faulting fresh memory in by each populate method (mmap, advice
// and population of a 64 MiB arena) and of writing every byte of an arena
// already faulted in (reuse). It reports GB/s (1 GB = 10^9 B) per method, the
// ratio of reuse to the default method (madvise) and of the default method to
// plain MAP_POPULATE, the anchor, next to the default ns/op (one iteration:
// every method once and the reuse pass). The order of the methods rotates
// each iteration. Run:
//
//	go test -run '^$' -bench FirstTouch -benchtime 20x ./pinned
func BenchmarkFirstTouchVsReuse(b *testing.B) {
	const sizeBytes = 64 << 20
	methods := []struct {
		name string
		o    Options
	}{
		{"madvise", Options{Populate: PopulateMadvise}},
		{"touch", Options{Populate: PopulateTouch}},
		{"map-populate", Options{Populate: PopulateMapFlag}},
		{"touch-4k", Options{Populate: PopulateTouch, NoHugePages: true}},
	}
	warm, err := sysMap(sizeBytes, hugePageBytes, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer sysUnmap(warm)
	if _, err := sysPopulate(warm, PopulateAuto); err != nil {
		b.Fatal(err)
	}
	spent := make([]time.Duration, len(methods)+1)
	iterations := 0
	for b.Loop() {
		for k := range methods {
			i := (k + iterations) % len(methods) // rotate the order: no method always runs first
			m := methods[i]
			start := time.Now()
			mem, err := sysMap(sizeBytes, hugePageBytes, m.o)
			if err == nil {
				_, err = sysPopulate(mem, m.o.Populate)
			}
			spent[i] += time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			_ = sysUnmap(mem)
		}
		start := time.Now()
		clear(warm)
		spent[len(methods)] += time.Since(start)
		iterations++
	}
	gbps := func(d time.Duration) float64 { return float64(iterations) * sizeBytes / d.Seconds() / 1e9 }
	for i, m := range methods {
		b.ReportMetric(gbps(spent[i]), m.name+"-GB/s")
	}
	reuse := gbps(spent[len(methods)])
	b.ReportMetric(reuse, "reuse-GB/s")
	b.ReportMetric(reuse/gbps(spent[0]), "reuse/madvise")
	b.ReportMetric(gbps(spent[0])/gbps(spent[2]), "madvise/map-populate")
}

// TestFirstTouchBenchmarkReports runs the benchmark once as `go test -bench`
// would and checks what it reports: the default ns/op (one iteration's
// time, not overridden) and each custom metric.
func TestFirstTouchBenchmarkReports(t *testing.T) {
	if testing.Short() {
		t.Skip("maps and faults in 64 MiB arenas for about a second")
	}
	r := testing.Benchmark(BenchmarkFirstTouchVsReuse)
	if r.N == 0 {
		t.Fatal("the benchmark failed (see its log)")
	}
	if _, over := r.Extra["ns/op"]; over || r.NsPerOp() <= 0 || r.NsPerOp() != r.T.Nanoseconds()/int64(r.N) {
		t.Errorf("ns/op %d over %d iterations of %v: the default metric is overridden or missing", r.NsPerOp(), r.N, r.T)
	}
	for _, m := range []string{"madvise-GB/s", "touch-GB/s", "map-populate-GB/s", "touch-4k-GB/s", "reuse-GB/s", "reuse/madvise", "madvise/map-populate"} {
		if v, ok := r.Extra[m]; !ok || !(v > 0) {
			t.Errorf("%s = %v (reported %v), want > 0", m, v, ok)
		}
	}
}
