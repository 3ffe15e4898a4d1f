package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeviceScript needs no GPU: device_check.sh parses (sh -n, and bash
// -n where bash is installed), and its multirank mode runs end to end on
// the CPU backend (two runs of two ranks, two steps, the NCCL config on
// one rank; the GPU-only parts off), so that the flags, the config it
// writes, the fingerprint of each run and the report are right before a
// device session spends its minutes on them.
func TestDeviceScript(t *testing.T) {
	// Read here too, so that go test's cache knows the result depends on it.
	if _, err := os.ReadFile("device_check.sh"); err != nil {
		t.Fatal(err)
	}
	for _, sh := range []string{"sh", "bash"} {
		if _, err := exec.LookPath(sh); err != nil {
			if sh == "sh" {
				t.Fatal("no sh")
			}
			continue
		}
		if out, err := exec.Command(sh, "-n", "device_check.sh").CombinedOutput(); err != nil {
			t.Errorf("%s -n device_check.sh: %v\n%s", sh, err, out)
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to build strata for the dry run: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "strata")
	build := exec.Command(goTool, "build", "-o", bin, "../..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	run := exec.Command("sh", "device_check.sh", "multirank")
	run.Env = append(os.Environ(), "STRATA_BIN="+bin, "BACKEND=cpu", "RANKS=2", "RUNS=2", "STEPS=2", "RUN_TIMEOUT=300",
		"CUDA_TEST="+filepath.Join(dir, "none"), "HANG=0", "OUT="+dir)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("device_check.sh multirank on the cpu backend: %v\n%s", err, out)
	}
	for _, want := range []string{
		"2 ranks: 2/2 runs completed, bit-identical to run 1; collectives: rank-order\n",
		"1 rank, strata.deterministic false: completed; collectives: rank-order\n",
		"collective tests: skipped, no ",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	fp, err := os.ReadFile(filepath.Join(dir, "multirank", "n2-run2.fp"))
	if err != nil || len(strings.Split(strings.TrimSpace(string(fp)), "\n")) != 2 {
		t.Errorf("run 2's fingerprint: %q (%v)", fp, err)
	}
}
