package cmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

func runApp(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	err = Run(append([]string{"strata"}, args...), &out, &errb)
	return out.String(), errb.String(), err
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// losses reads the loss of every line of steps.jsonl.
func losses(t *testing.T, dir string) []float64 {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l stepLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("steps.jsonl: %v", err)
		}
		if l.Step != int64(len(out)+1) || l.TokensPerSecond <= 0 || l.StepSeconds <= 0 {
			t.Fatalf("steps.jsonl line %d: %+v", len(out)+1, l)
		}
		out = append(out, float64(l.Loss))
	}
	return out
}

// mean of the first and last k values.
func ends(v []float64, k int) (first, last float64) {
	for i := range k {
		first += v[i] / float64(k)
		last += v[len(v)-k+i] / float64(k)
	}
	return first, last
}

// TestTrainDemo runs `strata train` with no config (shortened by --steps):
// the loss goes down, the out directory has the resolved config, one JSONL
// line per step (with the goroutines) and the summary, and the summary table reports each
// device's model state at the estimate.
func TestTrainDemo(t *testing.T) {
	dir := t.TempDir()
	stdout, stderr, err := runApp(t, "train", "--steps", "8", "--out", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	l := losses(t, dir)
	if len(l) != 8 {
		t.Fatalf("%d lines in steps.jsonl, want 8", len(l))
	}
	if first, last := ends(l, 3); !(last < first-0.5) {
		t.Errorf("loss did not go down: %v", l)
	}
	steps, _ := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	for _, line := range strings.Split(strings.TrimSpace(string(steps)), "\n") {
		var st struct {
			Goroutines int `json:"goroutines"`
		}
		if err := json.Unmarshal([]byte(line), &st); err != nil || st.Goroutines < 2 {
			t.Errorf("steps.jsonl line %s: goroutines %d (%v), want the process's (bench/soak.sh reads it)", line, st.Goroutines, err)
		}
	}
	for _, f := range []string{"config.json", "summary.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	var sum struct {
		Collectives string `json:"collectives"`
		PerDevice   []struct {
			Ratio        float64 `json:"ratio_estimate"`
			FormulaRatio float64 `json:"ratio_formula"`
			Padding      int64   `json:"padding_bytes"`
			Allocs       int64   `json:"driver_allocs"`
			AllocsAfter1 *int64  `json:"device_allocs_after_step1"`
		} `json:"per_device"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err := json.Unmarshal(b, &sum); err != nil || len(sum.PerDevice) != 2 {
		t.Fatalf("summary.json: %v: %s", err, b)
	}
	if sum.Collectives != "rank-order" {
		t.Errorf("summary.json collectives %q, want rank-order (the cpu backend's)", sum.Collectives)
	}
	for _, d := range sum.PerDevice {
		if d.Ratio < 0.95 || d.Ratio > 1.05 || d.FormulaRatio < 0.95 || d.FormulaRatio > 1.05 {
			t.Errorf("model state / estimate = %v, / formula = %v (padding %d B)", d.Ratio, d.FormulaRatio, d.Padding)
		}
		if d.AllocsAfter1 == nil || *d.AllocsAfter1 != 0 || d.Allocs == 0 {
			t.Errorf("device allocations after step 1: %v of %d in all, want 0", d.AllocsAfter1, d.Allocs)
		}
	}
	for _, want := range []string{"16Ψ/N", "cpu:0", "cpu:1", "gathered"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "loss") || !strings.Contains(stderr, "tok/s") || !strings.Contains(stderr, "moved") {
		t.Errorf("progress bar lacks loss, tokens/s or bytes moved:\n%s", stderr)
	}
}

// TestTrainData trains on a real text file with stage 3 on 2 devices for
// a few dozen steps; the loss goes down.
func TestTrainData(t *testing.T) {
	cfg := writeFile(t, "stage3.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95]}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 3}
}`)
	dir := t.TempDir()
	_, stderr, err := runApp(t, "train", "--config", cfg, "--data", "../testdata/train/corpus.txt", "--steps", "40", "--out", dir, "--no-progress")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	l := losses(t, dir)
	if first, last := ends(l, 5); !(last < first-1) {
		t.Errorf("loss did not go down by 1 nat: first steps %.3f, last %.3f: %v", first, last, l)
	}
}

// TestTrainBadInput: each bad input is one clear error, no panic, and a
// non-zero exit status.
func TestTrainBadInput(t *testing.T) {
	empty := writeFile(t, "empty.txt", "")
	dataDir := t.TempDir()
	fifo := filepath.Join(dataDir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"malformed json", []string{"--config", writeFile(t, "bad.json", "{\n  \"train_batch_size\": 8,,\n}\n")}, []string{"bad.json:2:"}},
		{"misspelled key", []string{"--config", "../testdata/configs/bad_misspelled_key.json"}, []string{"train_micro_batch_size_per_gp", "train_micro_batch_size_per_gpu"}},
		{"batch arithmetic", []string{"--config", "../testdata/configs/bad_batch_arithmetic.json"}, []string{"train_batch_size"}},
		{"batch with devices", []string{"--config", writeFile(t, "b.json", `{"train_batch_size": 6, "train_micro_batch_size_per_gpu": 3, "strata": {"model": "tiny"}}`), "--devices", "4"}, []string{"train_batch_size 6", "4"}},
		{"devices that do not split the batch", []string{"--config", "../testdata/configs/good_tiny_stage3.json", "--devices", "3"}, []string{"train_batch_size 16", "devices 3 from --devices"}},
		{"missing data", []string{"--data", filepath.Join(t.TempDir(), "nope.txt")}, []string{"nope.txt", "no such file"}},
		{"empty data", []string{"--data", empty}, []string{"empty.txt", "empty"}},
		{"short data", []string{"--data", writeFile(t, "short.txt", "tiny")}, []string{"corpus too short"}},
		{"data from a device", []string{"--data", "/dev/zero"}, []string{"/dev/zero", "not a regular file", "a character device"}},
		{"data from a directory", []string{"--data", dataDir}, []string{dataDir, "not a regular file", "a directory"}},
		{"data from a pipe", []string{"--data", fifo}, []string{fifo, "not a regular file", "a named pipe"}},
		{"steps", []string{"--steps", "0"}, []string{"--steps"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := runApp(t, append([]string{"train"}, c.args...)...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Count(err.Error(), "\n") > 2 {
				t.Errorf("error is not one clear message: %q", err)
			}
		})
	}
	// The exit status through Main.
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	saved := os.Stderr
	os.Stderr = null
	code := Main([]string{"strata", "train", "--data", empty})
	os.Stderr = saved
	if code == 0 {
		t.Error("exit status 0 for an empty data file")
	}
}

// TestTrainNVMe: stage 3 with params and optimizer state on NVMe (a swap
// file in a temporary directory, two paths striped) trains, its loss goes
// down, every JSONL line carries the tier figures (hit rate, bytes per link,
// peak bytes within each budget), bytes move over NVMe, and the summary
// names the tiers.
func TestTrainNVMe(t *testing.T) {
	d1, d2 := nvmetest.Dir(t), nvmetest.Dir(t)
	cfg := writeFile(t, "nvme.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95]}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": ["`+d1+`", "`+d2+`"], "pin_memory": true, "buffer_count": 5},
    "offload_optimizer": {"device": "nvme", "nvme_path": ["`+d1+`", "`+d2+`"], "pin_memory": true}},
  "aio": {"block_size": 262144, "queue_depth": 8, "thread_count": 2},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 3}
}`)
	dir := t.TempDir()
	stdout, stderr, err := runApp(t, "train", "--config", cfg, "--data", "../testdata/train/corpus.txt", "--steps", "30", "--out", dir, "--no-progress")
	if err != nil {
		// The directories do direct I/O: any error is a failure.
		t.Fatalf("%v\n%s", err, stderr)
	}
	l := losses(t, dir)
	if first, last := ends(l, 5); !(last < first-0.5) {
		t.Errorf("loss did not go down: first steps %.3f, last %.3f", first, last)
	}
	f, err := os.Open(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var nvme int64
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"prefetch_hit_rate", "prefetch_dependent", "stall_hbm_s", "stall_host_s", "optimizer_s", "bytes_nvme_to_host", "bytes_host_to_hbm", "bytes_host_to_nvme", "peak_host_bytes"} {
			if _, ok := line[k]; !ok {
				t.Fatalf("steps.jsonl has no %s: %s", k, sc.Text())
			}
		}
		for _, tr := range []string{"hbm", "host", "nvme"} {
			if line["peak_"+tr+"_bytes"].(float64) > line["budget_"+tr+"_bytes"].(float64) {
				t.Errorf("step %v: %s peak over its budget", line["step"], tr)
			}
		}
		nvme += int64(line["bytes_host_to_nvme"].(float64) + line["bytes_nvme_to_host"].(float64))
	}
	// The state starts on NVMe and is read from it; this model's fits the
	// default host budget after that, and write-back caching need not write
	// it back (whether a write happens in the first steps is timing).
	if nvme == 0 {
		t.Error("nothing moved over NVMe")
	}
	if !strings.Contains(stdout, "tiers: params in nvme, optimizer state in nvme") || !strings.Contains(stdout, "hit rate") {
		t.Errorf("summary does not name the tiers:\n%s", stdout)
	}
}

// stepLosses reads steps.jsonl: the loss of each step, by step.
func stepLosses(t *testing.T, dir string) map[int64]float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]float64{}
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var l stepLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("steps.jsonl line %d: %v", i+1, err)
		}
		if _, dup := out[l.Step]; dup {
			t.Fatalf("steps.jsonl: step %d twice", l.Step)
		}
		out[l.Step] = float64(l.Loss)
	}
	return out
}

// sameLosses checks that got has exactly steps from..to with the bits of
// want's.
func sameLosses(t *testing.T, what string, got, want map[int64]float64, from, to int64) {
	t.Helper()
	if len(got) != int(to-from+1) {
		t.Errorf("%s: %d lines in steps.jsonl, want steps %d-%d", what, len(got), from, to)
	}
	for s := from; s <= to; s++ {
		g, ok := got[s]
		if !ok || g != want[s] {
			t.Errorf("%s: step %d loss %v (present %v), uninterrupted %v", what, s, g, ok, want[s])
		}
	}
}

// TestTrainResume: 6 steps with --save-every 2 (keeping 2), then --resume
// to 9 steps: the JSONL losses of steps 7-9 are bit-equal to those of an
// uninterrupted 9-step run; so are those of a run resumed from the step-4
// checkpoint with the checkpoint's own config (no --config) into a new
// directory, and of one resumed from it into the first run's directory
// (whose lines past step 4 are replaced). Resuming past --steps is refused
// clearly.
func TestTrainResume(t *testing.T) {
	cfg := writeFile(t, "resume.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 3, "total_num_steps": 9}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 3}
}`)
	train := func(args ...string) (string, string) {
		t.Helper()
		stdout, stderr, err := runApp(t, append([]string{"train", "--data", "../testdata/train/corpus.txt", "--no-progress"}, args...)...)
		if err != nil {
			t.Fatalf("strata train %v: %v\n%s", args, err, stderr)
		}
		return stdout, stderr
	}
	full := t.TempDir()
	train("--config", cfg, "--steps", "9", "--out", full)
	want := stepLosses(t, full)

	run := t.TempDir()
	_, stderr := train("--config", cfg, "--steps", "6", "--out", run, "--save-every", "2", "--keep", "2")
	if strings.Count(stderr, "saved checkpoint of step") != 3 {
		t.Errorf("want 3 checkpoints saved (steps 2, 4, 6):\n%s", stderr)
	}
	ck := filepath.Join(run, "checkpoints")
	ls, err := checkpoint.List(ck)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Latest != "step-00000006" || strings.Join(ls.Names(), ",") != "step-00000004,step-00000006" {
		t.Errorf("checkpoints %v latest %q, want steps 4 and 6 (--keep 2), latest 6", ls.Names(), ls.Latest)
	}
	sameLosses(t, "first 6 steps", stepLosses(t, run), want, 1, 6)

	// Resume from the run's directory (its latest: step 6) to 9 steps.
	// (--keep 3: its own last checkpoint, of step 9, leaves step 4.)
	stdout, stderr := train("--config", cfg, "--steps", "9", "--resume", run, "--out", run, "--keep", "3")
	if w := "resumed from step 6 (" + filepath.Join(ck, "step-00000006") + ")"; !strings.Contains(stderr, w) {
		t.Errorf("stderr lacks %q:\n%s", w, stderr)
	}
	if !strings.Contains(stdout, "trained 3 steps (steps 7-9, resumed)") {
		t.Errorf("stdout:\n%s", stdout)
	}
	sameLosses(t, "resumed at 6", stepLosses(t, run), want, 1, 9)
	// Back to step 6 for what follows: the resumed run's own last
	// checkpoint (step 9, as every --out run ends with one) set aside.
	if _, err := checkpoint.Rewind(ck, "step-00000006"); err != nil {
		t.Fatal(err)
	}

	// From the step-4 checkpoint with its own config, into a new directory.
	step4 := filepath.Join(ck, "step-00000004")
	fresh := t.TempDir()
	_, stderr = train("--steps", "9", "--resume", step4, "--out", fresh)
	if !strings.Contains(stderr, "resumed from step 4 ("+step4+")") {
		t.Errorf("stderr:\n%s", stderr)
	}
	sameLosses(t, "resumed at 4, saved config", stepLosses(t, fresh), want, 5, 9)
	// The saved config is the resolved one, naming every knob: its knobs
	// are not reported as set by the user.
	if strings.Contains(stderr, "accepted but not used") {
		t.Errorf("resumed with the saved config, notes of knobs the user did not set:\n%s", stderr)
	}

	// Past the saved schedule's total_num_steps (9): the note says the
	// steps after it run at warmup_min_lr.
	_, stderr = train("--steps", "11", "--resume", step4, "--out", t.TempDir())
	if w := "total_num_steps 9: steps 10-11 run at warmup_min_lr 0.0001"; !strings.Contains(stderr, w) {
		t.Errorf("stderr lacks %q:\n%s", w, stderr)
	}

	// From step 4 on 1 device (resharded; the saved config keeps the global
	// batch: 2 micro-batches): step 5 starts from the same params on the
	// same rows, so its loss is bit-equal; later steps sum the gradient in
	// another grouping (engine.TestCheckpointReshard) and stay close.
	one := t.TempDir()
	train("--steps", "9", "--resume", step4, "--out", one, "--devices", "1")
	got := stepLosses(t, one)
	if got[5] != want[5] || len(got) != 5 {
		t.Errorf("resumed on 1 device: step 5 loss %v, uninterrupted %v (%d lines)", got[5], want[5], len(got))
	}
	for s := int64(6); s <= 9; s++ {
		if math.Abs(got[s]-want[s]) > 1e-3*want[s] {
			t.Errorf("resumed on 1 device: step %d loss %v, uninterrupted %v", s, got[s], want[s])
		}
	}

	// Nothing left to train, and the other misuses.
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--config", cfg, "--steps", "6", "--resume", run}, []string{"step 6", "--steps", "is 6", "nothing to train"}},
		{[]string{"--config", cfg, "--steps", "3", "--resume", step4}, []string{"step 4", "is 3", "raise --steps"}},
		{[]string{"--config", cfg, "--save-every", "2"}, []string{"--save-every needs --out"}},
		{[]string{"--config", cfg, "--keep", "3"}, []string{"--keep needs --out"}},
		{[]string{"--config", cfg, "--allow-other-base"}, []string{"--allow-other-base needs --adapter"}},
		{[]string{"--config", cfg, "--out", t.TempDir(), "--save-every", "2", "--keep", "0"}, []string{"--keep 0"}},
		{[]string{"--config", cfg, "--resume", t.TempDir()}, []string{"--resume", "no checkpoint"}},
	} {
		_, _, err := runApp(t, append([]string{"train", "--no-progress"}, c.args...)...)
		if err == nil {
			t.Errorf("%v: no error", c.args)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", c.args, err, w)
			}
		}
	}

	resumeOlder(t, train, cfg, run, want)
}

