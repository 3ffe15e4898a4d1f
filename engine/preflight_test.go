package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/flock"
	"github.com/strata-ai/strata/internal/hosttest"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// newPreflightEngine is New for spec s on dir, with its devices, for tests
// that expect New to fail (the devices tell whether anything was taken).
func newPreflightEngine(t *testing.T, s tierSpec, dir string) (*Engine, []gpu.Device, error) {
	t.Helper()
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(t, testConfig(t, s.configJSON(dir)), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2})
	return e, cpu.Devices(devs), err
}

// nothingTaken fails the test if a device held memory at any time before
// a refused New returned (its peak: freed again is not enough).
func nothingTaken(t *testing.T, devs []gpu.Device) {
	t.Helper()
	for _, d := range devs {
		if ms := d.MemStats(); ms.PeakBytes != 0 {
			t.Errorf("%s was allocated before the refusal: %s", d.Name(), ms)
		}
	}
}

// TestHostBudgetPastMemAvailable: a strata.host_budget the host does not
// have (above MemAvailable, read here from a file of the test's) is refused
// by New before anything is allocated, with one error naming the key, the
// room and what to do; a budget that fits starts; without a budget, a pool
// the layout needs beyond MemAvailable is refused the same way. Before the check, the
// pinned pool faulted the budget in until the OOM killer ended the run.
func TestHostBudgetPastMemAvailable(t *testing.T) {
	meminfo := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(meminfo, []byte("MemTotal:       25165824 kB\nMemAvailable:      65536 kB\n"), 0o644); err != nil { // 64 MiB
		t.Fatal(err)
	}
	old := meminfoPath
	meminfoPath = meminfo
	defer func() { meminfoPath = old }()
	s := tierSpec{n: 2, param: "none", opt: "cpu", hostBudget: 1 << 30}
	_, devs, err := newPreflightEngine(t, s, "")
	want := "engine: strata.host_budget 1.00 GiB (pinned host memory, and "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "more than the host's available memory, 64.0 MiB (MemAvailable in "+meminfo+")") ||
		!strings.Contains(err.Error(), "lower strata.host_budget to at most ") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("host_budget 1 GiB on 64 MiB available: got %v\nwant %s...", err, want)
	}
	nothingTaken(t, devs)
	s.hostBudget = 48 << 20
	if _, _, err := newPreflightEngine(t, s, ""); err != nil {
		t.Fatalf("host_budget 48 MiB on 64 MiB available: %v", err)
	}
	// Without a host budget the pool is what the layout homes in host
	// RAM: more than MemAvailable (128 KiB here) is refused the same way,
	// naming the way out.
	if err := os.WriteFile(meminfo, []byte("MemTotal:       25165824 kB\nMemAvailable:        128 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.hostBudget = 0
	_, devs, err = newPreflightEngine(t, s, "")
	want = "engine: the tier store's pinned host memory, "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "more than the host's available memory, 128.0 KiB (MemAvailable in "+meminfo+")") ||
		!strings.Contains(err.Error(), "put the optimizer state on NVMe (offload_optimizer nvme) with strata.host_budget at most ") {
		t.Fatalf("no host_budget on 128 KiB available: got %v\nwant %s...", err, want)
	}
	nothingTaken(t, devs)
}

// TestStaleSwapFilesReclaimedAtStart: a run that starts on an nvme_path
// removes the swap files of killed runs there (no process holds their
// flock) and says what it got back in a note naming the path and the
// bytes; a swap file whose lock is held (here by the test, on a file it
// keeps open) is left alone. Before, they were only reported, and every
// crash left a full-size file behind.
func TestStaleSwapFilesReclaimedAtStart(t *testing.T) {
	nvmetest.Require(t)
	dir, err := filepath.EvalSymlinks(nvmetest.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	var stale []string
	for i := range 2 {
		p := filepath.Join(dir, fmt.Sprintf("strata-99999%d-00000000000%d.swap", i, i))
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		stale = append(stale, p)
	}
	held := filepath.Join(dir, "strata-999990-0000000000ff.swap")
	if err := os.WriteFile(held, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(held)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := flock.TryLock(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, p := range stale {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		want += st.Blocks * 512
	}
	e, _, err := newPreflightEngine(t, tierSpec{n: 1, param: "nvme", opt: "nvme"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("stale %s: %v, want removed", p, err)
		}
	}
	if _, err := os.Stat(held); err != nil {
		t.Errorf("the held swap file: %v, want it untouched", err)
	}
	note := fmt.Sprintf("nvme_path %s: removed 2 stale swap files of killed runs (no live process held their lock), reclaimed ", dir)
	found := false
	for _, n := range e.Notes() {
		if strings.HasPrefix(n, note) && strings.HasSuffix(n, fmt.Sprintf("(%d bytes)", want)) {
			found = true
		}
	}
	if !found {
		t.Errorf("notes %q\nwant one %q... (%d bytes)", e.Notes(), note, want)
	}
}

// wideShapeJSON is a model whose state on NVMe (about 20 MiB) a 2 MiB path
// cannot hold.
const wideShapeJSON = `{"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 256, "max_seq_len": 16}`

// TestSwapSpaceRefusedAtStart: an nvme_path with less free space than the
// run's swap takes there (a 2 MiB ext4 image, loop-mounted) refuses New
// before anything is allocated, naming the path, the need, the free space
// and what is reclaimable; no swap file is left there. Before, the swap was
// made after the devices and the pinned pool had been taken.
func TestSwapSpaceRefusedAtStart(t *testing.T) {
	dir := hosttest.SmallExt4(t, "2M")
	// A file of the path's own, not a swap file: it is neither reclaimed
	// nor counted.
	if err := os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, devs, err := newPreflightEngine(t, tierSpec{n: 1, param: "nvme", opt: "nvme", shapeJSON: wideShapeJSON}, dir)
	if err == nil {
		t.Fatal("a run on a 2 MiB path started")
	}
	for _, w := range []string{"engine: nvme: swap: " + dir + " needs ", " free, ", " reclaimable (no stale swap files there"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("got %v\nwant %q in it", err, w)
		}
	}
	nothingTaken(t, devs)
	if names, _ := filepath.Glob(filepath.Join(dir, "*.swap")); len(names) != 0 {
		t.Errorf("left on the path: %v", names)
	}
}
