package cpu

import (
	"fmt"
	"runtime"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
)

// Options configure a CPU backend.
type Options struct {
	// Devices is the number of in-process devices (ranks). Default 1.
	Devices int
	// Net, when set, joins the devices of several processes into one
	// communicator (comm_net.go): this process's devices are the global
	// ranks Net.Proc()·Devices .. +Devices-1 of Net.Procs()·Devices, and
	// every process must have the same Devices (New checks).
	Net gpu.Net
	// HBMBytes is the memory budget of each device. Default 8 GiB. It is only
	// a budget: host memory is taken by Alloc, not reserved up front
	// (CheckHostRAM says whether the host can hold it).
	HBMBytes int64
	// Workers is the number of goroutines each device uses for one heavy op
	// (GEMM, attention, row-wise kernels). Default GOMAXPROCS/Devices, at
	// least 1. Results do not depend on it.
	Workers int
	// Kernel selects the GEMM kernel: KernelAuto (default: KernelAVX512
	// where the CPU and build have it, else KernelGonum), KernelAVX512 or
	// KernelGonum.
	Kernel string
}

// GEMM kernels.
const (
	KernelAuto   = "auto"
	KernelAVX512 = "avx512" // packed 6×32 AVX-512 FMA kernel (sgemm_amd64.s)
	KernelGonum  = "gonum"  // gonum.org/v1/gonum/blas/gonum Sgemm on fixed tiles
)

// DefaultHBMBytes is the per-device budget when Options.HBMBytes is 0.
const DefaultHBMBytes = 8 * units.GiB

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Devices == 0 {
		o.Devices = 1
	}
	if o.HBMBytes == 0 {
		o.HBMBytes = DefaultHBMBytes
	}
	if o.Kernel == "" || o.Kernel == KernelAuto {
		o.Kernel = KernelGonum
		if hasPackedKernel {
			o.Kernel = KernelAVX512
		}
	}
	if o.Workers == 0 && o.Devices > 0 {
		o.Workers = max(1, runtime.GOMAXPROCS(0)/o.Devices)
	}
	return o
}

// Validate says what is wrong with o (after defaults).
func (o Options) Validate() error {
	if err := gpu.ValidateDevices("cpu", o.Devices, o.HBMBytes); err != nil {
		return err
	}
	switch {
	case o.Workers < 1:
		return fmt.Errorf("cpu: workers %d must be >= 1", o.Workers)
	case o.Kernel != KernelAVX512 && o.Kernel != KernelGonum:
		return fmt.Errorf("cpu: gemm kernel %q: want %s, %s or %s", o.Kernel, KernelAuto, KernelAVX512, KernelGonum)
	case o.Kernel == KernelAVX512 && !hasPackedKernel:
		return fmt.Errorf("cpu: gemm kernel avx512: this CPU or build (noasm, purego) lacks it; use %s", KernelGonum)
	}
	return nil
}

func (o Options) String() string {
	return fmt.Sprintf("cpu.Options{Devices: %d, HBMBytes: %s, Workers: %d, Kernel: %s}", o.Devices, units.FormatBytes(o.HBMBytes), o.Workers, o.Kernel)
}

// New creates o.Devices devices and one Comm per device (Comms()[i] is rank
// i on device i). Devices need no closing: their stream goroutines exit when
// the queues are empty.
func New(o Options) ([]*Device, []gpu.Comm, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, nil, err
	}
	devs := make([]*Device, o.Devices)
	hosts := gpu.NewHostRegistry()
	for i := range devs {
		devs[i] = newDevice(i, o, hosts)
	}
	g := newGroup(devs)
	if o.Net != nil {
		x, err := newNetGroup(o.Net, o.Devices, devs[0])
		if err != nil {
			return nil, nil, err
		}
		g.x = x
	}
	base, world := g.base(), g.world()
	comms := make([]gpu.Comm, o.Devices)
	for i, d := range devs {
		comms[i] = gpu.CheckedComm[*Stream, *Buffer](d.front, base+i, world, &comm{g: g, rank: i, dev: d})
	}
	return devs, comms, nil
}

// Devices returns ds as gpu.Device values.
func Devices(ds []*Device) []gpu.Device {
	out := make([]gpu.Device, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

// meminfoPath is where the kernel reports the host's available memory.
const meminfoPath = hostmem.MeminfoPath

// CheckHostRAM refuses devices × hbmBytes (what the CPU backend's devices
// may allocate, all of it host RAM) above the host's MemAvailable, or
// past what RLIMIT_AS leaves the process (hostmem.CheckAddressSpace), with
// an error that says what to lower. cmd calls it before a training run with a
// budget the user set, so that the run is refused at the start rather than
// killed for memory later. Where /proc/meminfo cannot be read (not Linux),
// nothing is checked.
func CheckHostRAM(devices int, hbmBytes int64) error {
	return checkHostRAM(devices, hbmBytes, meminfoPath)
}

func checkHostRAM(devices int, hbmBytes int64, meminfo string) error {
	total, fits := units.Mul(int64(devices), hbmBytes)
	if avail, ok := hostmem.Available(meminfo); ok && (!fits || total > avail) {
		want := "more than 2^63 bytes"
		if fits {
			want = units.FormatBytes(total)
		}
		return fmt.Errorf("cpu: %d devices × hbm_bytes %s = %s, but the host has %s available (MemAvailable in %s), and the CPU backend's devices live in host RAM: lower strata.hbm_bytes to at most %s per device, or use fewer devices",
			devices, units.FormatBytes(hbmBytes), want, units.FormatBytes(avail), meminfo, units.FormatBytes(avail/int64(devices)))
	}
	if err := hostmem.CheckAddressSpace(fmt.Sprintf("%d devices × hbm_bytes %s (the CPU backend's devices live in host RAM)", devices, units.FormatBytes(hbmBytes)), total); fits && err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	return nil
}
