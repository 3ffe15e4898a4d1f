package plan

import (
	"testing"

	"github.com/strata-ai/strata/shard"
)

// TestComputePlacement: the compute is measured in the first placement
// that fits without NVMe, else the narrow state's, else the first.
func TestComputePlacement(t *testing.T) {
	mk := func(fits bool, opt, params shard.Tier, moments string) Prediction {
		return Prediction{Config: Config{Optimizer: opt, Params: params, Moments: moments}, Fits: fits}
	}
	fits := []Prediction{
		mk(false, shard.HBM, shard.HBM, fp32State),
		mk(true, shard.NVMe, shard.Host, fp32State),
		mk(true, shard.NVMe, shard.Host, NarrowMoments),
		mk(true, shard.Host, shard.Host, NarrowMoments),
	}
	if got := computePlacement(fits, 1); got != 3 {
		t.Errorf("host placement fits: got %d, want 3", got)
	}
	if got := computePlacement(fits[:3], 1); got != 2 {
		t.Errorf("NVMe only: got %d, want the narrow one, 2", got)
	}
	if got := computePlacement(fits[:2], 1); got != 1 {
		t.Errorf("one NVMe placement: got %d, want 1", got)
	}
}
