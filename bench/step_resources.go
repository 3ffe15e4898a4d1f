package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/plan"
	"github.com/strata-ai/strata/shard"
)

// The step against its busiest resource (StepModeResult.Resources): what
// each resource did in each measured step, the drive's rates probed before
// the steps, and the bound they set.

// StepUse is one step's use of each resource: the compute stream's busy
// time (waits excluded; 0 where the backend does not count it), cpuadam's,
// the process's CPU time (user and system, every thread: on the CPU
// backend the compute stream's kernels, cpuadam and the I/O submission
// share the cores), each link's active time (the union of its moves), and
// the NVMe bytes.
type StepUse struct {
	Compute, Adam, CPU  time.Duration
	LinkActive          [shard.LinkCount]time.Duration
	NVMeRead, NVMeWrite int64
}

// Resources are a mode's medians over its measured steps of each resource's
// time, and the bound they set: the step cannot take less than its busiest
// resource. The drive's time is what its bytes need at the rates the same
// run measured (StepResult.Disk): a link's active time counts a slow move
// as busy, the need does not.
type Resources struct {
	Compute, Adam float64 // seconds per step (medians)
	// Cores is the process's CPU time per step over the machine's cores
	// (runtime.NumCPU): the least time the step's host work needs on them,
	// the compute stream's too on the CPU backend.
	Cores                                            float64
	NVMeReadActive, NVMeWriteActive, HostToHBMActive float64
	Drive                                            float64 // seconds the step's NVMe bytes need at the measured rates (0: no probe)
	Bound                                            float64 // the largest of Compute, Adam and Drive
	BoundBy                                          string  // which
	StepOverBound                                    float64 // MedianStep / Bound (0: no bound)
}

// stepProbeBytes is the least file Step's disk probe writes, reads and
// mixes under --nvme-path before the steps (see probeBytes).
const stepProbeBytes = 2 << 30

// probeBytes is the disk probe's file: ProbeBytes when set, else the
// largest NVMe working set of the run's modes (the estimate's NVMe homes,
// which the engine's swap holds), at least stepProbeBytes. A drive's rate
// depends on how much of it a run touches: a cache in front of it (the
// host's page cache under a virtual disk, a drive's SLC cache) serves a
// small file at rates a run over tens of GB does not get. On this
// machine's virtio disk the mixed rate of a 4 GiB and a 28 GiB file was
// 6.6-7.1 GB/s and of a 50 GiB one 1.5-2.1 GB/s (bench/README-step.md), so
// a 2 GiB probe put the drive's need of a gpt-5b step (47 GiB of swap) at
// a fifth of what it was. The probe's file is gone before the engines
// create their swap, so the run needs no more space than it did.
func (o StepOptions) probeBytes() (int64, error) {
	if o.ProbeBytes > 0 {
		return o.ProbeBytes, nil
	}
	n := int64(stepProbeBytes)
	for _, k := range o.runs() {
		if k.mode != "nvme" {
			continue
		}
		cfg, err := o.stepConfig(k, o.NVMePath)
		if err != nil {
			return 0, err
		}
		rep, err := estimate.FromConfig(cfg, model.Shape(*cfg.Shape()))
		if err != nil {
			return 0, fmt.Errorf("bench: the disk probe's size: %w", err)
		}
		for _, st := range rep.Stages {
			if st.Stage == cfg.ZeRO.Stage && st.Err == nil {
				n = max(n, st.NVMeBytes())
			}
		}
	}
	return n, nil
}

// hasNVMe says whether a mode of the run homes state on NVMe.
func (o StepOptions) hasNVMe() bool {
	for _, k := range o.runs() {
		if k.mode == "nvme" {
			return true
		}
	}
	return false
}

