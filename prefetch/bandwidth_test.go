package prefetch

import (
	"math"
	"testing"

	"github.com/strata-ai/strata/shard"
)

// SetBandwidth takes measured bandwidths between steps: it refuses values
// that are not positive and finite (keeping the old ones) and otherwise
// replaces them, so later transfer times use the measurement.
func TestSetBandwidth(t *testing.T) {
	p, err := New(Residency{}, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	old := p.Bandwidth()
	for _, bad := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		bw := old
		bw[shard.NVMeToHost] = bad
		if err := p.SetBandwidth(bw); err == nil {
			t.Errorf("SetBandwidth accepted %v for %s", bad, shard.NVMeToHost)
		}
		if p.Bandwidth() != old {
			t.Fatalf("a refused SetBandwidth changed the bandwidths to %v", p.Bandwidth())
		}
	}
	bw := old
	bw[shard.NVMeToHost] = old[shard.NVMeToHost] / 4
	if err := p.SetBandwidth(bw); err != nil {
		t.Fatal(err)
	}
	if p.Bandwidth() != bw {
		t.Fatalf("Bandwidth() = %v after SetBandwidth(%v)", p.Bandwidth(), bw)
	}
	const n = 1 << 20
	before := DefaultOptions().TransferTime(shard.NVMeToHost, n)
	// Durations round up to the nanosecond, so allow a few.
	if after := p.opts.TransferTime(shard.NVMeToHost, n); after < 4*before-8 || after > 4*before+8 {
		t.Errorf("a quarter of the bandwidth: %v to move 1 MiB, want 4 × %v", after, before)
	}
}
