package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/internal/mpitest"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/safetensors"
)

// The chaos tests: runs killed (SIGKILL) or starved of disk at random
// moments, resumed until done, end with the weights and losses of the
// uninterrupted run, and leave no swap file behind. The moments come from
// a seeded generator whose seed each test logs; STRATA_CHAOS_SEED=N runs
// a failure again.

const (
	chaosSteps = 16 // every run's --steps
	chaosKills = 8  // the kills of a test; then the run goes to its end
)

// chaosRand is the test's generator, seeded from STRATA_CHAOS_SEED or the
// clock, its seed logged.
func chaosRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := time.Now().UnixNano()
	if s := os.Getenv("STRATA_CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("STRATA_CHAOS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (STRATA_CHAOS_SEED=%d runs these moments again)", seed, seed)
	return rand.New(rand.NewSource(seed))
}

// swapFiles are the swap files under dir (nvme.SwapFileGlob and the
// single name of earlier versions).
func swapFiles(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "strata") && strings.HasSuffix(d.Name(), ".swap") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// completeLines are the lines of path that end with a newline.
func completeLines(path string) []string {
	b, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(b), "\n")
	if n := len(lines); n > 0 && !strings.HasSuffix(lines[n-1], "\n") {
		lines = lines[:n-1]
	}
	return lines
}

// newSteps counts the lines of steps.jsonl that the run started after
// stale (the file as a round began) wrote: those past base (the step it
// resumed from) that differ from stale's (a resumed run rewrites the file
// with its lines up to base, then appends).
func newSteps(path string, stale []string, base int) int {
	n := 0
	for i, l := range completeLines(path) {
		if i >= base && (i >= len(stale) || l != stale[i]) {
			n++
		}
	}
	return n
}

// chaosRound is what a round starts from: the run's latest checkpoint (a
// resume) or nothing (a fresh run in a removed directory).
func chaosRound(t *testing.T, run string) (step int64, resume bool) {
	t.Helper()
	m, _, err := checkpoint.ReadManifest(filepath.Join(run, "checkpoints"))
	if err != nil {
		if err := os.RemoveAll(run); err != nil {
			t.Fatal(err)
		}
		return 0, false
	}
	return m.Step, true
}

// roundStart says how a round started, for its log line.
func roundStart(base int64, resume bool) string {
	switch {
	case !resume:
		return "fresh"
	case base >= chaosSteps:
		// The last round was killed after the checkpoint of its last
		// step, before its outputs (TestChaosKilledBeforeOutputs).
		return fmt.Sprintf("resumed from step %d, the last, its outputs not written", base)
	}
	return fmt.Sprintf("resumed from step %d", base)
}

// chaosArgs are the round's arguments of strata train.
func chaosArgs(cfg, run string, resume bool, devices string) []string {
	a := []string{"train", "--devices", devices, "--steps", strconv.Itoa(chaosSteps), "--save-every", "2", "--keep", "2", "--no-progress", "--out", run}
	if resume {
		return append(a, "--resume", run)
	}
	return append(a, "--config", cfg)
}

// killPoint is a random moment of a round that resumed from step base:
// after 0-2 new steps (fewer than the steps left) and a delay of 0-99 ms,
// which lands in the start-up, a step or a save.
func killPoint(rng *rand.Rand, base int64) (int, time.Duration) {
	return rng.Intn(max(1, min(3, chaosSteps-int(base)))), time.Duration(rng.Intn(100)) * time.Millisecond
}

// waitKillPoint waits until the run has written k new steps (newSteps) and
// then delay, or until ended says it is over; it says whether the run is
// still going.
func waitKillPoint(t *testing.T, run string, stale []string, base, k int, delay time.Duration, ended func() bool) bool {
	t.Helper()
	jsonl := filepath.Join(run, "steps.jsonl")
	for deadline := time.Now().Add(3 * time.Minute); newSteps(jsonl, stale, base) < k; time.Sleep(2 * time.Millisecond) {
		if ended() {
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run wrote no %d new steps in 3 minutes", k)
		}
	}
	for end := time.Now().Add(delay); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if ended() {
			return false
		}
	}
	return !ended()
}

// alive says whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return !(i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X'))
}

