package cmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/model"
)

// fillTo writes a file into dir's filesystem that leaves free bytes free.
func fillTo(dir string, free int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	avail := int64(st.Bavail) * st.Bsize
	if avail < free {
		return fmt.Errorf("%s has %d bytes free, less than %d", dir, avail, free)
	}
	return os.WriteFile(filepath.Join(dir, "filler"), make([]byte, avail-free), 0o644)
}

// TestRunOutputsDiskFills: a run whose disk fills before its outputs
// writes the weights first (the summary is what is lost when only they
// fit), each file whole or absent, and the error names what was not
// written; with no room for either, the error names both, and the weights
// of the last step are in its checkpoint (every --out run ends with one).
func TestRunOutputsDiskFills(t *testing.T) {
	cfg := tinyConfig(t)
	ref := filepath.Join(t.TempDir(), "ref")
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "3", "--out", ref)...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	fi, err := os.Stat(filepath.Join(ref, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	weights := (fi.Size() + 4095) &^ 4095
	for _, c := range []struct {
		name    string
		free    int64
		want    []string
		weights bool
		summary bool
	}{
		{"room for the weights only", weights, []string{"summary.json was not written", "no space left on device", "the weights of step 3 are in"}, true, false},
		{"no room", 0, []string{"neither the weights nor the summary were written", "no space left on device"}, false, false},
	} {
		disk := t.TempDir()
		mountOrSkip(t, disk, "-t", "tmpfs", "-o", "size=16m", "tmpfs")
		out := filepath.Join(disk, "run")
		testHook = func(p string) error {
			if p == "outputs" {
				return fillTo(disk, c.free)
			}
			return nil
		}
		_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "3", "--out", out)...)
		testHook = nil
		if err == nil {
			t.Errorf("%s: the run ended well on a full disk:\n%s", c.name, stderr)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: the error %q does not say %q", c.name, err, w)
			}
		}
		got, gerr := os.ReadFile(filepath.Join(out, "model.safetensors"))
		want, _ := os.ReadFile(filepath.Join(ref, "model.safetensors"))
		if c.weights && (gerr != nil || string(got) != string(want)) {
			t.Errorf("%s: model.safetensors: %v, %d bytes, want the reference run's %d", c.name, gerr, len(got), len(want))
		}
		if !c.weights && gerr == nil {
			t.Errorf("%s: a model.safetensors of %d bytes on a full disk", c.name, len(got))
		}
		if b, err := os.ReadFile(filepath.Join(out, "summary.json")); err == nil && (!c.summary || !json.Valid(b)) {
			t.Errorf("%s: summary.json of %d bytes (valid JSON %t) where it could not be written", c.name, len(b), json.Valid(b))
		}
		if m, _, err := checkpoint.ReadManifest(filepath.Join(out, "checkpoints")); err != nil || m.Step != 3 {
			t.Errorf("%s: the checkpoint of the last step: %v %v", c.name, m, err)
		}
		entries, _ := os.ReadDir(out)
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Errorf("%s: a temporary file left: %s", c.name, e.Name())
			}
		}
	}
}

// TestEveryOutRunEndsWithCheckpoint: the README's LoRA walkthrough shape —
// `strata train --out run` without --save-every, then export, eval and a
// resume of run — works: the run ends with the checkpoint of its last step
// (before, "no checkpoint in run").
func TestEveryOutRunEndsWithCheckpoint(t *testing.T) {
	cfg := tinyConfig(t)
	run := filepath.Join(t.TempDir(), "run")
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "3", "--out", run)...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if m, _, err := checkpoint.ReadManifest(filepath.Join(run, "checkpoints")); err != nil || m.Step != 3 {
		t.Fatalf("the run's checkpoint: %v %v, want step 3", m, err)
	}
	exported := filepath.Join(t.TempDir(), "w.safetensors")
	if _, _, err := runApp(t, "export", run, exported); err != nil {
		t.Errorf("export of the run: %v", err)
	}
	if _, _, err := runApp(t, "eval", "--model", run, "--data", "../testdata/train/corpus.txt", "--seq", "16"); err != nil {
		t.Errorf("eval of the run: %v", err)
	}
	if _, stderr, err := runApp(t, trainArgs(cfg, "--resume", run, "--out", run, "--steps", "4")...); err != nil {
		t.Errorf("resume of the run: %v\n%s", err, stderr)
	}
}

