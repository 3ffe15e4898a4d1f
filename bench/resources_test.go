package bench

import (
	"math"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/shard"
)

// TestStepResources: the bound of a mode is its busiest resource, the
// drive's time being its bytes at the measured rates (what reads and writes
// share at the mixed rate, the rest at its own, never less than either
// alone), medians over the measured steps.
func TestStepResources(t *testing.T) {
	d := plan.Disk{ReadBytesPerS: 10e9, WriteBytesPerS: 2e9, MixedBytesPerS: 8e9}
	for _, c := range []struct {
		read, written int64
		want          float64
	}{
		{30e9, 0, 3},     // reads alone
		{10e9, 10e9, 5},  // the writes alone take longer than 20 GB mixed
		{30e9, 6e9, 3.9}, // 12 GB mixed (1.5 s), then 24 GB of reads (2.4 s)
		{0, 0, 0},
	} {
		if got := driveNeed(d, c.read, c.written); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("driveNeed(%d read, %d written) = %v, want %v", c.read, c.written, got, c.want)
		}
	}
	use := func(compute, adam time.Duration, read, written int64) StepUse {
		u := StepUse{Compute: compute, Adam: adam, NVMeRead: read, NVMeWrite: written}
		u.LinkActive[shard.NVMeToHost] = 9 * time.Second
		return u
	}
	m := StepModeResult{MedianStep: 26, Use: []StepUse{
		use(8*time.Second, time.Second, 30e9, 26e9),   // drive 9.33 s
		use(10*time.Second, time.Second, 30e9, 30e9),  // drive 10 s
		use(9*time.Second, 2*time.Second, 30e9, 20e9), // drive 10 s (the writes)
	}}
	m.resources(d, 0)
	if m.Compute != 9 || m.Adam != 1 || m.NVMeReadActive != 9 {
		t.Errorf("medians: compute %v, adam %v, nvme read active %v; want 9, 1, 9", m.Compute, m.Adam, m.NVMeReadActive)
	}
	if m.BoundBy != "drive" || math.Abs(m.Bound-13) > 1e-9 || math.Abs(m.StepOverBound-2) > 1e-9 {
		t.Errorf("bound %v by %q, step/bound %v; want 13 s by the drive, 2", m.Bound, m.BoundBy, m.StepOverBound)
	}
	m.resources(plan.Disk{}, 0) // no probe: the drive does not bound
	if m.Drive != 0 || m.BoundBy != "compute" || m.Bound != 9 {
		t.Errorf("without a probe: drive %v, bound %v by %q; want 0, 9 by compute", m.Drive, m.Bound, m.BoundBy)
	}
	// The process's CPU time over 2 cores: a median of 30 s, 15 s a step
	// on them, bounds the step above the drive's 13.
	for i, cpu := range []time.Duration{24 * time.Second, 30 * time.Second, 32 * time.Second} {
		m.Use[i].CPU = cpu
	}
	m.resources(d, 2)
	if m.Cores != 15 || m.BoundBy != "cores" || m.Bound != 15 {
		t.Errorf("cores %v, bound %v by %q; want 15 s by the cores", m.Cores, m.Bound, m.BoundBy)
	}
}

// TestProbeBytes: the disk probe covers the run's NVMe working set (the
// estimate's NVMe homes, which the engine's swap holds), at least 2 GiB; a
// size given wins.
func TestProbeBytes(t *testing.T) {
	gib := int64(1 << 30)
	big := StepOptions{Model: "gpt-2b", Batch: 1, Seq: 32, Modes: []string{"nvme"}, NVMeOptimizer: true,
		HostBudgetBytes: 8 * gib, HBMBytes: 4 * gib, TierHBMBytes: 512 << 20, NVMePath: t.TempDir()}.WithDefaults()
	for _, c := range []struct {
		name     string
		o        StepOptions
		min, max int64
	}{
		// The run's summary: "homes: ... nvme 26.28 GiB (estimate 26.28 GiB)".
		{"gpt-2b state on nvme", big, 26 * gib, 27 * gib},
		{"gpt-2b params on nvme", func() StepOptions { o := big; o.NVMeOptimizer = false; return o }(), 3 * gib, 4 * gib},
		{"no nvme mode", func() StepOptions { o := big; o.Modes = []string{"host"}; return o }(), stepProbeBytes, stepProbeBytes},
		{"tiny", StepOptions{Model: "tiny", Batch: 1, Seq: 16, Modes: []string{"nvme"}, NVMePath: t.TempDir()}.WithDefaults(), stepProbeBytes, stepProbeBytes},
		{"given", func() StepOptions { o := big; o.ProbeBytes = 64 << 20; return o }(), 64 << 20, 64 << 20},
	} {
		got, err := c.o.probeBytes()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got < c.min || got > c.max {
			t.Errorf("%s: probe of %s, want %s to %s", c.name, units.FormatBytes(got), units.FormatBytes(c.min), units.FormatBytes(c.max))
		}
	}
}
