package cuda

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests need no GPU. TestKernelsCompile needs NVRTC (it compiles
// without a driver: Debian's libnvrtc11.2 from non-free is enough);
// TestKernelsOnCPU needs a C++20 compiler. Each skips, saying why, where
// its tool is missing.

// staticSharedLimit is the static shared memory a block may declare
// without opting in (48 KiB on every architecture since sm_70).
const staticSharedLimit = 48 << 10

// TestKernelsCompile compiles kernels.cu with NVRTC for sm_90 (H100/H200)
// and sm_80 (A100) with the backend's options and checks, from ptxas's
// report, that every kernel's static shared memory is within the limit.
func TestKernelsCompile(t *testing.T) {
	lib := library{what: "nvrtc", names: append(append([]string(nil), libNVRTC.names...), "libnvrtc.so.11.2")}
	n, err := loadNVRTCLib(lib, newSearchPath(os.Getenv(EnvLibDir), filepath.Glob))
	if err != nil {
		t.Skipf("no NVRTC here: %v", err)
	}
	t.Logf("NVRTC %s (%s)", n.version(), n.path)
	re := regexp.MustCompile(`Compiling entry function '(\w+)' for 'sm_\d+'\s*\n(?:.*\n)*?ptxas info\s*: Used (\d+) registers(?:, (\d+) bytes smem)?`)
	for _, arch := range [][2]int{{9, 0}, {8, 0}} {
		bin, log, err := n.compileLog(kernelSource, "strata_kernels.cu", arch[0], arch[1], "--ptxas-options=-v")
		if err != nil {
			t.Fatalf("sm_%d%d: %v", arch[0], arch[1], err)
		}
		if len(bin) == 0 {
			t.Fatalf("sm_%d%d: empty cubin", arch[0], arch[1])
		}
		found := map[string]bool{}
		for _, m := range re.FindAllStringSubmatch(log, -1) {
			found[m[1]] = true
			smem, _ := strconv.Atoi(m[3])
			if smem > staticSharedLimit {
				t.Errorf("sm_%d%d: %s declares %d bytes of shared memory, past %d", arch[0], arch[1], m[1], smem, staticSharedLimit)
			}
			if strings.HasPrefix(m[1], "attn_") && arch[0] == 9 {
				t.Logf("sm_90 %s: %s registers, %s bytes shared", m[1], m[2], m[3])
			}
		}
		for _, k := range kernelNames {
			if !found[k] {
				t.Errorf("sm_%d%d: no ptxas report for %s", arch[0], arch[1], k)
			}
		}
	}
}

// TestKernelsOnCPU builds testdata/emu (kernels.cu on the CPU: blocks in
// turn, a block's threads as OS threads, __syncthreads a barrier) with
// AddressSanitizer and UBSan, and runs its checks of the attention (the
// CUDA-core kernels, the tensor-core ones under its warp model of
// mma.sync and the shuffles, and generation's kv_append and attn_cached),
// RMSNorm,
// RoPE (partial, scaled), GLU (SwiGLU, GeGLU), embedding and cross-entropy
// (with and without a soft cap), scale_rows and row_dots kernels, and the attention options, against float64
// references, with the blocks in order and shuffled. STRATA_EMU_TSAN=1
// runs it again under ThreadSanitizer (a missing __syncthreads shows as a
// data race; minutes on two cores).
func TestKernelsOnCPU(t *testing.T) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		if cxx, err = exec.LookPath("c++"); err != nil {
			t.Skip("no C++ compiler here")
		}
	}
	builds := [][]string{{"-fsanitize=address,undefined", "-fno-sanitize-recover=all"}}
	if os.Getenv("STRATA_EMU_TSAN") == "1" {
		builds = append(builds, []string{"-fsanitize=thread"})
	}
	for _, san := range builds {
		bin := filepath.Join(t.TempDir(), "emu")
		args := append([]string{"-std=c++20", "-O1", "-g", "-ffp-contract=off", "-pthread", "-Wall", "-Wno-unknown-pragmas",
			"-Wno-sign-compare", "-Wno-unused-function", "-o", bin, "emu_test.cc"}, san...)
		cmd := exec.Command(cxx, args...)
		cmd.Dir = filepath.Join("testdata", "emu")
		if out, err := cmd.CombinedOutput(); err != nil {
			if strings.Contains(string(out), "<barrier>") {
				t.Skipf("%s lacks C++20's <barrier>: %s", cxx, out)
			}
			t.Fatalf("%s %s: %v\n%s", cxx, strings.Join(args, " "), err, out)
		}
		// A guard against a hang (a kernel whose threads wait at
		// different barriers), not a timing assertion.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		run := exec.CommandContext(ctx, bin)
		run.Env = append(os.Environ(), "TSAN_OPTIONS=halt_on_error=1", "ASAN_OPTIONS=detect_leaks=0")
		out, err := run.CombinedOutput()
		cancel()
		res := strings.TrimSpace(string(out))
		if err != nil {
			t.Fatalf("emu %s: %v\n%s", san[0], err, res)
		}
		if !regexp.MustCompile(`(?m)^\d+ passed, 0 failed$`).MatchString(res) {
			t.Fatalf("emu %s: no summary line:\n%s", san[0], res)
		}
		t.Logf("emu %s: %s", san[0], res[strings.LastIndex(res, "\n")+1:])
	}
}
