package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// underAddressSpaceLimit runs `strata args...` (this test binary, as
// TestMain runs it) in a child whose RLIMIT_AS is limitKiB (`ulimit -v`
// in a shell before it), and returns its exit status and stderr.
func underAddressSpaceLimit(t *testing.T, limitKiB int64, args ...string) (int, string) {
	t.Helper()
	if raceDetector {
		t.Skip("the race detector's shadow memory reserves terabytes of address space: no binary built with it starts under an RLIMIT_AS")
	}
	a, _ := json.Marshal(args)
	cmd := exec.Command("/bin/sh", "-c", `ulimit -v "$1" && exec "$2"`, "sh", strconv.FormatInt(limitKiB, 10), os.Args[0])
	cmd.Env = append(os.Environ(), "STRATA_TEST_MAIN="+string(a))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// TestAddressSpaceLimit: under an RLIMIT_AS (`ulimit -v`) too small for
// the run, `strata train` exits 1 with one line naming RLIMIT_AS, its
// value and the fix, not MemAvailable or free RAM, and without the Go
// runtime's stack traces: a limit that leaves the process less than the
// threads' and the heap's headroom (1.65 GB: the Go runtime starts, and
// holds about 1.5 GB of it), a strata.host_budget the pinned pool would
// map past the limit (2 GiB under 3 GB), the CPU backend's devices
// likewise. Before the checks the first died in the Go runtime ("fatal
// error: out of memory", "pthread_create failed", with its goroutines),
// the second said "is it larger than free RAM?".
func TestAddressSpaceLimit(t *testing.T) {
	hostBudget := writeFile(t, "host.json", `{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 5, "host_budget": "2GiB"}
}`)
	devices := writeFile(t, "devices.json", `{
  "train_micro_batch_size_per_gpu": 1,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 5, "hbm_bytes": "2GiB"}
}`)
	for _, tc := range []struct {
		name     string
		limitKiB int64
		args     []string
		what     string
	}{
		{"headroom", 1_650_000, []string{"train", "--no-progress", "--steps", "1"}, "but `strata train` needs 512.0 MiB more (for its threads and the heap)"},
		{"host_budget", 3_000_000, []string{"train", "--no-progress", "--steps", "1", "--config", hostBudget}, "but strata.host_budget 2.00 GiB (pinned host memory, and "},
		{"hbm_bytes", 3_000_000, []string{"train", "--no-progress", "--steps", "1", "--config", devices}, "but 2 devices × hbm_bytes 2.00 GiB (the CPU backend's devices live in host RAM) needs 4.50 GiB more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, stderr := underAddressSpaceLimit(t, tc.limitKiB, tc.args...)
			if st != 1 || strings.Count(stderr, "\n") != 1 {
				t.Fatalf("exit status %d, stderr:\n%s\nwant 1 and one line", st, stderr)
			}
			limit := "strata train: the address-space limit RLIMIT_AS (ulimit -v) is " + formatGiB(tc.limitKiB<<10) + ", and the process holds "
			if !strings.HasPrefix(stderr, limit) {
				t.Errorf("%q: want it to begin %q", stderr, limit)
			}
			for _, w := range []string{tc.what, "raise the limit to at least ", "`ulimit -v unlimited`", "GOMEMLIMIT"} {
				if !strings.Contains(stderr, w) {
					t.Errorf("%q: want %q in it", stderr, w)
				}
			}
			for _, bad := range []string{"MemAvailable", "free RAM", "goroutine", "fatal error", "runtime stack", "pthread_create"} {
				if strings.Contains(stderr, bad) {
					t.Errorf("%q: names %q", stderr, bad)
				}
			}
		})
	}
}

// formatGiB is units.FormatBytes of n, for a size of a GiB or more.
func formatGiB(n int64) string {
	return strconv.FormatFloat(float64(n)/(1<<30), 'f', 2, 64) + " GiB"
}