// chaosReference is the uninterrupted run (in this process), with devices
// devices.
func chaosReference(t *testing.T, cfg, devices string) string {
	t.Helper()
	ref := filepath.Join(t.TempDir(), "ref")
	if _, stderr, err := run(t, chaosArgs(cfg, ref, false, devices)...); err != nil {
		t.Fatalf("the uninterrupted run: %v\n%s", err, stderr)
	}
	return ref
}

// sameAsReference: the run's weights are the reference's, byte for byte,
// and steps.jsonl has every step, each with the reference's loss.
func sameAsReference(t *testing.T, run, ref string) {
	t.Helper()
	sameWeights(t, "the killed and resumed run against the uninterrupted one", run, ref)
	got, want := stepLosses(t, run), stepLosses(t, ref)
	if len(got) != chaosSteps || len(want) != chaosSteps {
		t.Errorf("steps.jsonl: %d steps, the uninterrupted run's %d, want %d each", len(got), len(want), chaosSteps)
	}
	for s, l := range want {
		if g, ok := got[s]; !ok || g != l {
			t.Errorf("step %d: loss %v (present %t), the uninterrupted run's %v", s, g, ok, l)
		}
	}
}

// noSwapLeft: no swap file is left under nv.
func noSwapLeft(t *testing.T, nv string) {
	t.Helper()
	if left := swapFiles(nv); len(left) > 0 {
		t.Errorf("swap files left after the last run ended: %v", left)
	}
}

// TestChaosJobKills: a 2-process job (mpirun -np 2, --devices 2), stage 3
// with params and optimizer state on NVMe, saving every 2 steps: one of
// its two processes, chosen at random, is killed (SIGKILL) at a random
// moment (after a random number of new steps, 0-2, and a random delay:
// start-up, a step, a save), the job resumed from its latest checkpoint
// (or started again without one), chaosKills times; then the job runs to
// its end. Its weights are byte-identical to an uninterrupted 1-process
// --devices 4 run's, every step's loss equal, and no swap file is left in
// the NVMe directory.
func TestChaosJobKills(t *testing.T) {
	mpitest.Need(t)
	rng := chaosRand(t)
	nv := nvmetest.Dir(t)
	cfg := jobConfig(t, 3, "nvme", "nvme", nv)
	ref := chaosReference(t, cfg, "4")
	noSwapLeft(t, nv)
	run := filepath.Join(t.TempDir(), "run")
	for round := 1; ; round++ {
		if round > 4*chaosKills {
			t.Fatalf("%d rounds without an end", round-1)
		}
		base, resume := chaosRound(t, run)
		stale := completeLines(filepath.Join(run, "steps.jsonl"))
		a, _ := json.Marshal(chaosArgs(cfg, run, resume, "2"))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		t.Cleanup(cancel) // a test that fails mid-round ends its job
		cmd := mpitest.Command(ctx, 2, []string{"STRATA_TEST_MAIN=" + string(a)}, os.Args[0])
		log := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			cancel()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var waitErr error
		ended := func() bool {
			select {
			case waitErr = <-done:
				done = nil
				return true
			default:
				return done == nil
			}
		}
		k, delay := killPoint(rng, base)
		victim := -1
		var kids []int
		if round <= chaosKills && waitKillPoint(t, run, stale, int(base), k, delay, ended) {
			// Its two processes (mpirun may not have started them yet).
			for deadline := time.Now().Add(time.Minute); len(kids) < 2 && !ended(); time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: mpirun started no 2 processes in a minute: %v\n%s", round, kids, log.String())
				}
				out, _ := exec.Command("pgrep", "-P", strconv.Itoa(cmd.Process.Pid)).Output()
				kids = kids[:0]
				for _, f := range strings.Fields(string(out)) {
					pid, _ := strconv.Atoi(f)
					kids = append(kids, pid)
				}
			}
			if len(kids) > 0 && !ended() {
				victim = kids[rng.Intn(len(kids))]
				syscall.Kill(victim, syscall.SIGKILL)
			}
		}
		if done != nil {
			waitErr = <-done
		}
		cancel()
		for _, pid := range kids {
			// mpirun has ended: none of its processes may outlive it and
			// write into the run directory beside the next round.
			for deadline := time.Now().Add(30 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Fatalf("round %d: process %d outlived mpirun by 30 s", round, pid)
				}
			}
		}
		at := "no checkpoint"
		if m, _, err := checkpoint.ReadManifest(filepath.Join(run, "checkpoints")); err == nil {
			at = fmt.Sprintf("checkpoint of step %d", m.Step)
		}
		how := roundStart(base, resume)
		if victim < 0 {
			if waitErr != nil {
				t.Fatalf("round %d (%s): the job failed without a kill: %v\n%s", round, how, waitErr, log.String())
			}
			t.Logf("round %d (%s): ran to its end", round, how)
			break
		}
		if waitErr == nil {
			t.Logf("round %d (%s): killed process %d of %v after %d new steps and %s, but the job had ended well", round, how, victim, kids, k, delay)
			break
		}
		t.Logf("round %d (%s): killed process %d of %v after %d new steps and %s; then: %s, %d swap files", round, how, victim, kids, k, delay, at, len(swapFiles(nv)))
	}
	sameAsReference(t, run, ref)
	noSwapLeft(t, nv)
}

