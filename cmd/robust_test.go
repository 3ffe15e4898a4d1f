package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/checkpoint"
)

// TestSignalWhileTokenizing: the first SIGINT while `strata train` tokenizes
// a JSONL file that takes seconds stops the tokenizing within a bounded
// number of lines: the run exits 130 with the interrupt's message well
// before the tokenizing would have ended, and leaves no token file.
func TestSignalWhileTokenizing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes a 256 MiB JSONL file and tokenizes it in a child process")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "big.jsonl")
	size := int64(256 << 20)
	if raceEnabled {
		size = 64 << 20
	}
	writeChatFile(t, path, size)
	cfgPath := writeFile(t, "data.json", dataConfig)
	out := filepath.Join(dir, "run")
	c := startChild(t, "", "", "train", "--no-progress", "--config", cfgPath, "--data", path, "--steps", "2", "--out", out)
	c.waitStderr(t, "tokenizer: bytes")
	time.Sleep(300 * time.Millisecond) // well inside the tokenizing
	if c.ended() {
		t.Fatalf("the child ended before the signal:\n%s", c.stderr.String())
	}
	t0 := time.Now()
	st := c.interrupt(t, "during tokenizing")
	took := time.Since(t0)
	stderr := c.stderr.String()
	if st != 130 {
		t.Errorf("exit status %d, want 130\n%s", st, stderr)
	}
	if took > 2*time.Second {
		t.Errorf("the child ended %v after SIGINT during tokenizing, want under 2 s\n%s", took, stderr)
	}
	if strings.Contains(stderr, "tokenized in") {
		t.Errorf("the tokenizing went on to the end after SIGINT:\n%s", stderr)
	}
	for _, want := range []string{"stopping before training starts", "stopped before the first step; nothing was written"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	for _, d := range []string{dir, out} {
		if m, _ := filepath.Glob(filepath.Join(d, "strata-*.tokens")); len(m) > 0 {
			t.Errorf("a token file was left behind: %v", m)
		}
	}
	if ents, err := os.ReadDir(out); err == nil && len(ents) > 1 { // strata.lock at most
		t.Errorf("the stopped run wrote into --out: %v", ents)
	}
}

