//go:build linux

package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestSweepNVMe: a sweep of 2 × 2 settings measures each Runs times (every
// run seen by AfterRun), sizes rounded up to whole blocks, and writes its
// table with the recommended aio block; a bad setting is refused before
// any run.
func TestSweepNVMe(t *testing.T) {
	base := NVMeOptions{Paths: []string{nvmetest.Dir(t)}, SizeBytes: 1<<20 + 1, Engine: nvme.EnginePread}.WithDefaults()
	runs := 0
	s := NVMeSweepOptions{BlockBytes: []int64{64 << 10, 128 << 10}, QueueDepths: []int64{1, 2}, Runs: 2,
		AfterRun: func(r NVMeResult, err error) {
			if err != nil || r.SizeBytes%r.BlockBytes != 0 {
				t.Errorf("run %+v: %v", r, err)
			}
			runs++
		}}
	sw, err := SweepNVMe(context.Background(), base, s)
	if err != nil {
		t.Fatal(err)
	}
	if runs != 8 || len(sw.Results) != 4 || len(sw.MBps) != 2 || sw.Best.MBps <= 0 {
		t.Errorf("%d runs, sweep %+v", runs, sw)
	}
	var out bytes.Buffer
	if err := sw.WriteText(&out); err != nil || !strings.Contains(out.String(), "each the median of 2 runs") || !strings.Contains(out.String(), `"queue_depth"`) {
		t.Errorf("%v:\n%s", err, out.String())
	}
	var one bytes.Buffer
	if err := sw.Best.WriteText(&one, base); err != nil || !strings.HasPrefix(one.String(), "strata bench nvme ") || !strings.Contains(one.String(), "\nlatency:    p50 ") {
		t.Errorf("%v:\n%s", err, one.String())
	}
	s.QueueDepths = []int64{0}
	if _, err := SweepNVMe(context.Background(), base, s); err == nil {
		t.Error("a sweep with queue depth 0: no error")
	}
}
