package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"unsafe"
)

// lib is the process-wide state: the loaded libraries and one gpuCtx per
// physical GPU. It is created by the first New and lives as long as the
// process: primary contexts stay retained, modules loaded, so that creating
// and closing backends (tests do it often) costs no context creation.
type lib struct {
	drv           *driverAPI
	nvrtc         *nvrtcAPI
	blas          *cublasAPI
	driverVersion int
	gpus          []*gpuCtx
}

var (
	libOnce sync.Once
	theLib  *lib
	libErr  error
)

// kernelNames are the kernels of kernels.cu looked up after loading.
var kernelNames = []string{
	"check_ids", "check_pos", "gelu_fwd", "gelu_bwd", "add", "add_columns", "dropout", "dequant_nf4", "dequant_int8", "scale", "scale_rows", "row_dots", "axpy", "fill", "cast", "bias_add", "bias_gelu", "bias_grad_part", "colsum_final",
	"glu_fwd", "glu_bwd", "rope", "layernorm_fwd", "layernorm_bwd_dx", "layernorm_bwd_params_part",
	"rmsnorm_fwd", "rmsnorm_bwd_dx", "rmsnorm_bwd_gamma_part", "attn_fwd", "attn_bwd_rowdot", "attn_bwd_dkv",
	"attn_bwd_dq", "attn_fwd_wide", "attn_bwd_dkv_wide", "attn_bwd_dq_wide", "attn_fwd_tc", "attn_bwd_dkv_tc", "attn_bwd_dq_tc", "kv_append", "attn_cached", "xent_fwd", "xent_bwd", "emb_fwd", "emb_links", "emb_bwd_rows", "emb_bwd_wpe",
	"sumsq_partial", "sumsq_final", "adam_step", "reduce_ranks", "wait_flag", "write_flag",
}

func loadLib() (*lib, error) {
	libOnce.Do(func() { theLib, libErr = initLib() })
	return theLib, libErr
}

func initLib() (*lib, error) {
	sp := newSearchPath(os.Getenv(EnvLibDir), filepath.Glob)
	drv, err := loadDriver(sp)
	if err != nil {
		return nil, err
	}
	l := &lib{drv: drv}
	if r := drv.cuInit(0); r != cudaSuccess {
		err := drv.check(r, "cuInit (driver %s)", drv.path)
		if r == cudaNoDevice {
			return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
		}
		return nil, err
	}
	var v int32
	if err := drv.check(drv.cuDriverGetVersion(&v), "cuDriverGetVersion"); err != nil {
		return nil, err
	}
	l.driverVersion = int(v)
	var count int32
	if err := drv.check(drv.cuDeviceGetCount(&count), "cuDeviceGetCount"); err != nil {
		return nil, err
	}
	if count == 0 {
		return nil, fmt.Errorf("%w: the driver %s sees no device", ErrNoDriver, drv.path)
	}
	if l.nvrtc, err = loadNVRTC(sp); err != nil {
		return nil, err
	}
	if l.blas, err = loadCublas(sp); err != nil {
		return nil, err
	}
	for i := range int(count) {
		g, err := newGPUCtx(l, i)
		if err != nil {
			return nil, err
		}
		l.gpus = append(l.gpus, g)
	}
	return l, nil
}

// gpuCtx is one physical GPU: its primary context, the kernel module, a
// cuBLAS handle (created at the first GEMM), an internal stream for
// housekeeping (zeroing fresh allocations) and the error slots of streams.
type gpuCtx struct {
	l            *lib
	ordinal      int
	dev          int32
	ctx          uintptr
	name         string
	major, minor int
	sms          int
	totalBytes   uint64
	memPools     bool
	fn           map[string]uintptr
	internal     uintptr // stream

	blasMu sync.Mutex
	blas   uintptr

	slotMu    sync.Mutex
	freeSlots []uint64

	clockMu     sync.Mutex
	clockStream uintptr      // an idle stream for clock anchors, made at the first
	anchor      *clockAnchor // the newest; nil: none yet
}

const (
	slotBytes = 32
	slabSlots = 1024
)

func newGPUCtx(l *lib, ordinal int) (*gpuCtx, error) {
	d := l.drv
	g := &gpuCtx{l: l, ordinal: ordinal, fn: map[string]uintptr{}}
	if err := d.check(d.cuDeviceGet(&g.dev, int32(ordinal)), "cuDeviceGet %d", ordinal); err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	if err := d.check(d.cuDeviceGetName(&name[0], int32(len(name)), g.dev), "cuDeviceGetName"); err != nil {
		return nil, err
	}
	g.name = goString(&name[0])
	attr := func(a int32) (int, error) {
		var v int32
		err := d.check(d.cuDeviceGetAttribute(&v, a, g.dev), "cuDeviceGetAttribute %d", a)
		return int(v), err
	}
	var err error
	if g.major, err = attr(attrComputeCapMajor); err != nil {
		return nil, err
	}
	if g.minor, err = attr(attrComputeCapMinor); err != nil {
		return nil, err
	}
	if g.sms, err = attr(attrMultiprocessorCount); err != nil {
		return nil, err
	}
	pools, err := attr(attrMemoryPoolsSupported)
	if err != nil {
		return nil, err
	}
	g.memPools = pools != 0
	if err := d.check(d.cuDeviceTotalMem(&g.totalBytes, g.dev), "cuDeviceTotalMem"); err != nil {
		return nil, err
	}
	if err := d.check(d.cuDevicePrimaryCtxRetain(&g.ctx, g.dev), "cuDevicePrimaryCtxRetain %d", ordinal); err != nil {
		return nil, err
	}
	bin, err := cubinFor(l.nvrtc, g.major, g.minor, l.driverVersion)
	if err != nil {
		return nil, err
	}
	err = g.do(func() error {
		var mod uintptr
		if err := d.check(d.cuModuleLoadData(&mod, unsafe.Pointer(&bin[0])), "cuModuleLoadData (sm_%d%d, %d bytes)", g.major, g.minor, len(bin)); err != nil {
			return err
		}
		for _, k := range kernelNames {
			var f uintptr
			ck := cString(k)
			if err := d.check(d.cuModuleGetFunction(&f, mod, &ck[0]), "cuModuleGetFunction %s", k); err != nil {
				return err
			}
			g.fn[k] = f
		}
		return d.check(d.cuStreamCreate(&g.internal, cuStreamNonBlocking), "cuStreamCreate")
	})
	if err != nil {
		return nil, err
	}
	return g, nil
}

