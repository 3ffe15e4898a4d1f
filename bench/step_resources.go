package bench

import (
	"fmt"
	"strings"
	"time"

	"github.com/strata-ai/strata/internal/units"
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

// stepProbeBytes is the file Step's disk probe writes, reads and mixes under
// --nvme-path before the steps: large enough that the drive, not a cache
// in front of it, sets the rate of most of it (on this machine's virtio
// disk a 256 MiB file reads at twice the rate of a 20 GiB one; a cache
// that still helps makes the drive's need, and the bound, lower, never
// higher).
const stepProbeBytes = 2 << 30

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
