package bench

import "testing"

// TestBestNVMeSetting: the sweep recommends, among the settings within 3 %
// of the highest MB/s, the one with the fewest bytes in flight, wherever it
// comes in the sweep's order.
func TestBestNVMeSetting(t *testing.T) {
	const k, m = 1 << 10, 1 << 20
	r := func(bs int64, qd int, mbps float64) NVMeResult {
		return NVMeResult{BlockBytes: bs, QueueDepth: qd, MBps: mbps}
	}
	cases := []struct {
		name    string
		results []NVMeResult
		want    int
	}{
		{"none", nil, -1},
		{"one", []NVMeResult{r(m, 32, 100)}, 0},
		// The old loop kept the first within 3 % in bs-then-qd order
		// (128K qd64: 8 MiB) and never looked at 1M qd4 (4 MiB).
		{"smaller later in the order", []NVMeResult{
			r(128*k, 32, 1900), r(128*k, 64, 1990), r(m, 4, 1960), r(m, 32, 2000),
		}, 2},
		// The best is found first: 1980 is within 3 % of 2000 but not of
		// the 2100 that comes after it.
		{"best comes last", []NVMeResult{
			r(128*k, 4, 1980), r(m, 4, 2000), r(4*m, 64, 2100),
		}, 2},
		{"exactly at the edge", []NVMeResult{r(m, 64, 1000), r(512*k, 8, 970), r(512*k, 4, 969.9)}, 1},
		{"equal bytes in flight: faster wins", []NVMeResult{r(m, 8, 990), r(512*k, 16, 1000), r(256*k, 32, 995)}, 1},
	}
	for _, c := range cases {
		if got := BestNVMeSetting(c.results, SweepTolerance); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}
