package cmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// monitorConfig enables both of DeepSpeed's monitors on a tiny fp16 run
// of 2 devices (train_batch_size 4: the x of step s is 4s): TensorBoard in
// its default directory, the CSV files in csv/job, both inside --out.
const monitorConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4, "warmup_type": "linear"}},
  "fp16": {"enabled": true},
  "zero_optimization": {"stage": 2},
  "tensorboard": {"enabled": true},
  "csv_monitor": {"enabled": true, "output_path": "csv", "job_name": "job"},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 5}
}`

// jsonlSteps reads steps.jsonl by step.
func jsonlSteps(t *testing.T, dir string) []stepLine {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []stepLine
	for line := range bytes.Lines(b) {
		var l stepLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("steps.jsonl: %v", err)
		}
		out = append(out, l)
	}
	return out
}

// csvRow is a row of a monitor's CSV file.
type csvRow struct {
	x int64
	v float64
}

// readMonitorCSV reads one of DeepSpeed's CSV files: its header must be
// "step,name" and every line end in "\r\n" (Python's csv writer).
func readMonitorCSV(t *testing.T, path, name string) []csvRow {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\r\n")
	if lines[len(lines)-1] != "" || lines[0] != "step,"+name+"\r\n" {
		t.Fatalf("%s: %q: want a header step,%s and lines ending in \\r\\n", path, b, name)
	}
	var rows []csvRow
	for _, l := range lines[1 : len(lines)-1] {
		xs, vs, ok := strings.Cut(strings.TrimSuffix(l, "\r\n"), ",")
		x, err1 := strconv.ParseInt(xs, 10, 64)
		v, err2 := strconv.ParseFloat(vs, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("%s: row %q", path, l)
		}
		rows = append(rows, csvRow{x, v})
	}
	return rows
}

// tbScalar is a scalar read back from an event file.
type tbScalar struct {
	Tag   string  `json:"tag"`
	Step  int64   `json:"step"`
	Value float64 `json:"value"`
}

// readEventFile reads an event file with monitor's independent reader
// (standard-library Python: CRC-32C and protocol buffers by hand).
func readEventFile(t *testing.T, path string) map[string][]csvRow {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "../monitor/testdata/read_tfevents.py", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("read_tfevents.py %s: %v: %s", path, err, stderr.String())
	}
	got := map[string][]csvRow{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var s tbScalar
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		if s.Tag != "" {
			got[s.Tag] = append(got[s.Tag], csvRow{s.Step, s.Value})
		}
	}
	return got
}

// monitorWant is what the monitors must hold for lines of steps.jsonl:
// tag -> rows, x = 4 × step.
func monitorWant(lines []stepLine) map[string][]csvRow {
	want := map[string][]csvRow{}
	for _, l := range lines {
		x := 4 * l.Step
		add := func(tag string, v float64) { want[tag] = append(want[tag], csvRow{x, v}) }
		add("Train/Samples/train_loss", float64(l.Loss))
		add("Train/Samples/lr", l.LR)
		add("Train/Samples/loss_scale", l.LossScale)
		if l.EvalLine != nil {
			add("Train/Samples/eval_loss", l.EvalLine.Loss)
		}
		add("Strata/step_s", l.StepSeconds)
		add("Strata/tokens_per_s", l.TokensPerSecond)
		add("Strata/bytes_host_to_device", float64(l.HostToDevice))
	}
	return want
}

// checkMonitors compares the CSV files with steps.jsonl's lines and the
// scalars of an event file (float32 there) with its lines tbLines.
func checkMonitors(t *testing.T, what string, csvDir string, events map[string][]csvRow, lines, tbLines []stepLine) {
	t.Helper()
	for tag, rows := range monitorWant(lines) {
		name := tag[strings.LastIndex(tag, "/")+1:]
		file := strings.ReplaceAll(tag, "/", "_") + ".csv"
		if got := readMonitorCSV(t, filepath.Join(csvDir, file), name); !slices.Equal(got, rows) {
			t.Errorf("%s: %s: %v, want steps.jsonl's %v", what, file, got, rows)
		}
	}
	want := monitorWant(tbLines)
	for tag, rows := range want {
		var f32 []csvRow
		for _, r := range rows {
			f32 = append(f32, csvRow{r.x, float64(float32(r.v))})
		}
		if got := events[tag]; !slices.Equal(got, f32) {
			t.Errorf("%s: event file's %s: %v, want steps.jsonl's %v", what, tag, got, f32)
		}
	}
	// Strata's other tags: one event a step.
	for tag, rows := range events {
		if len(rows) != len(tbLines) && want[tag] == nil && tag != "Train/Samples/eval_loss" {
			t.Errorf("%s: event file's %s has %d events for %d steps", what, tag, len(rows), len(tbLines))
		}
	}
}

// TestMonitorTrain: `strata train` with both monitors writes a CSV row and
// an event per step and tag, the values of steps.jsonl at x = samples; a
// run resumed from an older checkpoint drops the CSV rows past it and
// appends, and starts a second event file.
func TestMonitorTrain(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Fatalf("/usr/bin/python3: %v (the event files' reader runs on Debian's python3, standard library only)", err)
	}
	cfg := writeFile(t, "monitor.json", monitorConfig)
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 40)[:8*16+1])
	out := filepath.Join(t.TempDir(), "run")
	train := func(args ...string) {
		t.Helper()
		_, stderr, err := runApp(t, trainArgs(cfg, append([]string{"--eval-data", held, "--eval-every", "2", "--out", out}, args...)...)...)
		if err != nil {
			t.Fatalf("strata train %v: %v\n%s", args, err, stderr)
		}
	}
	train("--steps", "4", "--save-every", "2")
	tbDir, csvDir := filepath.Join(out, "DeepSpeedJobName"), filepath.Join(out, "csv", "job")
	files, _ := filepath.Glob(filepath.Join(tbDir, "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("event files %v, want one in %s", files, tbDir)
	}
	first := files[0]
	lines := jsonlSteps(t, out)
	if len(lines) != 4 || lines[1].EvalLine == nil || lines[0].LossScale == 0 {
		t.Fatalf("steps.jsonl: %+v, want 4 fp16 steps, evaluated after step 2", lines)
	}
	checkMonitors(t, "4 steps", csvDir, readEventFile(t, first), lines, lines)

	// Resumed from step 2 into its own directory: steps 3-5 again. The CSV
	// files drop the first run's rows of steps 3 and 4 and append; a new
	// event file holds steps 3-5.
	train("--steps", "5", "--resume", filepath.Join(out, "checkpoints", "step-00000002"))
	lines = jsonlSteps(t, out)
	if len(lines) != 5 {
		t.Fatalf("steps.jsonl after the resume: %d lines, want 5", len(lines))
	}
	files, _ = filepath.Glob(filepath.Join(tbDir, "events.out.tfevents.*"))
	if len(files) != 2 || !slices.Contains(files, first) {
		t.Fatalf("event files %v after the resume, want %s and a new one", files, first)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return f == first })
	checkMonitors(t, "resumed", csvDir, readEventFile(t, files[0]), lines, lines[2:])
}

// TestMonitorWandbRefused: a config enabling wandb is refused before the
// run starts, in one line that says why and what to use instead.
func TestMonitorWandbRefused(t *testing.T) {
	cfg := writeFile(t, "wandb.json", strings.Replace(monitorConfig, `"tensorboard": {"enabled": true},`, `"wandb": {"enabled": true, "project": "p"},`, 1))
	out := filepath.Join(t.TempDir(), "run")
	_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "2", "--out", out)...)
	if err == nil || !strings.Contains(err.Error(), `wandb.enabled: true is not supported: Strata has no wandb client`) ||
		!strings.Contains(err.Error(), `enable "tensorboard" or "csv_monitor" instead`) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("wandb enabled: %v, want one line refusing it\n%s", err, stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("the refused run made %s", out)
	}
}

// TestMonitorDiskFills: the monitors' filesystem fills after step 2 and is
// freed after step 10 of 12. The run goes on; each monitor warns at the
// first step of each run of refused steps and the summary counts them; the
// event file reads back whole (its CRCs and framing intact), every step in
// it complete; the CSV eval_loss file, due at steps 5 and 10 (refused: a
// new file needs a page), starts at step 12 with its header.
func TestMonitorDiskFills(t *testing.T) {
	disk := t.TempDir()
	mountOrSkip(t, disk, "-t", "tmpfs", "-o", "size=1m", "tmpfs")
	js := strings.Replace(monitorConfig, `"tensorboard": {"enabled": true},`, `"tensorboard": {"enabled": true, "output_path": "`+disk+`"},`, 1)
	js = strings.Replace(js, `"output_path": "csv"`, `"output_path": "`+disk+`/csv"`, 1)
	cfg := writeFile(t, "monitor.json", js)
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 40)[:8*16+1])
	filler := filepath.Join(disk, "filler")
	steps := 0
	testHook = func(p string) error {
		if p == "step" {
			switch steps++; steps {
			case 2:
				fillTo(disk, 0)
			case 10:
				os.Remove(filler)
			}
		}
		return nil
	}
	t.Cleanup(func() { testHook = nil })
	out := filepath.Join(t.TempDir(), "run")
	stdout, stderr, err := runApp(t, trainArgs(cfg, "--steps", "12", "--eval-data", held, "--eval-every", "5", "--out", out)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(disk, "DeepSpeedJobName", "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("event files %v", files)
	}
	events := readEventFile(t, files[0])
	var tbSteps []int64
	for _, r := range events["Train/Samples/train_loss"] {
		tbSteps = append(tbSteps, r.x/4)
	}
	// The event file's page fills some step after 2; from then on every
	// step is refused until the disk is freed.
	lost := 12 - len(tbSteps)
	if lost < 2 || tbSteps[len(tbSteps)-3] != 10-int64(lost) || !slices.Equal(tbSteps[len(tbSteps)-2:], []int64{11, 12}) {
		t.Fatalf("the event file holds steps %v: want 1, 2, ..., k, 11, 12, with at least two lost", tbSteps)
	}
	var kept []stepLine
	for _, l := range jsonlSteps(t, out) {
		if slices.Contains(tbSteps, l.Step) {
			kept = append(kept, l)
		}
	}
	checkMonitors(t, "full disk", filepath.Join(disk, "csv", "job"), events, nil, kept)
	if n := strings.Count(stderr, "warning: tensorboard: the events of step "); n != 1 || !strings.Contains(stderr, "no space left on device") {
		t.Errorf("%d tensorboard warnings, want 1 naming the cause:\n%s", n, stderr)
	}
	for _, s := range []int{5, 10} {
		if n := strings.Count(stderr, fmt.Sprintf("warning: csv_monitor: the events of step %d were not written", s)); n != 1 {
			t.Errorf("%d csv_monitor warnings of step %d, want 1:\n%s", n, s, stderr)
		}
	}
	for _, w := range []string{fmt.Sprintf("tensorboard: the events of %d steps were not written to %s", lost, files[0]),
		"csv_monitor: the events of 2 steps were not written to " + filepath.Join(disk, "csv", "job")} {
		if !strings.Contains(stdout, w) {
			t.Errorf("the summary lacks %q:\n%s", w, stdout)
		}
	}
	rows := readMonitorCSV(t, filepath.Join(disk, "csv", "job", "Train_Samples_eval_loss.csv"), "eval_loss")
	if len(rows) != 1 || rows[0].x != 48 {
		t.Errorf("Train_Samples_eval_loss.csv rows %v, want step 12's alone", rows)
	}
}

// TestMonitorNVMe: with params and optimizer on NVMe (the host optimizer),
// the CSV files of Strata's tier tags hold steps.jsonl's bytes read from
// and written to NVMe and the host optimizer's exposed time, every step.
func TestMonitorNVMe(t *testing.T) {
	d := nvmetest.Dir(t)
	cfg := writeFile(t, "nvme.json", `{
  "train_micro_batch_size_per_gpu": 2,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "`+d+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+d+`"}},
  "csv_monitor": {"enabled": true},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 16, "seed": 3}
}`)
	out := filepath.Join(t.TempDir(), "run")
	if _, stderr, err := runApp(t, trainArgs(cfg, "--steps", "4", "--out", out)...); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	csvDir := filepath.Join(out, "DeepSpeedJobName")
	want := map[string][]csvRow{}
	var moved float64
	for _, l := range jsonlSteps(t, out) {
		if l.TierLine == nil || l.HostOptLine == nil {
			t.Fatalf("steps.jsonl line %d has no tier or host optimizer figures", l.Step)
		}
		x := 4 * l.Step
		for name, v := range map[string]float64{"bytes_nvme_to_host": float64(l.BytesNVMeToHost), "bytes_host_to_nvme": float64(l.BytesHostToNVMe),
			"adam_exposed_s": l.AdamExposedSeconds, "opt_io_exposed_s": l.IOExposedSeconds, "optimizer_s": l.OptimizerSeconds, "grad_norm": float64(l.GradNorm)} {
			want[name] = append(want[name], csvRow{x, v})
		}
		moved += float64(l.BytesNVMeToHost + l.BytesHostToNVMe)
	}
	if moved == 0 {
		t.Fatal("steps.jsonl: no NVMe bytes in 4 steps of params and optimizer on NVMe")
	}
	for name, rows := range want {
		if got := readMonitorCSV(t, filepath.Join(csvDir, "Strata_"+name+".csv"), name); !slices.Equal(got, rows) {
			t.Errorf("Strata_%s.csv: %v, want steps.jsonl's %v", name, got, rows)
		}
	}
	if _, err := os.Stat(filepath.Join(csvDir, "Train_Samples_loss_scale.csv")); err == nil {
		t.Error("a bf16 run wrote Train_Samples_loss_scale.csv (fp16 only)")
	}
}

// TestMonitorJob: in a job of 2 processes (mpirun), process 0 alone writes
// the monitors: one event and one CSV row per step and tag, with the
// losses of steps.jsonl.
func TestMonitorJob(t *testing.T) {
	cfg := writeFile(t, "job.json", strings.Replace(monitorConfig, `"devices": 2`, `"devices": 4`, 1))
	out := filepath.Join(t.TempDir(), "run")
	if log, err := mpiStrata(t, 2, trainArgs(cfg, "--devices", "2", "--steps", "3", "--out", out)...); err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	files, _ := filepath.Glob(filepath.Join(out, "DeepSpeedJobName", "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("event files %v, want process 0's alone", files)
	}
	events := readEventFile(t, files[0])
	lines := jsonlSteps(t, out)
	var want, rows []csvRow
	for _, l := range lines {
		want = append(want, csvRow{8 * l.Step, float64(float32(l.Loss))})
		rows = append(rows, csvRow{8 * l.Step, float64(l.Loss)})
	}
	if got := events["Train/Samples/train_loss"]; len(lines) != 3 || !slices.Equal(got, want) {
		t.Errorf("train_loss events %v, want steps.jsonl's %v", got, want)
	}
	if got := readMonitorCSV(t, filepath.Join(out, "csv", "job", "Train_Samples_train_loss.csv"), "train_loss"); !slices.Equal(got, rows) {
		t.Errorf("Train_Samples_train_loss.csv: %v, want steps.jsonl's %v", got, rows)
	}
}

// TestMonitorOpenFails: a monitor directory that cannot be made stops the
// run before its first step, naming the path and the config's key.
func TestMonitorOpenFails(t *testing.T) {
	file := writeFile(t, "a-file", "")
	cfg := writeFile(t, "bad.json", strings.Replace(monitorConfig, `"output_path": "csv"`, `"output_path": "`+file+`"`, 1))
	out := filepath.Join(t.TempDir(), "run")
	_, stderr, err := runApp(t, trainArgs(cfg, "--steps", "2", "--out", out)...)
	want := "train: monitor: csv: mkdir " + file + ": not a directory (the directory is the config's csv_monitor.output_path/job_name"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q\n%s", err, want, stderr)
	}
	if strings.Contains(stderr, "step 1:") {
		t.Errorf("the run trained:\n%s", stderr)
	}
}
