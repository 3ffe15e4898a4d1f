package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cuda-verify.sh runs on a GPU machine; these tests run its CPU-side
// parts without one: it parses (sh -n, bash -n), its arguments are
// handled (dry run, bad parts, stray arguments), and its summary is right
// on canned outputs of every part, passing and failing.

func runVerify(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"cuda-verify.sh"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func TestCudaVerifyScriptParsesAndArgs(t *testing.T) {
	for _, sh := range []string{"sh", "bash"} {
		if _, err := exec.LookPath(sh); err != nil {
			continue
		}
		if out, err := exec.Command(sh, "-n", "cuda-verify.sh").CombinedOutput(); err != nil {
			t.Errorf("%s -n cuda-verify.sh: %v\n%s", sh, err, out)
		}
	}
	if py, err := exec.LookPath("python3"); err == nil {
		cmd := exec.Command(py, "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())", "tools/torch_gpt2_step.py")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("tools/torch_gpt2_step.py does not parse: %v\n%s", err, out)
		}
	}
	out, rc := runVerify(t, []string{"OUT=/o", "STRATA_BIN=/b/strata", "CUDA_TEST=/b/cuda.test", "NVME_PATH=/n"}, "--dry-run")
	if rc != 0 {
		t.Fatalf("--dry-run: exit %d\n%s", rc, out)
	}
	for _, want := range []string{
		"conformance [110 s]: /b/cuda.test -test.v",
		"gpt2 [80 s]: /b/strata bench step --backend cuda --model gpt2 --batch 16 --seq 1024",
		"torch [60 s]: python3 ", "torch_gpt2_step.py --model gpt2 --batch 16 --seq 1024",
		"mfu [80 s]: /b/strata train --backend cuda --config /o/mfu.json",
		"offload [70 s]: /b/strata bench step --backend cuda --model gpt2 --batch 4 --seq 1024 --warmup 1 --steps 2 --block 1 --modes resident,host,nvme --overlap exact,dpu --hbm 60GiB --nvme-path /n --json",
		"ranks [80 s]: env RANKS='2 4' RUNS=2 STEPS=8 RUN_TIMEOUT=15 HANG=0 CUDA_TEST=/nonexistent OUT=/o STRATA_BIN=/b/strata BACKEND=cuda sh ", "gpu/cuda/device_check.sh multirank",
		"total limit: 480 s\n", // the 8 minutes of the issue
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--dry-run lacks %q:\n%s", want, out)
		}
	}
	out, rc = runVerify(t, []string{"T_MFU=30"}, "--dry-run", "--parts", "gpt2,mfu")
	if rc != 0 || strings.Contains(out, "conformance") || !strings.Contains(out, "mfu [30 s]") || !strings.Contains(out, "total limit: 110 s") {
		t.Errorf("--parts gpt2,mfu with T_MFU=30: exit %d\n%s", rc, out)
	}
	for _, bad := range [][]string{{"--parts", "gpt2,bogus"}, {"--parts"}, {"extra"}, {"summarize", "/nonexistent/dir"}} {
		out, rc := runVerify(t, nil, bad...)
		if rc != 2 || !strings.Contains(out, "usage: sh bench/cuda-verify.sh") {
			t.Errorf("%q: exit %d, want 2 and the usage:\n%s", bad, rc, out)
		}
	}
	out, _ = runVerify(t, nil, "--parts", "gpt2,bogus")
	if !strings.Contains(out, `unknown part "bogus"`) {
		t.Errorf("a bad part is not named:\n%s", out)
	}
	// No binaries: one clear error before any part runs.
	dir := t.TempDir()
	out, rc = runVerify(t, []string{"OUT=" + dir, "STRATA_BIN=" + filepath.Join(dir, "none")}, "--parts", "gpt2")
	if rc != 1 || !strings.Contains(out, "cuda-verify.sh build") {
		t.Errorf("missing binaries: exit %d\n%s", rc, out)
	}
}

