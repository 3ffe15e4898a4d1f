package cmd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// tinyConfig is a one-device run of the tiny model, fast enough for a
// child process per case.
func tinyConfig(t *testing.T) string {
	return writeFile(t, "tiny.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16, "seed": 5}
}`)
}

// trainArgs are the arguments of a tiny run.
func trainArgs(cfg string, args ...string) []string {
	return append([]string{"train", "--no-progress", "--data", "../testdata/train/corpus.txt", "--config", cfg}, args...)
}

// snapshot is every file under dir with its bytes.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			out[strings.TrimPrefix(p, dir)] = string(b)
		}
		return nil
	})
	return out
}

func sameFiles(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s changed", what, k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok && !strings.HasSuffix(k, lockFileName) {
			t.Errorf("%s: %s appeared", what, k)
		}
	}
}

// TestRunDirBelongsToOneRun: a fresh run into a used --out, or into a
// directory holding someone else's config.json and model.safetensors, is
// refused and changes nothing; with --overwrite it runs, and its pruning
// leaves the earlier run's checkpoints alone (a checkpoint name they hold
// is not reused), and a resume of the new run goes on from its own latest.
func TestRunDirBelongsToOneRun(t *testing.T) {
	cfg := tinyConfig(t)
	a := t.TempDir()
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "4", "--out", a, "--save-every", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	before := snapshot(t, a)
	_, _, err := runApp(t, trainArgs(cfg, "--steps", "3", "--out", a)...)
	for _, w := range []string{"--out " + a + " is not empty", "another run", "--resume " + a + " --out " + a, "--overwrite"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("a fresh run into a used --out: %v, want an error with %q", err, w)
		}
	}
	sameFiles(t, "after the refused run", snapshot(t, a), before)

	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "config.json"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(other, "model.safetensors"), []byte("weights"), 0o644)
	theirs := snapshot(t, other)
	_, _, err = runApp(t, trainArgs(cfg, "--steps", "2", "--out", other)...)
	if err == nil || !strings.Contains(err.Error(), "not a Strata run's") || !strings.Contains(err.Error(), "config.json, model.safetensors") {
		t.Errorf("a run into someone else's files: %v", err)
	}
	sameFiles(t, "someone else's files", snapshot(t, other), theirs)

	// --overwrite: --keep 1 would prune every other checkpoint; run A's stay.
	_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "3", "--out", a, "--save-every", "1", "--keep", "1", "--overwrite")...)
	if err != nil {
		t.Fatalf("--overwrite: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "its checkpoints stay") {
		t.Errorf("--overwrite says nothing:\n%s", stderr)
	}
	if got := len(stepLosses(t, a)); got != 3 {
		t.Errorf("steps.jsonl after --overwrite has %d lines, want the new run's 3", got)
	}
	ck := filepath.Join(a, "checkpoints")
	for _, name := range []string{"step-00000002", "step-00000004"} {
		if before["/checkpoints/"+name+"/manifest.json"] != snapshot(t, a)["/checkpoints/"+name+"/manifest.json"] {
			t.Errorf("the earlier run's %s was touched", name)
		}
	}
	ls, err := checkpoint.List(ck)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Latest != "step-00000003" || strings.Join(ls.Names(), ",") != "step-00000002,step-00000003,step-00000004" {
		t.Errorf("after --overwrite: checkpoints %v latest %q, want the earlier run's 2 and 4 and the new run's 3", ls.Names(), ls.Latest)
	}
	_, stderr, err = runApp(t, trainArgs(cfg, "--steps", "5", "--resume", a, "--out", a, "--save-every", "1", "--keep", "1")...)
	if err != nil || !strings.Contains(stderr, "resumed from step 3") {
		t.Fatalf("resume of the new run: %v\n%s", err, stderr)
	}
	// Its step 4 was saved as step-00000004.1 (run A holds step-00000004),
	// then pruned (--keep 1) when step 5 was saved; run A's stay.
	if ls, _ = checkpoint.List(ck); strings.Join(ls.Names(), ",") != "step-00000002,step-00000004,step-00000005" || ls.Latest != "step-00000005" {
		t.Errorf("after the resume: checkpoints %v latest %q, want the earlier run's 2 and 4 and the new run's 5", ls.Names(), ls.Latest)
	}
	if !strings.Contains(stderr, "step-00000004.1") {
		t.Errorf("the new run's step 4 was not saved beside the earlier run's:\n%s", stderr)
	}
}

// TestRunDirLock: two processes on one --out: while one runs (a child
// process blocked at start-up, the directory locked), another is refused
// naming its pid; once the first is killed, the directory is free.
func TestRunDirLock(t *testing.T) {
	cfg := tinyConfig(t)
	dir := t.TempDir()
	c := startChild(t, "start-up#1", "", trainArgs(cfg, "--steps", "100", "--out", dir)...)
	c.waitAt(t, "start-up")
	_, _, err := runApp(t, trainArgs(cfg, "--steps", "2", "--out", dir)...)
	if w := fmt.Sprintf("is in use by another run (pid %d", c.cmd.Process.Pid); err == nil || !strings.Contains(err.Error(), w) {
		t.Errorf("a second run on a locked --out: %v, want %q", err, w)
	}
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.wait()
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "2", "--out", dir)...); err != nil {
		t.Errorf("after the holder was killed: %v\n%s", err, stderr)
	}
}

// TestTrainKillAtEveryPoint: a real `strata train --save-every 2 --keep 2`
// process is killed (SIGKILL) at every point of its third save (step 6)
// and of the pruning that follows it; each time the run resumed into its
// directory ends with the losses of an uninterrupted run, bit for bit,
// with no incomplete checkpoint left to report.
func TestTrainKillAtEveryPoint(t *testing.T) {
	cfg := tinyConfig(t)
	full := t.TempDir()
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "8", "--out", full)...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	want := stepLosses(t, full)
	for _, point := range []string{"write rank-00000.safetensors#3", "manifest#3", "rename#3", "latest#3",
		"prune step-00000002#1", "remove .tmp-prune-step-00000002#1"} {
		t.Run(point, func(t *testing.T) {
			dir := t.TempDir()
			c := startChild(t, point, "", trainArgs(cfg, "--steps", "8", "--out", dir, "--save-every", "2", "--keep", "2")...)
			c.waitAt(t, strings.Split(point, "#")[0])
			c.cmd.Process.Signal(syscall.SIGKILL)
			c.wait()
			_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "8", "--resume", dir, "--out", dir)...)
			if err != nil {
				t.Fatalf("resume after a kill at %q: %v\n%s", point, err, stderr)
			}
			if strings.Contains(stderr, "incomplete") {
				t.Errorf("kill at %q left an incomplete checkpoint:\n%s", point, stderr)
			}
			sameLosses(t, "killed at "+point+" and resumed", stepLosses(t, dir), want, 1, 8)
		})
	}
}

// TestSignals: SIGTERM says at once (the child is blocked inside a save)
// what it will do, and the run exits 143 after saving the step it named;
// a second SIGINT during a save says what survives and aborts it (130),
// and the run resumes from that checkpoint; SIGINT at start-up exits 130
// leaving no swap file and nothing in --out.
func TestSignals(t *testing.T) {
	cfg := tinyConfig(t)
	t.Run("sigterm", func(t *testing.T) {
		dir, goFile := t.TempDir(), filepath.Join(t.TempDir(), "go")
		c := startChild(t, "manifest#2", goFile, trainArgs(cfg, "--steps", "100000", "--out", dir, "--save-every", "2")...)
		c.waitAt(t, "manifest") // inside the save of step 4
		c.cmd.Process.Signal(syscall.SIGTERM)
		c.waitStderr(t, "stopping after step 5, then saving a checkpoint to "+filepath.Join(dir, "checkpoints"))
		c.waitStderr(t, "another SIGTERM aborts the save")
		os.WriteFile(goFile, nil, 0o644)
		if st := c.wait(); st != 143 {
			t.Errorf("SIGTERM: exit status %d, want 143\n%s", st, c.stderr.String())
		}
		if !strings.Contains(c.stderr.String(), "stopped after step 5 of 100000") {
			t.Errorf("stderr:\n%s", c.stderr.String())
		}
		if m, _, err := checkpoint.ReadManifest(filepath.Join(dir, "checkpoints")); err != nil || m.Step != 5 {
			t.Errorf("latest after SIGTERM: %v %v, want step 5", m, err)
		}
	})
	t.Run("second sigint aborts the save", func(t *testing.T) {
		dir := t.TempDir()
		c := startChild(t, "manifest#2", "", trainArgs(cfg, "--steps", "100000", "--out", dir, "--save-every", "3")...)
		for {
			b, _ := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
			if bytes.Count(b, []byte("\n")) >= 4 { // the save of step 3 is done
				break
			}
			if c.ended() {
				t.Fatalf("the child ended before step 4:\n%s", c.stderr.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		c.cmd.Process.Signal(syscall.SIGINT)
		c.waitAt(t, "manifest") // the next save: the one of the stop
		c.waitStderr(t, "Ctrl-C again aborts the save")
		c.cmd.Process.Signal(syscall.SIGINT)
		ck := filepath.Join(dir, "checkpoints")
		c.waitStderr(t, "the checkpoint being saved is aborted; what survives is the complete checkpoint of step 3, "+filepath.Join(ck, "step-00000003"))
		if st := c.wait(); st != 130 {
			t.Errorf("second SIGINT: exit status %d, want 130\n%s", st, c.stderr.String())
		}
		_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "5", "--resume", dir, "--out", dir)...)
		if err != nil || !strings.Contains(stderr, "resumed from step 3") {
			t.Errorf("resume after the aborted save: %v\n%s", err, stderr)
		}
	})
	t.Run("sigint at start-up", func(t *testing.T) {
		nv, dir, goFile := nvmetest.Dir(t), t.TempDir(), filepath.Join(t.TempDir(), "go")
		ncfg := writeFile(t, "nvme.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "`+nv+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+nv+`"}},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16}
}`)
		c := startChild(t, "start-up#1", goFile, "train", "--no-progress", "--config", ncfg, "--steps", "50", "--out", dir)
		c.waitAt(t, "start-up")
		if ents, _ := os.ReadDir(nv); len(ents) == 0 {
			t.Fatalf("no swap file in %s at start-up", nv)
		}
		c.cmd.Process.Signal(syscall.SIGINT)
		c.waitStderr(t, "stopping before training starts; nothing is written")
		os.WriteFile(goFile, nil, 0o644)
		if st := c.wait(); st != 130 {
			t.Errorf("SIGINT at start-up: exit status %d, want 130\n%s", st, c.stderr.String())
		}
		if ents, _ := os.ReadDir(nv); len(ents) != 0 {
			t.Errorf("SIGINT at start-up left %v in %s", ents, nv)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 || ents[0].Name() != lockFileName {
			t.Errorf("SIGINT at start-up left %v in --out", ents)
		}
	})
	t.Run("second sigint at start-up", func(t *testing.T) {
		// The second signal ends the process without closing the engine:
		// its swap files' names go first (engine.RemoveSwapFiles).
		nv, dir := nvmetest.Dir(t), t.TempDir()
		ncfg := writeFile(t, "nvme.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "`+nv+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+nv+`"}},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16}
}`)
		c := startChild(t, "start-up#1", "", "train", "--no-progress", "--config", ncfg, "--steps", "50", "--out", dir)
		c.waitAt(t, "start-up")
		if ents, _ := os.ReadDir(nv); len(ents) == 0 {
			t.Fatalf("no swap file in %s at start-up", nv)
		}
		c.cmd.Process.Signal(syscall.SIGINT)
		c.waitStderr(t, "stopping before training starts")
		c.cmd.Process.Signal(syscall.SIGINT)
		if st := c.wait(); st != 130 {
			t.Errorf("second SIGINT at start-up: exit status %d, want 130\n%s", st, c.stderr.String())
		}
		if !strings.Contains(c.stderr.String(), "removed the swap files") {
			t.Errorf("the second SIGINT does not say it removed the swap files:\n%s", c.stderr.String())
		}
		if ents, _ := os.ReadDir(nv); len(ents) != 0 {
			t.Errorf("a second SIGINT at start-up left %v in %s", ents, nv)
		}
	})
}

// TestIncompleteCheckpointIgnored: an empty step-00000040 (what a kill
// during pruning left before pruning renamed first) and a step directory
// whose rank file is missing do not stop a resume, latest or explicit:
// they are ignored and reported, and the resumed run's first save removes
// them.
func TestIncompleteCheckpointIgnored(t *testing.T) {
	cfg := tinyConfig(t)
	dir := t.TempDir()
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "4", "--out", dir, "--save-every", "2")...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	ck := filepath.Join(dir, "checkpoints")
	os.Mkdir(filepath.Join(ck, "step-00000040"), 0o755)
	os.Mkdir(filepath.Join(ck, "step-00000030"), 0o755)
	b, _ := os.ReadFile(filepath.Join(ck, "step-00000004", "manifest.json"))
	os.WriteFile(filepath.Join(ck, "step-00000030", "manifest.json"), b, 0o644)
	_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "6", "--resume", dir, "--out", dir, "--save-every", "2")...)
	if err != nil || !strings.Contains(stderr, "resumed from step 4") {
		t.Fatalf("resume with incomplete checkpoint directories: %v\n%s", err, stderr)
	}
	for _, w := range []string{"ignored incomplete checkpoint directories", "step-00000030 (no rank-00000.safetensors)", "step-00000040 (no manifest.json)"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	for _, name := range []string{"step-00000030", "step-00000040"} {
		if _, err := os.Stat(filepath.Join(ck, name)); !os.IsNotExist(err) {
			t.Errorf("%s after the resumed run's saves: %v, want it removed", name, err)
		}
	}
	os.Mkdir(filepath.Join(ck, "step-00000040"), 0o755)
	_, stderr, err = runApp(t, trainArgs(cfg, "--steps", "6", "--resume", filepath.Join(ck, "step-00000004"), "--out", dir)...)
	if err != nil || !strings.Contains(stderr, "resumed from step 4") || !strings.Contains(stderr, "moved back to step-00000004") {
		t.Errorf("resume from an explicit older checkpoint: %v\n%s", err, stderr)
	}
	os.Mkdir(filepath.Join(ck, "step-00000040"), 0o755) // (the run's last save removed it)
	_, _, err = runApp(t, trainArgs(cfg, "--steps", "6", "--resume", filepath.Join(ck, "step-00000040"), "--out", t.TempDir())...)
	if err == nil || !strings.Contains(err.Error(), "incomplete checkpoint") || !strings.Contains(err.Error(), "the newest complete checkpoint is") {
		t.Errorf("resume from the incomplete directory itself: %v", err)
	}
}
