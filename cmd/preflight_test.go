package cmd

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestTrainHostBudgetPastMemAvailable: `strata train` with a
// strata.host_budget above what the host has (twice MemAvailable and a
// GiB: more than its RAM) exits 1 with one line naming the key, the room
// and what to do, before anything is allocated. Before the check the
// pinned pool faulted the budget in until the OOM killer ended the run
// (exit 137, no message); that is not reproduced here, for the sake of the
// machine.
func TestTrainHostBudgetPastMemAvailable(t *testing.T) {
	avail, ok := hostmem.Available(hostmem.MeminfoPath)
	if !ok {
		t.Skipf("no MemAvailable in %s on this system", hostmem.MeminfoPath)
	}
	budget := 2*avail + 1<<30
	cfg := writeFile(t, "cfg.json", `{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 5, "host_budget": `+strconv.FormatInt(budget, 10)+`}
}`)
	var out, errOut, line strings.Builder
	path, err := execute([]string{"strata", "train", "--no-progress", "--steps", "1", "--config", cfg}, &out, &errOut)
	if st := printError(path, err, &line); st != 1 {
		t.Fatalf("exit status %d, want 1 (%v)", st, err)
	}
	l := line.String()
	if strings.Count(l, "\n") != 1 || !strings.HasPrefix(l, "strata train: strata.host_budget ") {
		t.Errorf("want one line, \"strata train: strata.host_budget ...\", got %q", l)
	}
	for _, w := range []string{"is more than the host's available memory", "(MemAvailable in /proc/meminfo)", "lower strata.host_budget to at most"} {
		if !strings.Contains(l, w) {
			t.Errorf("%q: want %q in it", l, w)
		}
	}
}

// TestTrainReclaimsStaleSwapFiles: `strata train` on an nvme_path removes
// the swap file a killed run left there (no process holds its lock) and
// prints a note naming the path and the bytes it got back.
func TestTrainReclaimsStaleSwapFiles(t *testing.T) {
	nvmetest.Require(t)
	dir, err := filepath.EvalSymlinks(nvmetest.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "strata-999999-00000000abcd.swap")
	if err := os.WriteFile(stale, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "cfg.json", `{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "`+dir+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+dir+`"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 5}
}`)
	_, errOut, err := run(t, "train", "--no-progress", "--steps", "1", "--config", cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale swap file: %v, want removed", err)
	}
	want := "note: nvme_path " + dir + ": removed 1 stale swap files of killed runs (no live process held their lock), reclaimed "
	if !strings.Contains(errOut, want) {
		t.Errorf("stderr %s\nwant %q", errOut, want)
	}
}

// TestTrainRefusesShortSwapPath: `strata train` on an nvme_path with less
// free space than the run's swap takes there (a 2 MiB ext4 image,
// loop-mounted) exits 1 with one line naming the path, the need, the free
// space and what is reclaimable, and leaves no swap file there.
func TestTrainRefusesShortSwapPath(t *testing.T) {
	dir := hosttest.SmallExt4(t, "2M")
	cfg := writeFile(t, "cfg.json", `{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "`+dir+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+dir+`"}},
  "strata": {"model": "small", "devices": 2, "seq_len": 16, "seed": 5}
}`)
	var out, errOut, line strings.Builder
	path, err := execute([]string{"strata", "train", "--no-progress", "--steps", "1", "--config", cfg}, &out, &errOut)
	if st := printError(path, err, &line); st != 1 {
		t.Fatalf("exit status %d, want 1 (%v)", st, err)
	}
	l := line.String()
	if strings.Count(l, "\n") != 1 || !strings.HasPrefix(l, "strata train: swap: "+dir+" needs ") ||
		!strings.Contains(l, " free, 0 B reclaimable (no stale swap files there") {
		t.Errorf("want one line \"strata train: swap: %s needs ... free, 0 B reclaimable ...\", got %q", dir, l)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "*.swap")); len(names) != 0 {
		t.Errorf("left on the path: %v", names)
	}
}
