package prefetch

import (
	"time"

	"github.com/strata-ai/strata/shard"
)

// BandwidthMeter turns the traffic a store measured on each link into the
// bandwidths a planner plans with (Options.BandwidthBytesPerSec).
//
// An interval counts as a sample of a link when the link moved at least
// MeterSampleBytes in it; the configured bandwidth (Base) stays until the
// samples add up to MeterTrustBytes. The planner then gets MeterSafety
// times the EWMA (weight MeterWeight for the newest sample), clamped to
// [1/MeterClamp, MeterClamp] times Base: a lower bandwidth than the truth
// only makes transfers start earlier (more memory held), a higher one
// makes them late. Busy time is per hop and hops overlap (the NVMe queue,
// several copies), so bytes/busy is at most the link's rate: conservative
// for a planner, which serves one transfer at a time.
type BandwidthMeter struct {
	// Base is each link's configured bandwidth, bytes/s.
	Base     [shard.LinkCount]float64
	measured [shard.LinkCount]float64 // EWMA of bytes/busy; 0: not measured yet
	bytes    [shard.LinkCount]int64   // the bytes the samples rest on
}

// The BandwidthMeter's constants.
const (
	MeterSampleBytes = 1 << 20
	MeterTrustBytes  = 4 << 20
	MeterSafety      = 0.7
	MeterWeight      = 0.5
	MeterClamp       = 8
)

// Add folds one interval's bytes and busy time per link into the meter and
// returns the bandwidths to plan with: cur where a link has not earned
// trust yet, and whether any differs from cur.
func (m *BandwidthMeter) Add(cur [shard.LinkCount]float64, bytes [shard.LinkCount]int64, busy [shard.LinkCount]time.Duration) ([shard.LinkCount]float64, bool) {
	changed := false
	for l := range shard.LinkCount {
		n, b := bytes[l], busy[l]
		if n < MeterSampleBytes || b <= 0 {
			continue
		}
		x := float64(n) / b.Seconds()
		if m.measured[l] == 0 {
			m.measured[l] = x
		} else {
			m.measured[l] = MeterWeight*x + (1-MeterWeight)*m.measured[l]
		}
		m.bytes[l] += n
		if m.bytes[l] < MeterTrustBytes {
			continue
		}
		v := min(max(MeterSafety*m.measured[l], m.Base[l]/MeterClamp), m.Base[l]*MeterClamp)
		if v != cur[l] {
			cur[l], changed = v, true
		}
	}
	return cur, changed
}
