package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
)

// Options configure a CUDA backend.
type Options struct {
	// Devices is the number of logical devices (ranks). Default: the number
	// of GPUs. Logical device i runs on GPU i % GPUs; more devices than GPUs
	// share GPUs (each with its own budget, streams and counters), which
	// runs multi-rank code, collectives included, on one GPU.
	Devices int
	// HBMBytes is the memory budget of each logical device. Default: the
	// GPU's free memory at start, less ReserveBytes, split evenly among the
	// logical devices on that GPU.
	HBMBytes int64
	// ReserveBytes is left outside the default budget for what the backend
	// allocates outside it (cuBLAS workspace, kernel module, the scratch of
	// attention backward, mixed-type GEMM; NCCL's own buffers). Default 1 GiB.
	ReserveBytes int64
	// Net, when set, joins the devices of several processes into one
	// communicator: this process's devices are the global ranks
	// Net.Proc()·Devices .. +Devices−1 of Net.Procs()·Devices, and the
	// collectives run on NCCL (NCCL must be set): the rank-order path
	// copies between the GPUs of one process only.
	Net gpu.Net
	// NCCL runs the collectives with NCCL (faster on several GPUs; its
	// reductions are not in rank order, so runs are not bit-identical to
	// the rank-order path's) where libnccl loads and every rank has a GPU
	// of its own; elsewhere the rank-order path runs and
	// Backend.Collectives says why. Default false: the rank-order path.
	NCCL bool
}

// DefaultReserveBytes is Options.ReserveBytes when it is 0.
const DefaultReserveBytes = 1 * units.GiB

// WithDefaults returns o with zero fields set to their defaults; gpus is
// the number of physical GPUs.
func (o Options) WithDefaults(gpus int) Options {
	if o.Devices == 0 {
		o.Devices = max(1, gpus)
	}
	if o.ReserveBytes == 0 {
		o.ReserveBytes = DefaultReserveBytes
	}
	return o
}

// Validate says what is wrong with o (after defaults).
func (o Options) Validate() error {
	if err := gpu.ValidateDevices("cuda", o.Devices, o.HBMBytes); err != nil {
		return err
	}
	if o.ReserveBytes < 0 {
		return fmt.Errorf("cuda: reserve bytes %d must be >= 0", o.ReserveBytes)
	}
	if o.Net != nil && !o.NCCL {
		return errors.New("cuda: across processes the collectives run on NCCL: set strata.deterministic false (the rank-order path copies between the GPUs of one process)")
	}
	return nil
}

func (o Options) String() string {
	hbm := "free memory"
	if o.HBMBytes > 0 {
		hbm = units.FormatBytes(o.HBMBytes)
	}
	return fmt.Sprintf("cuda.Options{Devices: %d, HBMBytes: %s, ReserveBytes: %s, NCCL: %t}", o.Devices, hbm, units.FormatBytes(o.ReserveBytes), o.NCCL)
}

// Backend is the set of logical devices and communicators made by New.
type Backend struct {
	l     *lib
	devs  []*Device
	comms []gpu.Comm
	group *group
	hosts *gpu.HostRegistry // what HostRegistrar registered: copies of it count as page-locked
	// collectives says which path runs the collectives (and why NCCL,
	// when asked for, does not) and how the GPUs reach each other.
	collectives string

	mu      sync.Mutex
	streams []*Stream // every stream made, destroyed by Close
	closed  bool
}

// Info describes the libraries and GPUs a backend found.
type Info struct {
	DriverPath, NVRTCPath, CublasPath string
	DriverVersion                     int // 13000 for CUDA 13.0
	NVRTCVersion                      string
	GPUs                              []GPUInfo
	// Gemm says which library runs the GEMMs (GemmPath); KernelCache
	// where the compiled kernels came from (kernelcache.go).
	Gemm, KernelCache string
}

// GPUInfo describes one physical GPU.
type GPUInfo struct {
	Ordinal             int
	Name                string
	ComputeCapability   string // "9.0"
	Multiprocessors     int
	TotalBytes          int64
	StreamMemoryOps     bool // cuStreamWaitValue32 (else spin kernels order collectives)
	StreamOrderedMalloc bool
}

// Probe loads the libraries (once per process) and describes them. It
// returns an error wrapping ErrNoDriver where there is no driver or GPU.
func Probe() (Info, error) {
	l, err := loadLib()
	if err != nil {
		return Info{}, err
	}
	inf := Info{DriverPath: l.drv.path, NVRTCPath: l.nvrtc.path, CublasPath: l.blas.path,
		DriverVersion: l.driverVersion, NVRTCVersion: l.nvrtc.version()}
	_, _ = ltLoad(l) // so that Gemm says whether cuBLASLt runs the bf16 GEMMs
	inf.Gemm, inf.KernelCache = GemmPath(), kernelCacheStatus()
	for _, g := range l.gpus {
		inf.GPUs = append(inf.GPUs, GPUInfo{Ordinal: g.ordinal, Name: g.name, ComputeCapability: fmt.Sprintf("%d.%d", g.major, g.minor),
			Multiprocessors: g.sms, TotalBytes: int64(g.totalBytes), StreamMemoryOps: l.drv.hasStreamMemOps, StreamOrderedMalloc: g.memPools})
	}
	return inf, nil
}