// resumeOlder: with the run's latest checkpoint (step 6) corrupt, resuming
// from its intact step-4 checkpoint into the run's own directory is
// allowed: latest moves back to step 4, step 6 is set aside (said so), and
// the run ends as the uninterrupted one, steps.jsonl one run of 9 steps.
func resumeOlder(t *testing.T, train func(...string) (string, string), cfg, run string, want map[int64]float64) {
	t.Helper()
	ck := filepath.Join(run, "checkpoints")
	rank := filepath.Join(ck, "step-00000006", "rank-00001.safetensors")
	b, err := os.ReadFile(rank)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(rank, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runApp(t, "train", "--no-progress", "--steps", "9", "--resume", run, "--out", run); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("resume from a corrupt latest: %v, want a checksum mismatch", err)
	}
	_, stderr := train("--config", cfg, "--steps", "9", "--resume", filepath.Join(ck, "step-00000004"), "--out", run, "--save-every", "2")
	for _, w := range []string{"latest moved back to step-00000004 (step 4)", "set aside", "aside-step-00000006"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("resume from the older checkpoint: stderr lacks %q:\n%s", w, stderr)
		}
	}
	sameLosses(t, "resumed from the older checkpoint into its run", stepLosses(t, run), want, 1, 9)
	ls, err := checkpoint.List(ck)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Latest != "step-00000009" || strings.Join(ls.Names(), ",") != "step-00000008,step-00000009" {
		t.Errorf("checkpoints %v latest %q, want steps 8 and 9", ls.Names(), ls.Latest)
	}
	if _, err := os.Stat(filepath.Join(ck, "aside-step-00000006", "manifest.json")); err != nil {
		t.Errorf("the set-aside checkpoint: %v", err)
	}
}