// TestResumeKeepsLaterWeights: a run whose final save failed has the
// weights of its last step in model.safetensors and an older checkpoint;
// resuming from that checkpoint into the same directory sets the later
// weights, summary and steps aside (named on stderr) instead of
// overwriting and cutting them.
func TestResumeKeepsLaterWeights(t *testing.T) {
	cfg := tinyConfig(t)
	dir := filepath.Join(t.TempDir(), "run")
	ck := filepath.Join(dir, "checkpoints")
	mountErr := readOnlyAtStep(t, ck, 5)
	_, _, err := runApp(t, trainArgs(cfg, "--steps", "6", "--out", dir, "--save-every", "2")...)
	testHook = nil
	if *mountErr != nil {
		t.Skipf("cannot make a read-only bind mount here (needs root with CAP_SYS_ADMIN): %v", *mountErr)
	}
	if err == nil || !strings.Contains(err.Error(), "the checkpoint of the last step 6 was not saved") {
		t.Fatalf("the final save on a read-only disk: %v", err)
	}
	if out, err := exec.Command("umount", "-l", ck).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	later, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	laterSteps, _ := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	_, stderr, err := runApp(t, trainArgs(cfg, "--resume", dir, "--out", dir, "--steps", "5")...)
	if err != nil {
		t.Fatalf("resume from step 4: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "set aside, not overwritten: model.safetensors -> model.step-6.safetensors") {
		t.Errorf("no note of what is set aside:\n%s", stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "model.step-6.safetensors")); err != nil || string(b) != string(later) {
		t.Errorf("the weights of step 6 were not kept: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "steps.to-step-6.jsonl")); err != nil || string(b) != string(laterSteps) {
		t.Errorf("the steps to step 6 were not kept: %v", err)
	}
	if n := len(stepLosses(t, dir)); n != 5 {
		t.Errorf("steps.jsonl has %d steps, want 5", n)
	}
}

// TestOutIsNotTheInitDir: --out naming the --init directory (a Hugging
// Face model the run starts from) is refused, with --overwrite too, and
// the model's files are left as they were.
func TestOutIsNotTheInitDir(t *testing.T) {
	cfg := tinyConfig(t)
	run := filepath.Join(t.TempDir(), "run")
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "2", "--out", run)...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	base := filepath.Join(t.TempDir(), "base")
	if _, _, err := runApp(t, "export", "--format", "hf", run, base); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, base)
	_, _, err := runApp(t, trainArgs(cfg, "--init", base, "--out", base, "--overwrite", "--steps", "2")...)
	var ec exitCoder
	if err == nil || !strings.Contains(err.Error(), "is the --init directory") || !errors.As(err, &ec) || ec.ExitCode() != 2 {
		t.Errorf("--init D --out D --overwrite: %v, want a usage error naming the --init directory", err)
	}
	if after := snapshot(t, base); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the --init directory changed")
	}
}

// TestTrainReportLines: a run with one evaluation says so (not "eval loss
// X -> X"); an fp16 run's skipped steps show as skipped on the progress
// line (not "0 tok/s") and are counted on the final line.
func TestTrainReportLines(t *testing.T) {
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 40))
	stdout, stderr, err := runApp(t, trainArgs(tinyConfig(t), "--steps", "2", "--eval-data", held)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !regexp.MustCompile(`eval loss \d+\.\d+ over \d+ tokens of --eval-data \(one evaluation\)`).MatchString(stdout) || regexp.MustCompile(`eval loss \S+ -> `).MatchString(stdout) {
		t.Errorf("one evaluation reported as:\n%s", stdout)
	}
	// 2^24: the first steps overflow, the scale halves until one fits.
	cfg := writeFile(t, "fp16.json", `{"train_micro_batch_size_per_gpu": 2,
  "fp16": {"enabled": true, "initial_scale_power": 24, "hysteresis": 1},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16, "seed": 5}}`)
	stdout, stderr, err = runApp(t, "train", "--no-progress", "--config", cfg, "--steps", "12", "--data", "../testdata/train/corpus.txt")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if strings.Contains(stderr, " 0 tok/s") {
		t.Errorf("a skipped step shown as 0 tok/s:\n%s", stderr)
	}
	m := regexp.MustCompile(`trained 12 steps \((\d+) skipped for fp16 overflow`).FindStringSubmatch(stdout)
	if m == nil || m[1] == "0" {
		t.Errorf("the final line does not count the skipped steps:\n%s", stdout)
	}
}

// TestResumeRelativeData: a run given a relative --data records it
// absolute, so that a resume from another directory reads the same file;
// a config's own relative strata.data that is not found from the resuming
// directory is said so (not "stat d.txt: no such file").
func TestResumeRelativeData(t *testing.T) {
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := filepath.Abs(tinyConfig(t))
	dirA, dirB := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(dirA, "d.txt"), text, 0o644)
	run := filepath.Join(t.TempDir(), "run")
	t.Chdir(dirA)
	if _, stderr, err := runApp(t, "train", "--no-progress", "--config", cfg, "--data", "d.txt", "--steps", "2", "--out", run); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	t.Chdir(dirB)
	if _, stderr, err := runApp(t, "train", "--no-progress", "--resume", run, "--out", run, "--steps", "3"); err != nil {
		t.Errorf("resume from another directory: %v\n%s", err, stderr)
	}
	rel := writeFile(t, "rel.json", `{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16, "seed": 5, "data": "d.txt"}}`)
	run2 := filepath.Join(t.TempDir(), "run2")
	t.Chdir(dirA)
	if _, stderr, err := runApp(t, "train", "--no-progress", "--config", rel, "--steps", "2", "--out", run2); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	t.Chdir(dirB)
	_, _, err = runApp(t, "train", "--no-progress", "--resume", run2, "--out", run2, "--steps", "3")
	if err == nil || !strings.Contains(err.Error(), `the run's training data "d.txt"`) || !strings.Contains(err.Error(), "pass --data PATH") {
		t.Errorf("resume of a relative strata.data from another directory: %v", err)
	}
}

