// Package backend opens a backend's devices (gpu/cpu or gpu/cuda) by name.
//
// It opens them for one engine or one decoder: `strata train`, `eval` and
// `generate` (cmd) and the workloads of `strata bench` open them here.
package backend

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/gpu/cuda"
	"github.com/strata-ai/strata/pinned"
)

var _ pinned.Registrar = (*cuda.HostRegistrar)(nil)

// Names are the device backends a workload can run on.
var Names = []string{"cpu", "cuda"}

// Devices is a backend's devices and communicators for one engine.
type Devices struct {
	Backend string
	Devs    []gpu.Device
	Comms   []gpu.Comm
	// Describe says what the backend found (GPU names, libraries, and
	// Collectives).
	Describe string
	// Collectives says what runs the collectives: the rank-order path or
	// NCCL, why NCCL was not used when strata.deterministic is false, and
	// how the GPUs reach each other.
	Collectives string
	// Registrar registers the engine's pinned host memory with the
	// devices (engine.Options.HostRegistrar): gpu/cuda page-locks it,
	// gpu/cpu records it (its link counters then tell pageable copies).
	Registrar pinned.Registrar
	close     func() error
}

// Close releases the backend (after the engine that used it is closed).
func (d *Devices) Close() error {
	if d.close == nil {
		return nil
	}
	return d.close()
}

// Open makes n devices of backend name ("cpu" or "cuda"; "" is cpu),
// each with a memory budget of hbmBytes (0: the backend's default: for
// cuda the GPU's free memory, split among the devices sharing it). With
// deterministic false (strata.deterministic) the cuda backend runs the
// collectives with NCCL where it can; the cpu backend's are always in
// rank order.
func Open(name string, n int, hbmBytes int64, deterministic bool) (*Devices, error) {
	return OpenNet(name, n, hbmBytes, deterministic, nil)
}

// OpenNet is Open for one process of a job of several (net: the
// processes; nil: this one alone): its n devices are the global ranks
// net.Proc()·n .. +n−1 of net.Procs()·n, their collectives crossing the
// processes: the cpu backend's in rank order, the cuda backend's on NCCL
// (deterministic must be false; not run on a GPU yet).
func OpenNet(name string, n int, hbmBytes int64, deterministic bool, net gpu.Net) (*Devices, error) {
	switch name {
	case "", "cpu":
		devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: hbmBytes, Net: net})
		if err != nil {
			return nil, fmt.Errorf("backend: %w", err)
		}
		desc, coll := fmt.Sprintf("%d cpu device(s)", n), "rank-order"
		if net != nil {
			desc = fmt.Sprintf("%d cpu device(s) in each of %d processes", n, net.Procs())
			coll = "rank-order, across processes on MPI"
		}
		return &Devices{Backend: "cpu", Devs: cpu.Devices(devs), Comms: comms, Describe: desc, Collectives: coll, Registrar: devs[0].HostRegistrar()}, nil
	case "cuda":
		b, err := cuda.New(cuda.Options{Devices: n, HBMBytes: hbmBytes, NCCL: !deterministic, Net: net})
		if err != nil {
			return nil, err // says cuda: and what to set
		}
		desc := fmt.Sprintf("%d cuda device(s)", n)
		if inf, err := cuda.Probe(); err == nil && len(inf.GPUs) > 0 {
			desc = fmt.Sprintf("%d cuda device(s) on %d x %s (compute %s)", n, len(inf.GPUs), inf.GPUs[0].Name, inf.GPUs[0].ComputeCapability)
		}
		coll := b.Collectives() // with strata.deterministic false, why NCCL did not run, if it did not
		if deterministic {
			coll += " (strata.deterministic: bit-identical runs; false runs NCCL where it can)"
		}
		desc += "; collectives: " + coll
		return &Devices{Backend: "cuda", Devs: b.Devices(), Comms: b.Comms(), Describe: desc, Collectives: coll, Registrar: b.HostRegistrar(), close: b.Close}, nil
	}
	return nil, fmt.Errorf("backend: unknown backend %q (one of %v)", name, Names)
}
