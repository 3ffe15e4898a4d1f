package cuda

import (
	"errors"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// These tests need no GPU: they run in CI.

func TestSearchOrder(t *testing.T) {
	glob := func(pattern string) ([]string, error) {
		switch pattern {
		case "/opt/*/.venv/lib/python3*/site-packages":
			return []string{"/opt/torch/.venv/lib/python3.12/site-packages"}, nil
		case "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/*/lib":
			// unsorted on purpose; cu13 must come first
			return []string{
				"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib",
				"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib",
				"/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib",
			}, nil
		}
		return nil, nil
	}
	sp := newSearchPath("/my/cuda:/other::/my/cuda", glob)
	if want := []string{"/my/cuda", "/other"}; !slices.Equal(sp.env, want) {
		t.Errorf("override folders %v, want %v (empty entries and duplicates dropped)", sp.env, want)
	}
	if sp.system[0] != "/usr/local/cuda/lib64" {
		t.Errorf("first system folder %q", sp.system[0])
	}
	site := "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/"
	if want := []string{site + "cu13/lib", site + "cublas/lib", site + "cuda_nvrtc/lib"}; !slices.Equal(sp.python, want) {
		t.Errorf("python folders %v, want %v", sp.python, want)
	}

	present := map[string]bool{
		"/other/libnvrtc.so.13":                  true,
		"/usr/local/cuda/lib64/libnvrtc.so.12":   true,
		site + "cu13/lib/libnvrtc.so.13":         true,
		site + "cuda_nvrtc/lib/libnvrtc.so.12":   true,
		"/usr/local/cuda/lib64/libcublas.so.13":  true,
		"/usr/local/nvidia/lib64/libcuda.so.1":   true,
		"/usr/local/cuda/lib64/not-a-library.so": true,
	}
	exists := func(p string) bool { return present[p] }
	got := sp.candidates(libNVRTC, exists)
	want := []string{
		"/other/libnvrtc.so.13",                           // override first
		"/usr/local/cuda/lib64/libnvrtc.so.12",            // system CUDA
		"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", // the loader's own search
		site + "cu13/lib/libnvrtc.so.13", // Python wheels last
		site + "cuda_nvrtc/lib/libnvrtc.so.12",
	}
	if !slices.Equal(got, want) {
		t.Errorf("nvrtc candidates:\n got %q\nwant %q", got, want)
	}
	if got := sp.candidates(libDriver, exists); got[0] != "/usr/local/nvidia/lib64/libcuda.so.1" || got[1] != "libcuda.so.1" {
		t.Errorf("driver candidates %q", got)
	}
}

func TestNoOverrideSearch(t *testing.T) {
	sp := newSearchPath("", func(string) ([]string, error) { return nil, nil })
	if len(sp.env) != 0 || len(sp.python) != 0 {
		t.Fatalf("search path %+v", sp)
	}
	got := sp.candidates(libCublas, func(string) bool { return false })
	if !slices.Equal(got, libCublas.names) {
		t.Errorf("with nothing on disk, candidates %q, want the bare names %q", got, libCublas.names)
	}
}

func TestNVRTCOptions(t *testing.T) {
	opts := nvrtcOptions(9, 0)
	for _, want := range []string{"--gpu-architecture=sm_90", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"} {
		if !slices.Contains(opts, want) {
			t.Errorf("options %q lack %q", opts, want)
		}
	}
	if got := nvrtcOptions(12, 1)[0]; got != "--gpu-architecture=sm_121" {
		t.Errorf("arch option for 12.1: %q", got)
	}
	o := nvrtcOptions(9, 0)
	k := kernelKey("src", o, 9, 0, "13.0", 13000)
	for _, other := range []string{kernelKey("src2", o, 9, 0, "13.0", 13000), kernelKey("src", o, 8, 0, "13.0", 13000),
		kernelKey("src", o, 9, 0, "13.1", 13000), kernelKey("src", o, 9, 0, "13.0", 13010), kernelKey("src", o[1:], 9, 0, "13.0", 13000)} {
		if other == k {
			t.Errorf("kernel key %q does not change with source, options, arch, nvrtc and driver version", k)
		}
	}
	if !strings.Contains(k, "sm_90") || !strings.Contains(k, "nvrtc13.0") {
		t.Errorf("kernel key %q", k)
	}
}

// TestKernelsDeclared checks that every kernel the Go side looks up is an
// extern "C" kernel of kernels.cu, and that every kernel there is looked up.
func TestKernelsDeclared(t *testing.T) {
	re := regexp.MustCompile(`extern "C" __global__ void (?:__launch_bounds__\(\w+\) )?(\w+)\(`)
	var declared []string
	for _, m := range re.FindAllStringSubmatch(kernelSource, -1) {
		declared = append(declared, m[1])
	}
	slices.Sort(declared)
	names := slices.Clone(kernelNames)
	slices.Sort(names)
	if !slices.Equal(declared, names) {
		t.Errorf("kernels.cu declares %v, the Go side looks up %v", declared, names)
	}
	// The dtype codes of kernels.cu are internal/dtype's.
	for _, c := range []struct {
		name string
		dt   gpu.DType
	}{{"DT_F32", gpu.F32}, {"DT_BF16", gpu.BF16}, {"DT_I32", gpu.I32}, {"DT_F64", gpu.F64}} {
		if !regexp.MustCompile(`#define ` + c.name + ` ` + string(rune('0'+int(c.dt))) + `\n`).MatchString(kernelSource) {
			t.Errorf("kernels.cu: %s is not %d", c.name, c.dt)
		}
	}
	if !strings.Contains(kernelSource, "#define SS_BLOCKS 256") || sumSquaresBlocks != 256 || rowThreads != 256 ||
		!strings.Contains(kernelSource, "#define NT 256") {
		t.Error("block sizes of kernels.cu and ops.go disagree")
	}
}

func TestErrorText(t *testing.T) {
	e := &Error{Op: "cuMemAlloc 4096 bytes", Lib: "driver", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	if got, want := e.Error(), "cuda: cuMemAlloc 4096 bytes: CUDA_ERROR_OUT_OF_MEMORY (driver error 2)"; got != want {
		t.Errorf("error text %q, want %q", got, want)
	}
	if got := cublasCheck(13, "cublasGemmEx 1×2×3"); got == nil || !strings.Contains(got.Error(), "CUBLAS_STATUS_EXECUTION_FAILED") {
		t.Errorf("cublas error %v", got)
	}
	if cublasCheck(0, "x") != nil {
		t.Error("status 0 is an error")
	}
	se := slotError([8]int32{codeTarget, 99, 2, 10})
	if want := "gpu/cuda: cross-entropy: target 99 at position 2 outside [0, 10)"; se.Error() != want {
		t.Errorf("slot error %q, want %q", se, want)
	}
	for _, c := range []struct {
		slot [8]int32
		want string
	}{
		{[8]int32{codePos, 70, 3, 64}, "gpu/cuda: embedding: position 70 at position 3 outside [0, 64)"},
		{[8]int32{codeEmbeddingID, -4, 9, 50}, "gpu/cuda: embedding: id -4 at position 9 outside [0, 50)"},
		// check_pos: [2] the token's index, [3] seq: row 2, column 3
		{[8]int32{codeAttnPos, 4, 2*7 + 3, 7}, "gpu/cuda: attention: position 4 of row 2, column 3 outside [0, 3]"},
		{[8]int32{codeAttnBwdPos, -1, 0, 7}, "gpu/cuda: attention-backward: position -1 of row 0, column 0 outside [0, 0]"},
	} {
		if se := slotError(c.slot); se.Error() != c.want {
			t.Errorf("slot error %q, want %q", se, c.want)
		}
	}
}

func TestOptions(t *testing.T) {
	o := Options{}.WithDefaults(2)
	if o.Devices != 2 || o.ReserveBytes != DefaultReserveBytes {
		t.Errorf("defaults: %v", o)
	}
	if err := o.Validate(); err != nil {
		t.Error(err)
	}
	for _, bad := range []Options{{Devices: -1, ReserveBytes: 1}, {Devices: 1, HBMBytes: -5}, {Devices: 1, ReserveBytes: -1}} {
		if bad.Validate() == nil {
			t.Errorf("%v validated", bad)
		}
	}
	if s := (Options{Devices: 4, HBMBytes: 1 << 30, ReserveBytes: 1 << 30}).String(); !strings.Contains(s, "Devices: 4") {
		t.Errorf("String: %s", s)
	}
}

// TestLoadErrorNamesOverride: a failed load names the override variable,
// and a missing driver is ErrNoDriver.
func TestLoadErrorNamesOverride(t *testing.T) {
	dir := t.TempDir()
	sp := searchPath{env: []string{dir}}
	_, _, err := dlopenFirst(library{what: "nvrtc", names: []string{"libstrata-does-not-exist.so.99"}}, sp, fileExists)
	if err == nil || !strings.Contains(err.Error(), EnvLibDir) {
		t.Errorf("error %v does not name %s", err, EnvLibDir)
	}
	if _, err := loadDriver(searchPath{env: []string{filepath.Join(dir, "none")}, system: []string{dir}}); err == nil {
		// A system driver exists on this machine: nothing to check.
		t.Log("a driver loaded from the loader's search path")
	} else if !errors.Is(err, ErrNoDriver) {
		t.Errorf("missing driver: %v, want ErrNoDriver", err)
	}
}