// TestResumeConfigWithoutModel: a resume whose --config has no
// strata.model goes on with the checkpoint's model (here "small"), not the
// default shape ("tiny").
func TestResumeConfigWithoutModel(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	small := writeFile(t, "small.json", `{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, "strata": {"model": "small", "devices": 1, "seq_len": 16, "seed": 5}}`)
	if _, stderr, err := runApp(t, trainArgs(small, "--steps", "2", "--out", run)...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	bare := writeFile(t, "bare.json", `{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, "strata": {"devices": 1, "seq_len": 16, "seed": 5}}`)
	if _, stderr, err := runApp(t, "train", "--no-progress", "--config", bare, "--data", "../testdata/train/corpus.txt", "--resume", run, "--out", run, "--steps", "3"); err != nil {
		t.Errorf("resume with a --config without strata.model: %v\n%s", err, stderr)
	}
}

// TestLoRAWalkthrough is the README's LoRA section word for word on a tiny
// Llama: train --init with --epochs 1 --out and no --save-every, then
// export --format peft, export --format hf --merge, eval --offload cpu of
// the run, and a run continuing the exported adapter.
func TestLoRAWalkthrough(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	base := filepath.Join(dir, "base")
	s := model.Shape{Arch: model.ArchLlama, Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, FFN: 48, Vocab: 256, MaxSeq: 64, RopeTheta: 10000}
	writeHFEvalModel(t, base, s, 7, dtype.F32, testTokenizer{})
	var train, held strings.Builder
	for i := range 40 {
		fmt.Fprintf(&train, `{"prompt": "Q%d: what sat on the mat?", "completion": " The cat %d."}`+"\n", i, i)
	}
	for i := range 8 {
		fmt.Fprintf(&held, `{"prompt": "Q%d: what ate the bread?", "completion": " The dog %d."}`+"\n", i, i)
	}
	os.WriteFile("chat.jsonl", []byte(train.String()), 0o644)
	os.WriteFile("held.jsonl", []byte(held.String()), 0o644)
	os.WriteFile("held.txt", []byte(strings.Repeat("The dog ate the bread. ", 20)), 0o644)
	cfg := writeFile(t, "lora.json", strings.Replace(loraConfig, "%s", "0.01", 1))
	for _, args := range [][]string{
		{"train", "--init", base, "--config", cfg, "--data", "chat.jsonl", "--eval-data", "held.jsonl", "--epochs", "1", "--out", "lora-run", "--no-progress"},
		{"export", "--format", "peft", "lora-run", "adapter/"},
		{"export", "--format", "hf", "--merge", "lora-run", "merged/"},
		{"eval", "--model", "lora-run", "--data", "held.txt", "--offload", "cpu"},
		{"train", "--init", base, "--adapter", "adapter/", "--config", cfg, "--data", "chat.jsonl", "--steps", "1", "--out", "again", "--no-progress"},
	} {
		if _, stderr, err := runApp(t, args...); err != nil {
			t.Fatalf("strata %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
	}
}

// TestTrainLongExamplesNote: JSONL examples longer than seq_len are
// counted at start-up with the rows they split into (before, split with no
// word).
func TestTrainLongExamplesNote(t *testing.T) {
	var b strings.Builder
	for i := range 6 {
		long := ""
		if i%2 == 0 {
			long = strings.Repeat(" and on", 8) // 56 bytes more: more than seq_len 16 of the byte tokenizer
		}
		fmt.Fprintf(&b, `{"prompt": "Q%d", "completion": " A%d%s."}`+"\n", i, i, long)
	}
	data := writeFile(t, "long.jsonl", b.String())
	_, stderr, err := runApp(t, "train", "--no-progress", "--config", tinyConfig(t), "--data", data, "--steps", "1")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !regexp.MustCompile(`note: \S*long.jsonl: 3 examples are longer than seq_len 16 \(\+1\): each is split into pieces of 16 columns, \d+ rows in all`).MatchString(stderr) {
		t.Errorf("no note of the examples split:\n%s", stderr)
	}
}