// TestChaosSingleKills: a single-process run (--devices 2), stage 3 with
// params and optimizer state on NVMe, killed (SIGKILL) at random moments
// and resumed from its latest checkpoint chaosKills times, then run to its
// end: its weights are byte-identical to the uninterrupted run's, every
// step's loss equal, and no swap file is left in the NVMe directory.
func TestChaosSingleKills(t *testing.T) {
	rng := chaosRand(t)
	nv := nvmetest.Dir(t)
	cfg := jobConfig(t, 3, "nvme", "nvme", nv)
	ref := chaosReference(t, cfg, "2")
	noSwapLeft(t, nv)
	run := filepath.Join(t.TempDir(), "run")
	for round := 1; ; round++ {
		if round > 4*chaosKills {
			t.Fatalf("%d rounds without an end", round-1)
		}
		base, resume := chaosRound(t, run)
		stale := completeLines(filepath.Join(run, "steps.jsonl"))
		c := startChild(t, "", "", chaosArgs(cfg, run, resume, "2")...)
		k, delay := killPoint(rng, base)
		killed := round <= chaosKills && waitKillPoint(t, run, stale, int(base), k, delay, c.ended)
		if killed {
			c.cmd.Process.Kill()
		}
		status := c.wait()
		how := roundStart(base, resume)
		if !killed || status == 0 {
			if status != 0 {
				t.Fatalf("round %d (%s): the run failed without a kill: exit status %d\n%s", round, how, status, c.stderr.String())
			}
			t.Logf("round %d (%s): ran to its end", round, how)
			break
		}
		at := "no checkpoint"
		if m, _, err := checkpoint.ReadManifest(filepath.Join(run, "checkpoints")); err == nil {
			at = fmt.Sprintf("checkpoint of step %d", m.Step)
		}
		t.Logf("round %d (%s): killed after %d new steps and %s; then: %s, %d swap files", round, how, k, delay, at, len(swapFiles(nv)))
	}
	sameAsReference(t, run, ref)
	noSwapLeft(t, nv)
}