// New creates the logical devices of o and one Comm per device
// (Comms()[i] is rank i on Devices()[i]). Close releases the streams and
// collective state; buffers must be freed by their owners first.
func New(o Options) (*Backend, error) {
	l, err := loadLib()
	if err != nil {
		return nil, err
	}
	o = o.WithDefaults(len(l.gpus))
	if err := o.Validate(); err != nil {
		return nil, err
	}
	for _, g := range l.gpus {
		if !g.memPools {
			return nil, fmt.Errorf("cuda: %s (GPU %d) lacks stream-ordered allocation (cuMemAllocAsync), which the backend needs", g.name, g.ordinal)
		}
	}
	b := &Backend{l: l, hosts: gpu.NewHostRegistry()}
	perGPU := make([]int, len(l.gpus))
	for i := range o.Devices {
		perGPU[i%len(l.gpus)]++
	}
	budgets := make([]int64, len(l.gpus))
	for gi, g := range l.gpus {
		if o.HBMBytes > 0 {
			budgets[gi] = o.HBMBytes
			continue
		}
		var free, total uint64
		err := g.do(func() error { return l.drv.check(l.drv.cuMemGetInfo(&free, &total), "cuMemGetInfo") })
		if err != nil {
			return nil, fmt.Errorf("cuda: %s: %w", g.name, err)
		}
		budgets[gi] = max(0, (int64(free)-o.ReserveBytes)/int64(max(1, perGPU[gi])))
	}
	for i := range o.Devices {
		g := l.gpus[i%len(l.gpus)]
		d := newDevice(i, g, b, budgets[i%len(l.gpus)])
		s, err := b.newStream(d)
		if err != nil {
			b.Close()
			return nil, err
		}
		d.def = s
		b.devs = append(b.devs, d)
	}
	grp, err := newGroup(b)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.group = grp
	if err := b.chooseCollectives(o); err != nil {
		b.Close()
		return nil, err
	}
	base, world := 0, len(b.devs)
	if o.Net != nil {
		base, world = o.Net.Proc()*len(b.devs), o.Net.Procs()*len(b.devs)
		grp.acrossProcesses = true
	}
	for i, d := range b.devs {
		b.comms = append(b.comms, gpu.CheckedComm[*Stream, *Buffer](d.front, base+i, world, &comm{g: grp, rank: i, dev: d}))
	}
	return b, nil
}

// Devices returns the logical devices as gpu.Device values.
func (b *Backend) Devices() []gpu.Device {
	out := make([]gpu.Device, len(b.devs))
	for i, d := range b.devs {
		out[i] = d
	}
	return out
}

// Device returns logical device i.
func (b *Backend) Device(i int) *Device { return b.devs[i] }

// Comms returns one communicator per device.
func (b *Backend) Comms() []gpu.Comm { return append([]gpu.Comm(nil), b.comms...) }

// Collectives says which path runs the collectives: "rank-order" or
// "nccl VERSION (PATH)"; after the rank-order path, why NCCL was not used
// when Options.NCCL asked for it; then how the GPUs reach each other
// (peer access), with several GPUs.
func (b *Backend) Collectives() string { return b.collectives }

// chooseCollectives enables peer access between the backend's GPUs and
// makes the NCCL communicator when o asks for it and it can be made; across
// processes (o.Net) it must be made.
func (b *Backend) chooseCollectives(o Options) error {
	gpus := b.l.gpus[:min(len(b.devs), len(b.l.gpus))]
	misses := enablePeers(b.l.drv, gpus)
	desc := "rank-order"
	if o.NCCL {
		nc, err := newNCCLComms(b, o.Net)
		switch {
		case err != nil && o.Net != nil:
			return fmt.Errorf("cuda: NCCL across %d processes: %w", o.Net.Procs(), err)
		case err != nil:
			desc = fmt.Sprintf("rank-order (NCCL not used: %v)", err)
		default:
			b.group.nccl, desc = nc, nc.describe()
		}
	}
	if p := describePeers(len(gpus), misses); p != "" {
		desc += "; " + p
	}
	if o.Net != nil {
		desc += fmt.Sprintf("; across %d processes", o.Net.Procs())
	}
	b.collectives = desc
	return nil
}

// Close synchronizes and destroys every stream of the backend and frees the
// collective state. Buffers still allocated stay allocated (their memory
// is the caller's to free). Closing twice is a no-op.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	streams := b.streams
	b.streams = nil
	b.mu.Unlock()
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if b.group != nil {
		keep(b.group.freeScratch()) // stream-ordered, before the streams go
	}
	for _, s := range streams {
		keep(s.destroy())
	}
	if b.group != nil {
		keep(b.group.close())
	}
	return first
}

func (b *Backend) track(s *Stream) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	b.streams = append(b.streams, s)
	return nil
}
