package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoDriver is returned (wrapped) by New when no CUDA driver can be loaded
// or the driver finds no device: the normal case on a machine without a GPU.
var ErrNoDriver = errors.New("cuda: no CUDA driver or device")

// EnvSpinWait, when set, makes collectives order streams with spin kernels
// (wait_flag, write_flag) instead of cuStreamWaitValue32: the path taken
// where the driver lacks stream memory operations, and a way to test it.
const EnvSpinWait = "STRATA_CUDA_SPIN_WAIT"

// cuResult is a CUresult of the driver API.
type cuResult int32

const (
	cudaSuccess      cuResult = 0
	cudaOutOfMemory  cuResult = 2
	cudaNoDevice     cuResult = 100
	cudaNotReady     cuResult = 600
	cudaNotSupported cuResult = 801
)

// Error is a failed driver, NVRTC or cuBLAS call.
type Error struct {
	Op   string // the call and its subject: "cuMemAlloc 4096 bytes"
	Lib  string // "driver", "nvrtc", "cublas"
	Code int
	Name string // CUDA_ERROR_OUT_OF_MEMORY, NVRTC_ERROR_COMPILATION, ...
}

func (e *Error) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("cuda: %s: %s (%s error %d)", e.Op, e.Name, e.Lib, e.Code)
	}
	return fmt.Sprintf("cuda: %s: %s error %d", e.Op, e.Lib, e.Code)
}

// driverAPI is the part of libcuda the backend calls. Functions the
// headers map to a _v2 symbol are looked up under that name first.
type driverAPI struct {
	path string

	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(v *int32) cuResult
	cuGetErrorName            func(r cuResult, s **byte) cuResult
	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(d *int32, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, d int32) cuResult
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) cuResult
	cuDeviceTotalMem          func(b *uint64, d int32) cuResult
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, d int32) cuResult
	cuCtxSetCurrent           func(ctx uintptr) cuResult
	cuDeviceCanAccessPeer     func(can *int32, d, peer int32) cuResult
	cuCtxEnablePeerAccess     func(peerCtx uintptr, flags uint32) cuResult
	cuMemGetInfo              func(free, total *uint64) cuResult
	cuMemAlloc                func(p *uint64, n uint64) cuResult
	cuMemFree                 func(p uint64) cuResult
	cuMemAllocAsync           func(p *uint64, n uint64, s uintptr) cuResult
	cuMemFreeAsync            func(p uint64, s uintptr) cuResult
	cuMemHostAlloc            func(p *unsafe.Pointer, n uint64, flags uint32) cuResult
	cuMemFreeHost             func(p unsafe.Pointer) cuResult
	cuMemHostGetDevicePointer func(d *uint64, p unsafe.Pointer, flags uint32) cuResult
	cuMemHostRegister         func(p unsafe.Pointer, n uint64, flags uint32) cuResult
	cuMemHostUnregister       func(p unsafe.Pointer) cuResult
	cuMemsetD8Async           func(p uint64, v uint8, n uint64, s uintptr) cuResult
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) cuResult
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) cuResult
	cuMemcpyAsync             func(dst, src uint64, n uint64, s uintptr) cuResult
	cuStreamCreate            func(s *uintptr, flags uint32) cuResult
	cuStreamDestroy           func(s uintptr) cuResult
	cuStreamSynchronize       func(s uintptr) cuResult
	cuStreamWaitEvent         func(s, e uintptr, flags uint32) cuResult
	cuStreamWaitValue32       func(s uintptr, addr uint64, v uint32, flags uint32) cuResult
	cuStreamWriteValue32      func(s uintptr, addr uint64, v uint32, flags uint32) cuResult
	cuEventCreate             func(e *uintptr, flags uint32) cuResult
	cuEventDestroy            func(e uintptr) cuResult
	cuEventRecord             func(e, s uintptr) cuResult
	cuEventSynchronize        func(e uintptr) cuResult
	cuEventQuery              func(e uintptr) cuResult
	cuEventElapsedTime        func(ms *float32, start, end uintptr) cuResult
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) cuResult
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) cuResult
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) cuResult
	hasStreamMemOps           bool
}

// Driver API constants.
const (
	cuStreamNonBlocking       = 0x1
	cuEventDisableTiming      = 0x2
	cuMemHostAllocPortable    = 0x1
	cuMemHostAllocDeviceMap   = 0x2
	cuMemHostRegisterPortable = 0x1
	cuStreamWaitValueGEQ      = 0x0
	attrComputeCapMajor       = 75
	attrComputeCapMinor       = 76
	attrMultiprocessorCount   = 16
	attrMemoryPoolsSupported  = 115
)

// symbol resolves name (trying name_v2 first when v2) in lib.
type symbolTable struct {
	handle uintptr
	lib    string
	err    error
}

func (t *symbolTable) bind(fptr any, name string, v2 bool) {
	if t.err != nil {
		return
	}
	names := []string{name}
	if v2 {
		names = []string{name + "_v2", name}
	}
	for _, n := range names {
		if sym, err := purego.Dlsym(t.handle, n); err == nil && sym != 0 {
			purego.RegisterFunc(fptr, sym)
			return
		}
	}
	t.err = fmt.Errorf("cuda: %s: symbol %s not found", t.lib, name)
}

