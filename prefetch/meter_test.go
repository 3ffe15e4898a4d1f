package prefetch

import (
	"testing"
	"time"

	"github.com/strata-ai/strata/shard"
)

// TestBandwidthMeter: a link keeps its configured bandwidth until its
// samples add up to MeterTrustBytes, then plans with MeterSafety times the
// EWMA, clamped to MeterClamp times the configured one; intervals below
// MeterSampleBytes are not samples.
func TestBandwidthMeter(t *testing.T) {
	var m BandwidthMeter
	m.Base[shard.NVMeToHost] = 1e9
	m.Base[shard.HostToHBM] = 1e9
	cur := m.Base
	sample := func(l shard.Link, n int64, busy time.Duration) bool {
		var b [shard.LinkCount]int64
		var d [shard.LinkCount]time.Duration
		b[l], d[l] = n, busy
		var changed bool
		cur, changed = m.Add(cur, b, d)
		return changed
	}
	// 2 MiB in 1 ms: 2.1 GB/s, twice: 4 MiB, trusted at the second.
	if sample(shard.NVMeToHost, 2<<20, time.Millisecond) {
		t.Errorf("changed after %d bytes, before MeterTrustBytes", 2<<20)
	}
	if !sample(shard.NVMeToHost, 2<<20, time.Millisecond) {
		t.Fatal("not changed once the samples reach MeterTrustBytes")
	}
	want := MeterSafety * (float64(2<<20) / time.Millisecond.Seconds())
	if got := cur[shard.NVMeToHost]; got != want {
		t.Errorf("bandwidth %v, want %v (MeterSafety × the samples' rate)", got, want)
	}
	if cur[shard.HostToHBM] != 1e9 {
		t.Errorf("an unmeasured link changed: %v", cur[shard.HostToHBM])
	}
	// Below MeterSampleBytes: not a sample.
	if sample(shard.NVMeToHost, MeterSampleBytes-1, time.Nanosecond) {
		t.Error("a sample below MeterSampleBytes changed the bandwidth")
	}
	// A rate far above the configured one is clamped.
	for range 8 {
		sample(shard.NVMeToHost, 1<<30, time.Microsecond)
	}
	if got := cur[shard.NVMeToHost]; got != MeterClamp*1e9 {
		t.Errorf("bandwidth %v, want the clamp %v", got, MeterClamp*1e9)
	}
}