// canned writes the outputs of a finished run: the logs as the commands
// print them (shortened), parts.txt as run_part writes it.
func canned(t *testing.T, parts string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["parts.txt"] = parts
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func goodRun() map[string]string {
	return map[string]string{
		"conformance.log": "=== RUN   TestProbe\n    cuda_test.go:46: driver /usr/lib/libcuda.so.1 (CUDA 13000), nvrtc 13.0 (/x), cublas /y; bf16 GEMMs: cuBLASLt /y/libcublasLt.so.13, fp32 accumulation; f32 GEMMs: cublasGemmEx fp32; kernel cache /root/.cache/strata/kernels: 0 of 1 modules read from it\n" +
			"--- PASS: TestProbe (0.01s)\n--- PASS: TestConformance (40.00s)\n    --- PASS: TestConformance/Gemm (1.00s)\n--- PASS: TestDeterministic (2.00s)\nPASS\n",
		"gpt2.log":  "some progress line\n" + `{"backend":"cuda","model":"gpt2","step_s_resident":0.6,"tokens_per_step":16384,"resident":{"params_identical":true}}` + "\n",
		"torch.log": `{"device": "NVIDIA H200", "params": 124439808, "sdpa": true, "step_s": [0.5, 0.5, 0.5], "tokens_per_step": 16384, "torch": "2.5.1", "torch_step_s_median": 0.5}` + "\n",
		"mfu/steps.jsonl": `{"step":1,"loss":11.0,"lr":0,"grad_norm":1.0,"clip_coef":1,"step_s":9.0,"tokens_per_s":1}` + "\n" +
			`{"step":2,"loss":10.9,"lr":0,"grad_norm":1.0,"clip_coef":1,"step_s":0.10,"tokens_per_s":1}` + "\n" +
			`{"step":3,"loss":10.8,"lr":0,"grad_norm":1.0,"clip_coef":1,"step_s":0.30,"tokens_per_s":1}` + "\n" +
			`{"step":4,"loss":10.7,"lr":0,"grad_norm":1.0,"clip_coef":1,"step_s":0.20,"tokens_per_s":1}` + "\n",
		"mfu/summary.json": "{\n  \"model\": \"custom\",\n  \"params\": 1018429440,\n  \"devices\": 1\n}\n",
		"offload.log": `{"host":{"params_identical":true},"nvme":{"params_identical":true},"resident":{"params_identical":true},"runs":[` +
			offloadRun("resident", "", true, 0.5) + "," + offloadRun("host", "exact", true, 0.52) + "," + offloadRun("nvme", "exact", true, 0.6) + "," +
			offloadRun("host", "dpu", false, 0.51) + "," + offloadRun("nvme", "dpu", false, 0.58) + `],"step_s_resident":0.5}` + "\n",
		"ranks.log": "== multirank summary\n2 ranks: 2/2 runs completed, bit-identical to run 1; collectives: rank-order\n" +
			"2 ranks, run 1: device allocations after step 1, per device: 0 0\n4 ranks: 2/2 runs completed, bit-identical to run 1; collectives: rank-order\n" +
			"4 ranks, run 1: device allocations after step 1, per device: 0 0 0 0\n1 rank, strata.deterministic false: completed; collectives: nccl\n" +
			"collective tests: skipped, no /nonexistent\n",
	}
}

// offloadRun is one entry of bench step's "runs", as it prints it (keys
// sorted, the other figures left out).
func offloadRun(mode, overlap string, identical bool, step float64) string {
	return fmt.Sprintf(`{"adam_s":0.01,"final_loss":3.8,"mode":%q,"moments":"fp32","overlap":%q,"params_identical":%v,"ratio_serial":0,"step_s":%g,"train":"full"}`,
		mode, overlap, identical, step)
}

func TestCudaVerifySummary(t *testing.T) {
	dir := canned(t, "conformance 0 41\ngpt2 0 30\ntorch 0 20\nmfu 0 50\noffload 0 25\nranks 0 33\n", goodRun())
	out, rc := runVerify(t, nil, "summarize", dir)
	if rc != 0 {
		t.Fatalf("summarize a passing run: exit %d\n%s", rc, out)
	}
	// MFU by hand: N = 1018429440 - 2048·4096 = 1010040832, tokens 8192;
	// 6·N·8192 + 12·4·4096·2048·8192 = 4.9645e13 + 3.2985e12 = 5.2944e13
	// FLOP in the median 0.2 s: 264.7 TFLOP/s, 26.8 % of 989.
	for _, want := range []string{
		"conformance: ok (41 s); 3 tests passed, 0 failed\n",
		"gemm path: bf16 GEMMs: cuBLASLt /y/libcublasLt.so.13, fp32 accumulation\n",
		"kernels: kernel cache /root/.cache/strata/kernels: 0 of 1 modules read from it\n",
		"gpt2 step B=16 T=1024, strata: 0.6 s [ok (30 s)]\n",
		"gpt2 step B=16 T=1024, torch 2.5.1 bf16 autocast, sdpa true: 0.5 s [ok (20 s)]\n",
		"gpt2 strata/torch: 1.20 (target <= 1.5: met)\n",
		"gpt-7b shape, 4 layers, B=4 T=2048: step 0.200 s (median of steps 2-4), 264.7 TFLOP/s, MFU 26.8 % of 989 (target >= 45 %: MISSED)\n",
		"offload modes (resident, host, nvme): params bit-identical in 3 of 3 runs [ok (25 s)]\n", // dpu's update is another
		"host/resident step, exact overlap: 1.040 (0.520 / 0.500 s); nvme/resident 1.200 (target <= 1.10: met)\n",
		"host/resident step, dpu overlap: 1.020 (0.510 / 0.500 s); nvme/resident 1.160\n",
		"logical ranks: 2 ranks: 2/2 runs completed, bit-identical to run 1; collectives: rank-order\n",
		"logical ranks: 4 ranks, run 1: device allocations after step 1, per device: 0 0 0 0\n",
		"logical ranks: 1 rank, strata.deterministic false: completed; collectives: nccl\n",
		"logical ranks part: ok (33 s)\n",
		"result: pass\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}

	// A failing run: a hung gpt2 (no JSON), a failed test, a mode that differs, mfu not run.
	files := goodRun()
	files["gpt2.log"] = "SIGQUIT: quit\ngoroutine 1 [running]:\n"
	files["conformance.log"] += "--- FAIL: TestMatchesCPUBackend (1.00s)\nFAIL\n"
	files["offload.log"] = `{"runs":[` + offloadRun("resident", "", true, 0.5) + "," + offloadRun("host", "exact", true, 0.6) + "," +
		offloadRun("nvme", "exact", false, 0.7) + "," + offloadRun("host", "dpu", false, 0.55) + `]}`
	files["ranks.log"] = "== 2 ranks, run 1: HUNG after 15s; the goroutine dump\n== multirank summary\n" +
		"2 ranks: 0/2 runs completed, bit-identical to run 1; run 1 hung (goroutine dump in /o/multirank/n2-run1.log)\n"
	delete(files, "mfu/steps.jsonl")
	delete(files, "mfu/summary.json")
	dir = canned(t, "conformance 1 41\ngpt2 124 100\ntorch 0 20\noffload 0 25\nranks 1 40\n", files)
	out, rc = runVerify(t, []string{"PEAK_TFLOPS=500"}, "summarize", dir)
	if rc == 0 {
		t.Errorf("summarize a failing run: exit 0\n%s", out)
	}
	for _, want := range []string{
		"conformance: FAIL (exit 1, 41 s; see conformance.log); 3 tests passed, 1 failed\n",
		"gpt2 step B=16 T=1024, strata: ? s [TIMEOUT after 100 s (goroutine dump in gpt2.log)]\n",
		"gpt2 strata/torch: n/a\n",
		"gpt-7b shape, 4 layers: n/a [not run]\n",
		"offload modes (resident, host, nvme): 1 of 3 runs DIFFER [ok (25 s)]\n",
		"host/resident step, exact overlap: 1.200 (0.600 / 0.500 s); nvme/resident 1.400 (target <= 1.10: MISSED)\n",
		"logical ranks: 2 ranks: 0/2 runs completed, bit-identical to run 1; run 1 hung",
		"logical ranks part: FAIL (exit 1, 40 s; see ranks.log)\n",
		"result: FAIL\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// TestCudaVerifyTimeout runs one part for real on the CPU backend with a
// limit far below its run time: the part gets SIGQUIT, its log holds the
// goroutine dump, and the summary says TIMEOUT.
func TestCudaVerifyTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds strata")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "strata")
	build := exec.Command(goTool, "build", "-o", bin, "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, rc := runVerify(t, []string{"OUT=" + dir, "STRATA_BIN=" + bin, "CUDA_TEST=" + bin, "BACKEND=cpu", "T_GPT2=3"}, "--parts", "gpt2")
	if rc == 0 || !strings.Contains(out, "== gpt2: exit 124") || !strings.Contains(out, "gpt2 step B=16 T=1024, strata: ? s [TIMEOUT after ") {
		t.Errorf("a part past its limit: exit %d\n%s", rc, out)
	}
	log, err := os.ReadFile(filepath.Join(dir, "gpt2.log"))
	if err != nil || !strings.Contains(string(log), "SIGQUIT") || !strings.Contains(string(log), "goroutine ") {
		t.Errorf("gpt2.log holds no goroutine dump (%v):\n%.2000s", err, log)
	}
	if sum, err := os.ReadFile(filepath.Join(dir, "summary.txt")); err != nil || !strings.Contains(string(sum), "result: FAIL") {
		t.Errorf("summary.txt: %v\n%s", err, sum)
	}
	// The ranks part for real on the CPU backend (the tiny model: about a
	// second): device_check.sh's multirank through the part's command.
	out, rc = runVerify(t, []string{"OUT=" + dir, "STRATA_BIN=" + bin, "CUDA_TEST=" + bin, "BACKEND=cpu"}, "--parts", "ranks")
	if rc != 0 || !strings.Contains(out, "logical ranks: 4 ranks: 2/2 runs completed, bit-identical to run 1") || !strings.Contains(out, "result: pass") {
		t.Errorf("the ranks part on the CPU backend: exit %d\n%s", rc, out)
	}
}