// TestChaosDiskFills: a single-process run saving every 2 steps with --out
// on a small filesystem that fills (to a random few bytes free) at a
// random step: the run ends well, or fails with an error naming the full
// disk; either way the newest complete checkpoint loads and holds a step
// at least that of the last one saved before the fill, and a
// model.safetensors, if any, is whole. Once the space is freed, the run
// resumed to its end has the weights of the uninterrupted run, byte for
// byte, and every step's loss.
func TestChaosDiskFills(t *testing.T) {
	rng := chaosRand(t)
	cfg := tinyConfig(t)
	args := func(run string, more ...string) []string {
		return trainArgs(cfg, append([]string{"--steps", strconv.Itoa(chaosSteps), "--save-every", "2", "--keep", "2", "--out", run}, more...)...)
	}
	ref := filepath.Join(t.TempDir(), "ref")
	if _, stderr, err := runApp(t, args(ref)...); err != nil {
		t.Fatalf("the uninterrupted run: %v\n%s", err, stderr)
	}
	for round := 1; round <= 5; round++ {
		disk := t.TempDir()
		mountOrSkip(t, disk, "-t", "tmpfs", "-o", "size=8m", "tmpfs")
		run := filepath.Join(disk, "run")
		ck := filepath.Join(run, "checkpoints")
		at := 1 + rng.Intn(chaosSteps)
		free := []int64{0, 4096, 64 << 10, 256 << 10}[rng.Intn(4)]
		steps, before := 0, int64(0)
		var fillErr error
		testHook = func(p string) error {
			if p == "step" {
				if steps++; steps == at {
					if m, _, err := checkpoint.ReadManifest(ck); err == nil {
						before = m.Step
					}
					fillErr = fillTo(disk, free)
				}
			}
			return nil
		}
		_, stderr, err := runApp(t, args(run)...)
		testHook = nil
		if fillErr != nil {
			t.Fatalf("round %d: fill: %v", round, fillErr)
		}
		what := fmt.Sprintf("round %d (the disk filled to %d bytes free after step %d)", round, free, at)
		if err != nil && !strings.Contains(err.Error(), "no space left on device") {
			t.Errorf("%s: the run failed with an error that does not name the full disk: %v\n%s", what, err, stderr)
		}
		m, _, merr := checkpoint.ReadManifest(ck)
		if merr != nil && before == 0 {
			// Filled before the first save: nothing to resume; the run
			// starts again once the space is freed.
			t.Logf("%s: %v; no checkpoint (none before the fill either)", what, err)
			if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
				t.Fatal(err)
			}
			if _, stderr, err := runApp(t, args(run, "--overwrite")...); err != nil {
				t.Fatalf("%s: the run again once the space is freed: %v\n%s", what, err, stderr)
			}
			sameAsReference(t, run, ref)
			continue
		}
		if merr != nil {
			t.Fatalf("%s: no checkpoint (step %d before the fill): %v\n%s", what, before, merr, stderr)
		}
		if _, lerr := checkpoint.Load(ck); lerr != nil {
			t.Errorf("%s: the latest checkpoint (step %d) does not load: %v", what, m.Step, lerr)
		}
		if m.Step < before {
			t.Errorf("%s: latest checkpoint of step %d, before the fill it was step %d", what, m.Step, before)
		}
		if f, oerr := safetensors.Open(filepath.Join(run, "model.safetensors")); oerr == nil {
			for _, ti := range f.Header.Tensors {
				if rerr := f.ReadTensor(ti, make([]byte, ti.SizeBytes())); rerr != nil {
					t.Errorf("%s: model.safetensors: %v", what, rerr)
					break
				}
			}
			f.Close()
		} else if !errors.Is(oerr, fs.ErrNotExist) {
			t.Errorf("%s: model.safetensors is not whole: %v", what, oerr)
		}
		result := "ended well"
		if err != nil {
			result = "failed: " + err.Error()
		}
		t.Logf("%s: %s; latest checkpoint of step %d (step %d before the fill)", what, result, m.Step, before)
		if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
			t.Fatal(err)
		}
		if m.Step < chaosSteps {
			if _, stderr, err := runApp(t, args(run, "--resume", run)...); err != nil {
				t.Fatalf("%s: the resume once the space is freed: %v\n%s", what, err, stderr)
			}
		}
		sameAsReference(t, run, ref)
	}
}

// TestChaosKilledBeforeOutputs: the one moment of a run that its random
// kills seldom hit, made sure of: a run killed after the checkpoint of its
// last step, before it wrote model.safetensors and summary.json (its
// outputs). The go-on command, `strata train --resume RUN --out RUN
// --steps N`, ends well with the weights of the uninterrupted run.
func TestChaosKilledBeforeOutputs(t *testing.T) {
	cfg := tinyConfig(t)
	args := func(run string, more ...string) []string {
		return trainArgs(cfg, append([]string{"--steps", "6", "--save-every", "2", "--out", run}, more...)...)
	}
	ref := filepath.Join(t.TempDir(), "ref")
	if _, stderr, err := runApp(t, args(ref)...); err != nil {
		t.Fatalf("the uninterrupted run: %v\n%s", err, stderr)
	}
	run := filepath.Join(t.TempDir(), "run")
	c := startChild(t, "outputs#1", "", args(run)...)
	c.waitAt(t, "outputs")
	c.cmd.Process.Kill()
	c.wait()
	if m, _, err := checkpoint.ReadManifest(filepath.Join(run, "checkpoints")); err != nil || m.Step != 6 {
		t.Fatalf("killed before its outputs: checkpoint %v %v, want step 6", m, err)
	}
	if _, stderr, err := runApp(t, args(run, "--resume", run)...); err != nil {
		t.Fatalf("the resume of a run killed after the checkpoint of its last step, before its outputs: %v\n%s", err, stderr)
	}
	sameWeights(t, "resumed after a kill before the outputs", run, ref)
}