// TestSignalWhileRenderingTemplate: a model's chat template that loops
// (10^10 iterations, stopped only by the rendering's budget of 10M steps,
// seconds away) is stopped by the first SIGINT in the middle of a
// rendering: the run exits 130 with the interrupt's message, not with the
// template's budget error. Before, a template building a string ignored
// two Ctrl-Cs.
func TestSignalWhileRenderingTemplate(t *testing.T) {
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "loop.jinja")
	if err := os.WriteFile(tmpl, []byte("{% for m in messages %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ m.content }}{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "chat.jsonl")
	if err := os.WriteFile(data, []byte(`{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := writeFile(t, "data.json", dataConfig)
	c := startChild(t, "", "", "train", "--no-progress", "--config", cfgPath, "--data", data, "--chat-template", tmpl, "--steps", "2", "--out", filepath.Join(dir, "run"))
	c.waitStderr(t, "tokenizer: bytes")
	time.Sleep(200 * time.Millisecond) // inside the first rendering
	if c.ended() {
		t.Fatalf("the child ended before the signal:\n%s", c.stderr.String())
	}
	st := c.interrupt(t, "during a rendering")
	stderr := c.stderr.String()
	if st != 130 || !strings.Contains(stderr, "stopped before the first step; nothing was written") {
		t.Errorf("exit status %d, want 130 and the stop\n%s", st, stderr)
	}
	if strings.Contains(stderr, "budget") {
		t.Errorf("the rendering ran to its budget after SIGINT:\n%s", stderr)
	}
}

// readOnlyAtStep sets testHook to bind-mount dir read-only over itself at
// the end of step n (the mount's error, if any, lands in the result: the
// caller skips on it after the run); the mount goes at the test's end.
func readOnlyAtStep(t *testing.T, dir string, n int) *error {
	var mountErr error
	steps := 0
	testHook = func(p string) error {
		if p == "step" {
			if steps++; steps == n {
				if out, err := exec.Command("mount", "--bind", dir, dir).CombinedOutput(); err != nil {
					mountErr = fmt.Errorf("%v: %s", err, out)
				} else if out, err := exec.Command("mount", "-o", "remount,ro,bind", dir).CombinedOutput(); err != nil {
					mountErr = fmt.Errorf("%v: %s", err, out)
				}
			}
		}
		return nil
	}
	t.Cleanup(func() { testHook = nil; exec.Command("umount", "-l", dir).Run() })
	return &mountErr
}

// mountOrSkip runs mount with args, skipping the test with the reason when
// this process may not mount (not root, no CAP_SYS_ADMIN); the mount at
// target is undone when the test ends.
func mountOrSkip(t *testing.T, target string, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", append(args, target)...).CombinedOutput(); err != nil {
		t.Skipf("cannot mount here (needs root with CAP_SYS_ADMIN): mount %s %s: %v: %s", strings.Join(args, " "), target, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", target).Run() })
}

// fill writes a file into dir until its filesystem is full.
func fill(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 4096)
	for {
		if _, err := f.Write(b); err != nil {
			return
		}
	}
}

// TestSaveFailureGoesOn: --out on a small filesystem that fills up after
// step 3 and is freed after step 5: the save of step 4 fails with one
// warning line naming the cause, "latest" stays at step 2, the run goes
// on, steps.jsonl stays whole lines, the save of step 6 succeeds, and the
// summary says one save failed.
func TestSaveFailureGoesOn(t *testing.T) {
	cfg := tinyConfig(t)
	dir := filepath.Join(t.TempDir(), "run")
	os.Mkdir(dir, 0o755)
	mountOrSkip(t, dir, "-t", "tmpfs", "-o", "size=8m", "tmpfs")
	filler := filepath.Join(dir, "filler")
	ck := filepath.Join(dir, "checkpoints")
	steps, latestAt5 := 0, int64(-1)
	testHook = func(p string) error {
		if p == "step" {
			switch steps++; steps {
			case 3:
				fill(t, filler)
			case 5:
				if m, _, err := checkpoint.ReadManifest(ck); err == nil {
					latestAt5 = m.Step
				}
				os.Remove(filler)
			}
		}
		return nil
	}
	defer func() { testHook = nil }()
	stdout, stderr, err := runApp(t, trainArgs(cfg, "--steps", "8", "--out", dir, "--save-every", "2")...)
	testHook = nil
	if err != nil {
		t.Fatalf("a run whose periodic save failed on a full disk ended: %v\n%s", err, stderr)
	}
	var warns []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "warning: ") && strings.Contains(l, "checkpoint") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "step 4") || !strings.Contains(warns[0], "no space left on device") {
		t.Errorf("want one warning naming step 4 and the cause (no space left on device), got %q\n%s", warns, stderr)
	}
	if latestAt5 != 2 {
		t.Errorf("latest after the failed save of step 4: step %d, want 2", latestAt5)
	}
	if m, _, err := checkpoint.ReadManifest(ck); err != nil || m.Step != 8 {
		t.Errorf("latest at the end: %v %v, want step 8", m, err)
	}
	if !strings.Contains(stdout, "1 of 4 checkpoint saves failed") {
		t.Errorf("the summary does not count the failed save:\n%s", stdout)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("steps.jsonl line %d is not whole: %q", i+1, line)
		}
	}
}

// TestFinalSaveFailure: the checkpoints directory turns read-only after
// step 3 of 4: the save of the last step fails, and the run says so and
// exits 1 naming the cause and the checkpoint that survives (step 2), its
// weights and summary still written.
func TestFinalSaveFailure(t *testing.T) {
	cfg := tinyConfig(t)
	dir := t.TempDir()
	ck := filepath.Join(dir, "checkpoints")
	mountErr := readOnlyAtStep(t, ck, 3)
	_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "4", "--out", dir, "--save-every", "2")...)
	testHook = nil
	if *mountErr != nil {
		t.Skipf("cannot make a read-only bind mount here (needs root with CAP_SYS_ADMIN): %v", *mountErr)
	}
	var ec exitCoder
	if err == nil || (errors.As(err, &ec) && ec.ExitCode() != 1) {
		t.Fatalf("a run whose last save failed: %v, want exit status 1\n%s", err, stderr)
	}
	for _, want := range []string{"step 4", "read-only file system", filepath.Join(ck, "step-00000002")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not name %q", err, want)
		}
	}
	if m, _, err := checkpoint.ReadManifest(ck); err != nil || m.Step != 2 {
		t.Errorf("latest: %v %v, want step 2", m, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Errorf("the trained weights were not written: %v", err)
	}
}

// TestResumeDataChanged: a run with --data and --save-every records its
// data in its checkpoints; after the file grew, --resume is refused in one
// line naming the file and its sizes; with --allow-data-change it goes on
// and its checkpoints record the new data. A same-size rewrite of a large
// file (hashed by samples) is noticed too.
func TestResumeDataChanged(t *testing.T) {
	cfg := tinyConfig(t)
	src, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	file := writeFile(t, "corpus.txt", string(src))
	dir := t.TempDir()
	args := func(more ...string) []string {
		return append([]string{"train", "--no-progress", "--config", cfg, "--data", file, "--out", dir, "--save-every", "2"}, more...)
	}
	if _, stderr, err := runApp(t, args("--steps", "4")...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if _, stderr, err := runApp(t, args("--steps", "5", "--resume", dir)...); err != nil {
		t.Fatalf("resume on the same data: %v\n%s", err, stderr)
	}
	f, _ := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	f.Write(src[:2000])
	f.Close()
	_, stderr, err := runApp(t, args("--steps", "6", "--resume", dir)...)
	var ec exitCoder
	if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 2 {
		t.Fatalf("resume after the data grew: %v, want a refusal (exit status 2)\n%s", err, stderr)
	}
	msg := err.Error()
	for _, want := range []string{"the training data changed since the checkpoint of step 5", file, fmt.Sprintf("was 2.7 KiB (%d B), is now", len(src)), fmt.Sprintf("(%d B, +", len(src)+2000), "--allow-data-change"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("the refusal is not one line: %q", msg)
	}
	_, stderr, err = runApp(t, args("--steps", "6", "--resume", dir, "--allow-data-change")...)
	if err != nil || !strings.Contains(stderr, "note: --allow-data-change: the training data changed") {
		t.Fatalf("resume with --allow-data-change: %v\n%s", err, stderr)
	}
	m, _, err := checkpoint.ReadManifest(filepath.Join(dir, "checkpoints"))
	if err != nil || m.Step != 6 || len(m.Data) != 1 || m.Data[0].Size != int64(len(src)+2000) || m.Data[0].Path != file {
		t.Fatalf("the checkpoint after the change: %v, records %+v, want step 6 and the new size", err, m)
	}
	if g := goOn([]string{"--allow-data-change", "--data", file}, dir, 8); strings.Contains(g, "allow-data-change") {
		t.Errorf("the command that goes on repeats --allow-data-change: %s", g)
	}

	big := filepath.Join(t.TempDir(), "big.txt")
	b := make([]byte, 3<<20)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	os.WriteFile(big, b, 0o644)
	was, err := identifyData("data", big)
	if err != nil || !was.Sampled {
		t.Fatalf("identify %s: %+v %v, want a sampled hash", big, was, err)
	}
	b[len(b)/2] = '!' // in the middle sample
	os.WriteFile(big, b, 0o644)
	now, _ := identifyData("data", big)
	if d := dataChange(was, now); !strings.Contains(d, "same size") || !strings.Contains(d, "first, middle and last 64 KiB") {
		t.Errorf("a same-size rewrite in the middle: %q", d)
	}
}

// interrupt sends the child one SIGINT and returns its exit status; a
// child still running 20 s later is killed and the test fails, saying
// what it was doing (when).
func (c *child) interrupt(t *testing.T, when string) int {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan int, 1)
	go func() { done <- c.wait() }()
	select {
	case st := <-done:
		return st
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-done
		t.Fatalf("the child went on for 20 s after SIGINT %s:\n%s", when, c.stderr.String())
		return 0
	}
}