// TestTrainInterrupt: SIGINT during `strata train --out` stops after the
// step in progress, saves a checkpoint of it (no --save-every needed),
// writes the summary and weights, exits with status 130 and says how to
// go on; the resumed run then matches an uninterrupted one.
func TestTrainInterrupt(t *testing.T) {
	cfg := writeFile(t, "intr.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2},
  "strata": {"model": "tiny", "devices": 1, "seq_len": 16, "seed": 5}
}`)
	run := t.TempDir()
	const steps = 100000 // far more than run before the signal
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			b, _ := os.ReadFile(filepath.Join(run, "steps.jsonl"))
			if bytes.Count(b, []byte("\n")) >= 3 {
				syscall.Kill(os.Getpid(), syscall.SIGINT)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stdout, stderr, err := runApp(t, "train", "--no-progress", "--data", "../testdata/train/corpus.txt", "--config", cfg,
		"--steps", fmt.Sprint(steps), "--out", run)
	<-done
	var ec exitCoder
	if err == nil || !errors.As(err, &ec) || ec.ExitCode() != 130 {
		t.Fatalf("interrupted run: %v, want exit status 130\n%s", err, stderr)
	}
	got := stepLosses(t, run)
	n := int64(len(got))
	ck := filepath.Join(run, "checkpoints", fmt.Sprintf("step-%08d", n))
	for _, w := range []string{fmt.Sprintf("stopped after step %d of %d", n, steps), "checkpoint " + ck, "--resume " + run} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if !strings.Contains(stdout, fmt.Sprintf("trained %d steps", n)) {
		t.Errorf("stdout lacks the summary of %d steps:\n%s", n, stdout)
	}
	for _, f := range []string{filepath.Join(run, "summary.json"), filepath.Join(run, "model.safetensors"), filepath.Join(ck, "manifest.json")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("after the interrupt: %v", err)
		}
	}

	// Resumed to n+2 steps it equals an uninterrupted run of n+2 steps.
	total := fmt.Sprint(n + 2)
	if _, stderr, err := runApp(t, "train", "--no-progress", "--data", "../testdata/train/corpus.txt", "--steps", total, "--resume", run, "--out", run); err != nil {
		t.Fatalf("resume: %v\n%s", err, stderr)
	}
	full := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--no-progress", "--data", "../testdata/train/corpus.txt", "--config", cfg, "--steps", total, "--out", full); err != nil {
		t.Fatalf("uninterrupted: %v\n%s", err, stderr)
	}
	sameLosses(t, "interrupted and resumed", stepLosses(t, run), stepLosses(t, full), 1, n+2)
}

// TestQuickStart runs the `strata train` lines of README.md's quick start
// in order, as written, in one directory: each line that resumes goes on
// from the step where the previous run into its --out stopped, and each run
// into an --out leaves its latest checkpoint at its last step.
func TestQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "## Quick start")
	if _, block, ok = strings.Cut(block, "```sh\n"); !ok {
		t.Fatal("README.md: no sh block after ## Quick start")
	}
	block, _, _ = strings.Cut(block, "```")
	t.Chdir(t.TempDir())
	end := map[string]int64{} // --out DIR -> the step its run ended at
	lines := 0
	for line := range strings.Lines(block) {
		line, _, _ = strings.Cut(line, "#")
		args := strings.Fields(line)
		if len(args) < 2 || args[0] != "./strata" || args[1] != "train" {
			continue
		}
		lines++
		args = append(args[1:], "--no-progress")
		flags := map[string]string{}
		for i := 1; i+1 < len(args); i++ {
			if strings.HasPrefix(args[i], "--") {
				flags[args[i]] = args[i+1]
			}
		}
		_, stderr, err := runApp(t, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, stderr)
		}
		if from := flags["--resume"]; from != "" {
			if w := fmt.Sprintf("resumed from step %d", end[from]); end[from] == 0 || !strings.Contains(stderr, w) {
				t.Errorf("%s: stderr lacks %q (the previous run into %s ended at step %d):\n%s", line, w, from, end[from], stderr)
			}
		}
		if out := flags["--out"]; out != "" {
			m, _, err := checkpoint.ReadManifest(filepath.Join(out, "checkpoints"))
			if err != nil {
				t.Fatalf("%s: no checkpoint: %v", line, err)
			}
			steps := int64(demoSteps)
			if s := flags["--steps"]; s != "" {
				fmt.Sscan(s, &steps)
			}
			if m.Step != steps {
				t.Errorf("%s: latest checkpoint at step %d, the run ended at %d: a resume would redo steps %d-%d", line, m.Step, steps, m.Step+1, steps)
			}
			end[out] = steps
		}
	}
	if lines < 3 {
		t.Fatalf("README.md's quick start has %d `./strata train` lines", lines)
	}
}