// do runs f on a locked OS thread with g's context current: the driver
// keeps the current context per thread, and goroutines move between
// threads.
func (g *gpuCtx) do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := g.l.drv.check(g.l.drv.cuCtxSetCurrent(g.ctx), "cuCtxSetCurrent"); err != nil {
		return err
	}
	return f()
}

// devPtr is a device address passed to a kernel.
type devPtr uint64

// launch enqueues kernel name on stream s. args are devPtr, int32, int64,
// uint32, float32 or *ropeFreqs (a struct passed by value: the driver
// copies the parameters when the launch is enqueued), in the order and of
// the sizes of the kernel's parameters.
func (g *gpuCtx) launch(s uintptr, name string, grid, block, sharedBytes uint32, args ...any) error {
	f, ok := g.fn[name]
	if !ok {
		panic("gpu/cuda: unknown kernel " + name)
	}
	if grid == 0 {
		return nil
	}
	vals := make([]uint64, len(args))
	ptrs := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case devPtr:
			vals[i] = uint64(v)
		case int32:
			vals[i] = uint64(uint32(v))
		case uint32:
			vals[i] = uint64(v)
		case int64:
			vals[i] = uint64(v)
		case float32:
			vals[i] = uint64(*(*uint32)(unsafe.Pointer(&v)))
		case *ropeFreqs:
			ptrs[i] = unsafe.Pointer(v)
			continue
		default:
			panic(fmt.Sprintf("gpu/cuda: kernel %s argument %d has type %T", name, i, a))
		}
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	var p unsafe.Pointer
	if len(ptrs) > 0 {
		p = unsafe.Pointer(&ptrs[0])
	}
	d := g.l.drv
	err := d.check(d.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, sharedBytes, s, p, nil), "launch %s <<<%d, %d>>>", name, grid, block)
	runtime.KeepAlive(vals)
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(args)
	return err
}

// gridFor returns the number of blocks of threadsPerBlock for n elements of
// a grid-stride kernel: enough to fill the GPU, no more than needed.
func (g *gpuCtx) gridFor(n int64, threadsPerBlock int64) uint32 {
	if n <= 0 {
		return 0
	}
	b := (n + threadsPerBlock - 1) / threadsPerBlock
	return uint32(min(b, int64(g.sms)*32))
}

// slot returns a zeroed error slot (slotBytes of device memory).
func (g *gpuCtx) slot() (uint64, error) {
	g.slotMu.Lock()
	defer g.slotMu.Unlock()
	if len(g.freeSlots) == 0 {
		d := g.l.drv
		var base uint64
		err := g.do(func() error {
			if err := d.check(d.cuMemAlloc(&base, slotBytes*slabSlots), "cuMemAlloc error slots"); err != nil {
				return err
			}
			if err := d.check(d.cuMemsetD8Async(base, 0, slotBytes*slabSlots, g.internal), "cuMemsetD8Async error slots"); err != nil {
				return err
			}
			return d.check(d.cuStreamSynchronize(g.internal), "cuStreamSynchronize")
		})
		if err != nil {
			return 0, err
		}
		for i := slabSlots - 1; i >= 0; i-- {
			g.freeSlots = append(g.freeSlots, base+uint64(i*slotBytes))
		}
	}
	s := g.freeSlots[len(g.freeSlots)-1]
	g.freeSlots = g.freeSlots[:len(g.freeSlots)-1]
	return s, nil
}

func (g *gpuCtx) releaseSlot(s uint64) {
	g.slotMu.Lock()
	g.freeSlots = append(g.freeSlots, s)
	g.slotMu.Unlock()
}

// cublasHandle returns the GPU's cuBLAS handle, creating it at first use.
// The caller holds g.blasMu.
func (g *gpuCtx) cublasHandle() (uintptr, error) {
	if g.blas != 0 {
		return g.blas, nil
	}
	var h uintptr
	if err := cublasCheck(g.l.blas.cublasCreate(&h), "cublasCreate"); err != nil {
		return 0, err
	}
	g.blas = h
	return h, nil
}

var errClosed = errors.New("gpu/cuda: backend closed")