// resources fills m.Resources from its measured steps and the disk's rates.
func (m *StepModeResult) resources(d plan.Disk, cores int) {
	if len(m.Use) == 0 {
		return
	}
	med := func(f func(u StepUse) float64) float64 {
		xs := make([]float64, len(m.Use))
		for i, u := range m.Use {
			xs[i] = f(u)
		}
		return units.Median(xs)
	}
	r := &m.Resources
	*r = Resources{}
	r.Compute = med(func(u StepUse) float64 { return u.Compute.Seconds() })
	r.Adam = med(func(u StepUse) float64 { return u.Adam.Seconds() })
	if cores > 0 {
		r.Cores = med(func(u StepUse) float64 { return u.CPU.Seconds() }) / float64(cores)
	}
	r.NVMeReadActive = med(func(u StepUse) float64 { return u.LinkActive[shard.NVMeToHost].Seconds() })
	r.NVMeWriteActive = med(func(u StepUse) float64 { return u.LinkActive[shard.HostToNVMe].Seconds() })
	r.HostToHBMActive = med(func(u StepUse) float64 { return u.LinkActive[shard.HostToHBM].Seconds() })
	if d.ReadBytesPerS > 0 && d.WriteBytesPerS > 0 && d.MixedBytesPerS > 0 {
		r.Drive = med(func(u StepUse) float64 { return driveNeed(d, u.NVMeRead, u.NVMeWrite) })
	}
	r.Bound, r.BoundBy = r.Compute, "compute"
	for _, c := range []struct {
		v    float64
		name string
	}{{r.Adam, "cpu adam"}, {r.Cores, "cores"}, {r.Drive, "drive"}} {
		if c.v > r.Bound {
			r.Bound, r.BoundBy = c.v, c.name
		}
	}
	if r.Bound > 0 {
		r.StepOverBound = m.MedianStep / r.Bound
	}
}

// json is the figures under a run's "resources" key (nil: none measured).
func (r Resources) json() map[string]any {
	if r.Bound == 0 {
		return nil
	}
	return map[string]any{"compute_s": r.Compute, "adam_s": r.Adam, "cores_s": r.Cores, "nvme_read_active_s": r.NVMeReadActive,
		"nvme_write_active_s": r.NVMeWriteActive, "host_to_hbm_active_s": r.HostToHBMActive, "drive_s": r.Drive,
		"bound_s": r.Bound, "bound_by": r.BoundBy, "step_over_bound": r.StepOverBound}
}

// driveNeed is the least time the drive d moves read and written bytes in:
// what both directions share at the mixed rate (the smaller of the two,
// each way), the rest of the larger at its own rate, and never less than
// either direction alone at its own rate.
func driveNeed(d plan.Disk, read, written int64) float64 {
	both := min(read, written)
	mixed := float64(2*both)/d.MixedBytesPerS + float64(read-both)/d.ReadBytesPerS + float64(written-both)/d.WriteBytesPerS
	return max(float64(read)/d.ReadBytesPerS, float64(written)/d.WriteBytesPerS, mixed)
}

// writeResources prints each mode's step against its busiest resource.
func (r StepResult) writeResources(b *strings.Builder) {
	any := false
	for _, m := range r.Modes {
		any = any || m.Bound > 0
	}
	if !any {
		return
	}
	fmt.Fprintf(b, "%-14s %10s %9s %9s %9s %10s %10s %9s %9s %10s %8s\n", "resources", "step (med)", "compute", "cpu adam", "cores",
		"nvme read", "nvme write", "h->hbm", "drive", "bound", "/bound")
	for _, m := range r.Modes {
		if m.Bound == 0 {
			continue
		}
		drive := "-"
		if r.Disk.ReadBytesPerS > 0 {
			drive = fmt.Sprintf("%.3fs", m.Drive)
		}
		compute := "-" // the backend does not count it (gpu.BusyStream)
		if m.Compute > 0 {
			compute = fmt.Sprintf("%.3fs", m.Compute)
		}
		fmt.Fprintf(b, "%-14s %9.3fs %9s %8.3fs %8.3fs %9.3fs %9.3fs %8.3fs %9s %9.3fs %8.3f  (%s)\n", m.Name(), m.MedianStep, compute, m.Adam, m.Cores,
			m.NVMeReadActive, m.NVMeWriteActive, m.HostToHBMActive, drive, m.Bound, m.StepOverBound, m.BoundBy)
	}
	b.WriteString("(per step, medians: compute = the compute stream running work, its waits excluded (-: the backend does not count it);\n" +
		" cpu adam = cpuadam's busy time; cores = the process's CPU time over the machine's cores (every thread: cpuadam, I/O\n" +
		" submission, the CPU backend's kernels), the least time that work needs;\n" +
		" nvme read / write, h->hbm = the time the link had a move on it; drive = the step's NVMe bytes at the rates measured\n" +
		" before the steps")
	if d := r.Disk; d.ReadBytesPerS > 0 {
		fmt.Fprintf(b, " (%s: read %.2f, write %.2f, mixed %.2f GB/s, %s)", d.Path, d.ReadBytesPerS/1e9, d.WriteBytesPerS/1e9,
			d.MixedBytesPerS/1e9, units.FormatBytes(r.Options.ProbeBytes))
	}
	b.WriteString(";\n bound = the busiest of compute, cpu adam, cores and drive: the step cannot be shorter)\n")
}
