package cuda

import (
	_ "embed"
	"fmt"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

//go:embed kernels.cu
var kernelSource string

// nvrtcAPI is the part of libnvrtc the backend calls.
type nvrtcAPI struct {
	path string

	nvrtcVersion           func(major, minor *int32) int32
	nvrtcGetErrorString    func(r int32) *byte
	nvrtcCreateProgram     func(p *uintptr, src *byte, name *byte, nHeaders int32, headers, includes unsafe.Pointer) int32
	nvrtcDestroyProgram    func(p *uintptr) int32
	nvrtcCompileProgram    func(p uintptr, nOpts int32, opts unsafe.Pointer) int32
	nvrtcGetProgramLogSize func(p uintptr, n *uint64) int32
	nvrtcGetProgramLog     func(p uintptr, log *byte) int32
	nvrtcGetCUBINSize      func(p uintptr, n *uint64) int32
	nvrtcGetCUBIN          func(p uintptr, bin *byte) int32
}

func loadNVRTC(sp searchPath) (*nvrtcAPI, error) { return loadNVRTCLib(libNVRTC, sp) }

// loadNVRTCLib loads NVRTC by the names of lib (tests add older sonames:
// NVRTC compiles without a GPU).
func loadNVRTCLib(lib library, sp searchPath) (*nvrtcAPI, error) {
	h, path, err := dlopenFirst(lib, sp, fileExists)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	// NVRTC dlopens its builtins library by soname at compile time; load it
	// from the same folder first so that it is found wherever NVRTC was.
	if builtins, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "libnvrtc-builtins.so*")); len(builtins) > 0 {
		for _, b := range builtins {
			if _, err := purego.Dlopen(b, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
				break
			}
		}
	}
	n := &nvrtcAPI{path: path}
	t := &symbolTable{handle: h, lib: "libnvrtc"}
	t.bind(&n.nvrtcVersion, "nvrtcVersion", false)
	t.bind(&n.nvrtcGetErrorString, "nvrtcGetErrorString", false)
	t.bind(&n.nvrtcCreateProgram, "nvrtcCreateProgram", false)
	t.bind(&n.nvrtcDestroyProgram, "nvrtcDestroyProgram", false)
	t.bind(&n.nvrtcCompileProgram, "nvrtcCompileProgram", false)
	t.bind(&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", false)
	t.bind(&n.nvrtcGetProgramLog, "nvrtcGetProgramLog", false)
	t.bind(&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize", false)
	t.bind(&n.nvrtcGetCUBIN, "nvrtcGetCUBIN", false)
	if t.err != nil {
		return nil, t.err
	}
	return n, nil
}

func (n *nvrtcAPI) check(r int32, op string) error {
	if r == 0 {
		return nil
	}
	return &Error{Op: op, Lib: "nvrtc", Code: int(r), Name: goString(n.nvrtcGetErrorString(r))}
}

func (n *nvrtcAPI) version() string {
	var major, minor int32
	if n.nvrtcVersion(&major, &minor) != 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d.%d", major, minor)
}

// nvrtcOptions are the compiler options for a device of compute capability
// major.minor: machine code for exactly that architecture (sm_XX, so the
// driver need not JIT), IEEE division and square root, denormals kept, and
// no contraction of a*b+c into fused multiply-adds, so that elementwise
// results round like the Go reference (kernels that want an FMA say so with
// __fmaf_rn).
func nvrtcOptions(major, minor int) []string {
	return []string{
		fmt.Sprintf("--gpu-architecture=sm_%d%d", major, minor),
		"--fmad=false",
		"--prec-div=true",
		"--prec-sqrt=true",
		"--ftz=false",
		"--std=c++17",
		"-default-device",
	}
}

// compile compiles src for sm_<major><minor> and returns the cubin.
func (n *nvrtcAPI) compile(src, name string, major, minor int) ([]byte, error) {
	bin, _, err := n.compileLog(src, name, major, minor)
	return bin, err
}

// compileLog is compile with extra options after nvrtcOptions', returning
// the compiler's log too (with --ptxas-options=-v: each kernel's
// registers and shared memory).
func (n *nvrtcAPI) compileLog(src, name string, major, minor int, extra ...string) ([]byte, string, error) {
	var prog uintptr
	csrc, cname := cString(src), cString(name)
	if err := n.check(n.nvrtcCreateProgram(&prog, &csrc[0], &cname[0], 0, nil, nil), "nvrtcCreateProgram"); err != nil {
		return nil, "", err
	}
	defer n.nvrtcDestroyProgram(&prog)
	opts := append(nvrtcOptions(major, minor), extra...)
	cs := make([][]byte, len(opts))
	ptrs := make([]*byte, len(opts))
	for i, o := range opts {
		cs[i] = cString(o)
		ptrs[i] = &cs[i][0]
	}
	res := n.nvrtcCompileProgram(prog, int32(len(ptrs)), unsafe.Pointer(&ptrs[0]))
	var logSize uint64
	log := ""
	if n.nvrtcGetProgramLogSize(prog, &logSize) == 0 && logSize > 1 {
		b := make([]byte, logSize)
		if n.nvrtcGetProgramLog(prog, &b[0]) == 0 {
			log = strings.TrimRight(string(b), "\x00\n ")
		}
	}
	if res != 0 {
		err := n.check(res, "nvrtc compile "+name+" "+strings.Join(opts, " "))
		if log != "" {
			err = fmt.Errorf("%w:\n%s", err, log)
		}
		return nil, log, err
	}
	var size uint64
	if err := n.check(n.nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize"); err != nil {
		return nil, log, err
	}
	bin := make([]byte, size)
	if err := n.check(n.nvrtcGetCUBIN(prog, &bin[0]), "nvrtcGetCUBIN"); err != nil {
		return nil, log, err
	}
	return bin, log, nil
}
