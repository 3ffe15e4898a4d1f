package cpu

import (
	"fmt"
	"runtime"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
)

// Options configure a CPU backend.
type Options struct {
	// Devices is the number of in-process devices (ranks). Default 1.
	Devices int
	// HBMBytes is the memory budget of each device. Default 8 GiB. It is only
	// a budget: host memory is taken by Alloc, not reserved up front.
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
	for i := range devs {
		devs[i] = newDevice(i, o)
	}
	g := newGroup(o.Devices)
	comms := make([]gpu.Comm, o.Devices)
	for i, d := range devs {
		comms[i] = gpu.CheckedComm[*Stream, *Buffer](d.front, i, o.Devices, &comm{g: g, rank: i, dev: d})
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