func (t *symbolTable) optional(fptr any, name string, v2 bool) bool {
	if t.err != nil {
		return false
	}
	t.bind(fptr, name, v2)
	if t.err != nil {
		t.err = nil
		return false
	}
	return true
}

// dlopenFirst opens the first candidate that loads and returns its handle
// and path, or the errors of every attempt.
func dlopenFirst(lib library, sp searchPath, exists func(string) bool) (uintptr, string, error) {
	var errs []string
	for _, p := range sp.candidates(lib, exists) {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		errs = append(errs, err.Error())
	}
	return 0, "", fmt.Errorf("cannot load %s (tried %d paths; set %s to the folder holding %s): %s",
		lib.what, len(errs), EnvLibDir, lib.names[0], strings.Join(lastN(errs, 3), "; "))
}

func lastN(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func loadDriver(sp searchPath) (*driverAPI, error) {
	h, path, err := dlopenFirst(libDriver, sp, fileExists)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	d := &driverAPI{path: path}
	t := &symbolTable{handle: h, lib: "libcuda"}
	t.bind(&d.cuInit, "cuInit", false)
	t.bind(&d.cuDriverGetVersion, "cuDriverGetVersion", false)
	t.bind(&d.cuGetErrorName, "cuGetErrorName", false)
	t.bind(&d.cuDeviceGetCount, "cuDeviceGetCount", false)
	t.bind(&d.cuDeviceGet, "cuDeviceGet", false)
	t.bind(&d.cuDeviceGetName, "cuDeviceGetName", false)
	t.bind(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute", false)
	t.bind(&d.cuDeviceTotalMem, "cuDeviceTotalMem", true)
	t.bind(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", false)
	t.bind(&d.cuCtxSetCurrent, "cuCtxSetCurrent", false)
	t.bind(&d.cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", false)
	t.bind(&d.cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", false)
	t.bind(&d.cuMemGetInfo, "cuMemGetInfo", true)
	t.bind(&d.cuMemAlloc, "cuMemAlloc", true)
	t.bind(&d.cuMemFree, "cuMemFree", true)
	t.bind(&d.cuMemAllocAsync, "cuMemAllocAsync", false)
	t.bind(&d.cuMemFreeAsync, "cuMemFreeAsync", false)
	t.bind(&d.cuMemHostAlloc, "cuMemHostAlloc", false)
	t.bind(&d.cuMemFreeHost, "cuMemFreeHost", false)
	t.bind(&d.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer", true)
	t.bind(&d.cuMemHostRegister, "cuMemHostRegister", true)
	t.bind(&d.cuMemHostUnregister, "cuMemHostUnregister", false)
	t.bind(&d.cuMemsetD8Async, "cuMemsetD8Async", false)
	t.bind(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync", true)
	t.bind(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync", true)
	t.bind(&d.cuMemcpyAsync, "cuMemcpyAsync", false)
	t.bind(&d.cuStreamCreate, "cuStreamCreate", false)
	t.bind(&d.cuStreamDestroy, "cuStreamDestroy", true)
	t.bind(&d.cuStreamSynchronize, "cuStreamSynchronize", false)
	t.bind(&d.cuStreamWaitEvent, "cuStreamWaitEvent", false)
	t.bind(&d.cuEventCreate, "cuEventCreate", false)
	t.bind(&d.cuEventDestroy, "cuEventDestroy", true)
	t.bind(&d.cuEventRecord, "cuEventRecord", false)
	t.bind(&d.cuEventSynchronize, "cuEventSynchronize", false)
	t.bind(&d.cuEventQuery, "cuEventQuery", false)
	t.bind(&d.cuEventElapsedTime, "cuEventElapsedTime", true)
	t.bind(&d.cuModuleLoadData, "cuModuleLoadData", false)
	t.bind(&d.cuModuleGetFunction, "cuModuleGetFunction", false)
	t.bind(&d.cuLaunchKernel, "cuLaunchKernel", false)
	if t.err != nil {
		return nil, t.err
	}
	d.hasStreamMemOps = t.optional(&d.cuStreamWaitValue32, "cuStreamWaitValue32", true) &&
		t.optional(&d.cuStreamWriteValue32, "cuStreamWriteValue32", true) &&
		os.Getenv(EnvSpinWait) == ""
	return d, nil
}

// check turns a CUresult into an *Error naming op.
func (d *driverAPI) check(r cuResult, op string, args ...any) error {
	if r == cudaSuccess {
		return nil
	}
	if len(args) > 0 {
		op = fmt.Sprintf(op, args...)
	}
	e := &Error{Op: op, Lib: "driver", Code: int(r)}
	var s *byte
	if d.cuGetErrorName(r, &s) == cudaSuccess {
		e.Name = goString(s)
	}
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// cString returns s as a NUL-terminated byte slice.
func cString(s string) []byte { return append([]byte(s), 0) }

// sameFolder returns the candidates of lib in the folder of path, so that a
// library is loaded next to the one that needs it.
func sameFolder(path string, lib library) []string {
	dir := filepath.Dir(path)
	if dir == "." {
		return nil
	}
	out := make([]string, 0, len(lib.names))
	for _, n := range lib.names {
		out = append(out, filepath.Join(dir, n))
	}
	return out
}
