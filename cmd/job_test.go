package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/internal/mpitest"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// mpiStrata runs `strata args...` as np processes of one mpirun job (this
// test binary, run by TestMain) and returns mpirun's output.
func mpiStrata(t *testing.T, np int, args ...string) (string, error) {
	t.Helper()
	mpitest.Need(t)
	a, _ := json.Marshal(args)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := mpitest.Command(ctx, np, []string{"STRATA_TEST_MAIN=" + string(a)}, os.Args[0]).CombinedOutput()
	return string(out), err
}

// jobConfig is a small run: stage, the optimizer and params where given
// (nvme under nv), a batch that splits over 4 ranks.
func jobConfig(t *testing.T, stage int, param, opt, nv string) string {
	path := ""
	if nv != "" {
		path = `, "nvme_path": "` + nv + `"`
	}
	return writeFile(t, fmt.Sprintf("stage%d-%s-%s.json", stage, param, opt), fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": %d, "stage3_param_persistence_threshold": 1000,
    "offload_param": {"device": %q%s}, "offload_optimizer": {"device": %q%s}},
  "strata": {"model": "small", "devices": 4, "seq_len": 32, "seed": 5, "host_budget": "64MiB"}
}`, stage, param, path, opt, path))
}

// TestTrainAcrossProcesses: `mpirun -np 2 strata train --devices 2` ends
// with the weights and losses of `strata train --devices 4`, bit for bit,
// at stages 0-3 with the optimizer on the device, on the host, and params
// and optimizer on the host and on NVMe; the 2×2 job's checkpoint of step
// 3 resumes as 1×4 and as 4×1 (mpirun -np 4 --devices 1) to the same bits.
func TestTrainAcrossProcesses(t *testing.T) {
	nv := nvmetest.Dir(t)
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	corpus := writeFile(t, "corpus.txt", string(text))
	held := writeFile(t, "held.txt", strings.Repeat("held out text. ", 60)[:16*32+1]) // 16 rows of 32: 2 rounds of 4 ranks × 2 rows
	cases := []struct {
		stage      int
		param, opt string
	}{
		{0, "none", "none"}, {1, "none", "none"}, {2, "none", "cpu"}, {3, "none", "none"}, {3, "cpu", "cpu"}, {3, "nvme", "nvme"},
	}
	for _, c := range cases {
		name := fmt.Sprintf("stage%d/param-%s/opt-%s", c.stage, c.param, c.opt)
		dirNV := ""
		if c.param == "nvme" || c.opt == "nvme" {
			dirNV = nv
		}
		cfg := jobConfig(t, c.stage, c.param, c.opt, dirNV)
		job, one := filepath.Join(t.TempDir(), "job"), filepath.Join(t.TempDir(), "one")
		common := []string{"train", "--config", cfg, "--steps", "6", "--save-every", "3", "--keep", "3", "--no-progress"}
		if c.param == "cpu" {
			// Real text, tokenized by each process, and a held-out set
			// evaluated every 2 steps: the losses exchanged across processes.
			common = append(common, "--data", corpus, "--eval-data", held, "--eval-every", "2")
		}
		if out, err := mpiStrata(t, 2, append(common, "--devices", "2", "--out", job)...); err != nil {
			t.Fatalf("%s: mpirun -np 2: %v\n%s", name, err, out)
		}
		if _, stderr, err := run(t, append(common, "--devices", "4", "--out", one)...); err != nil {
			t.Fatalf("%s: --devices 4: %v\n%s", name, err, stderr)
		}
		sameRun(t, name+": 2×2 against 1×4", job, one)
		if ea, eb := evalLosses(t, job), evalLosses(t, one); c.param == "cpu" && (len(eb) != 3 || fmt.Sprint(ea) != fmt.Sprint(eb)) {
			t.Errorf("%s: eval losses %v, one process %v (want 3 each, equal)", name, ea, eb)
		}
		var sum struct{ Devices, Processes int }
		if b, err := os.ReadFile(filepath.Join(job, "summary.json")); err != nil || json.Unmarshal(b, &sum) != nil || sum.Devices != 4 || sum.Processes != 2 {
			t.Errorf("%s: the job's summary.json: %v, devices %d processes %d, want 4 and 2", name, err, sum.Devices, sum.Processes)
		}
		if _, err := os.Stat(filepath.Join(job, "config.json")); err != nil {
			t.Errorf("%s: the job wrote no config.json: %v", name, err)
		}
		if c.param != "nvme" {
			continue
		}
		step3 := filepath.Join(job, "checkpoints", "step-00000003")
		resumed := filepath.Join(t.TempDir(), "resumed")
		if _, stderr, err := run(t, "train", "--resume", step3, "--devices", "4", "--steps", "6", "--out", resumed, "--no-progress"); err != nil {
			t.Fatalf("%s: resume as 1×4: %v\n%s", name, err, stderr)
		}
		sameWeights(t, name+": resumed 1×4", resumed, one)
		resumed4 := filepath.Join(t.TempDir(), "resumed4")
		if out, err := mpiStrata(t, 4, "train", "--resume", step3, "--devices", "1", "--steps", "6", "--out", resumed4, "--no-progress"); err != nil {
			t.Fatalf("%s: resume as 4×1: %v\n%s", name, err, out)
		}
		sameWeights(t, name+": resumed 4×1", resumed4, one)
	}
}

// sameRun: the two runs' weights and every step's loss are equal.
func sameRun(t *testing.T, name, a, b string) {
	t.Helper()
	sameWeights(t, name, a, b)
	la, lb := stepLosses(t, a), stepLosses(t, b)
	if len(la) != 6 || len(lb) != 6 {
		t.Fatalf("%s: %d and %d steps in steps.jsonl, want 6", name, len(la), len(lb))
	}
	for s, l := range lb {
		if la[s] != l {
			t.Errorf("%s: step %d loss %v, want %v", name, s, la[s], l)
		}
	}
}

func sameWeights(t *testing.T, name, a, b string) {
	t.Helper()
	wa, err := os.ReadFile(filepath.Join(a, "model.safetensors"))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	wb, err := os.ReadFile(filepath.Join(b, "model.safetensors"))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !bytes.Equal(wa, wb) {
		t.Errorf("%s: model.safetensors differ", name)
	}
}

// TestTrainProcessKilled: one process of a 2×2 job killed (SIGKILL)
// mid-run: the job ends within 60 s, mpirun naming the lost rank, and the
// run directory's latest checkpoint loads.
func TestTrainProcessKilled(t *testing.T) {
	cfg := jobConfig(t, 3, "none", "cpu", "")
	out := filepath.Join(t.TempDir(), "run")
	cmd, log := startJob(t, cfg, out, 5, "--save-every", "2") // a checkpoint and a few more steps
	kids, err := exec.Command("pgrep", "-P", strconv.Itoa(cmd.Process.Pid)).Output()
	if err != nil {
		t.Fatalf("the job's processes: %v", err)
	}
	pids := strings.Fields(string(kids))
	if len(pids) != 2 {
		t.Fatalf("mpirun has %d children (%v), want 2", len(pids), pids)
	}
	victim, _ := strconv.Atoi(pids[len(pids)-1])
	start := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("the job ended well after a process was killed:\n%s", log.String())
	}
	if took > 60*time.Second {
		t.Errorf("the job ended %s after a process was killed, want within 60 s", took)
	}
	if !regexp.MustCompile(`process rank \d+ with PID \d+ on node \S+ exited on\s+signal 9`).MatchString(log.String()) {
		t.Errorf("no line names the lost rank:\n%s", log.String())
	}
	t.Logf("ended %s after the kill", took.Round(time.Millisecond))
	m, dir, err := checkpoint.ReadManifest(filepath.Join(out, "checkpoints"))
	if err != nil {
		t.Fatalf("latest checkpoint: %v", err)
	}
	if _, stderr, err := run(t, "train", "--resume", dir, "--devices", "4", "--steps", strconv.FormatInt(m.Step+1, 10), "--no-progress"); err != nil {
		t.Fatalf("resume from %s (step %d): %v\n%s", dir, m.Step, err, stderr)
	}
}

// TestTrainJobStops: SIGUSR1 to mpirun (which passes it to every process;
// Ctrl-C it turns into SIGTERM and SIGKILL a second later): whichever
// process sees it first, all stop after the same step; process 0 saves it
// and prints the command that goes on, mpirun first with the options it
// was given; the job ends with status 0; the checkpoint is the last line of
// steps.jsonl.
func TestTrainJobStops(t *testing.T) {
	cfg := jobConfig(t, 3, "none", "cpu", "")
	out := filepath.Join(t.TempDir(), "run")
	cmd, log := startJob(t, cfg, out, 3)
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil || strings.Contains(log.String(), "abort") {
		// A stop asked for and saved is no failure: exit 0, and no "job
		// aborted" banner of mpirun's.
		t.Errorf("the job stopped on SIGUSR1: %v, want exit 0 without mpirun's banner:\n%s", err, log.String())
	}
	m, _, err := checkpoint.ReadManifest(filepath.Join(out, "checkpoints"))
	if err != nil {
		t.Fatalf("no checkpoint after the stop: %v\n%s", err, log.String())
	}
	losses := stepLosses(t, out)
	if int64(len(losses)) != m.Step {
		t.Errorf("checkpoint of step %d, steps.jsonl has %d steps", m.Step, len(losses))
	}
	want := fmt.Sprintf("stopped after step %d of 100000, checkpoint", m.Step)
	// The command that goes on is mpirun's own, with its options.
	if !strings.Contains(log.String(), want) || !regexp.MustCompile(`go on with: \S*mpirun -np 2 --oversubscribe --bind-to none strata train --resume `+regexp.QuoteMeta(out)).MatchString(log.String()) {
		t.Errorf("no line %q with the command that goes on:\n%s", want, log.String())
	}
}

// TestTrainJobRefusals: a job torchrun started (its variables), one
// without --devices, and a bad launcher variable: each one error saying
// what to do, before anything runs.
func TestTrainJobRefusals(t *testing.T) {
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "29500"}, []string{"--devices", "1"}, "launch with mpirun -np 2 (or srun --mpi=pmix)"},
		{[]string{"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2"}, nil, "needs --devices, each process's devices"},
		{[]string{"OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "2"}, []string{"--devices", "1"}, "OMPI_COMM_WORLD_RANK=2 is outside the job"},
		{nil, []string{"--devices", "1", "--nnodes", "2"}, "--nnodes 2 needs --master HOST:PORT"},
	} {
		for i := 0; i < len(c.env); i += 2 {
			t.Setenv(c.env[i], c.env[i+1])
		}
		_, _, err := run(t, append([]string{"train", "--steps", "1"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want an error containing %q", c.env, c.args, err, c.want)
		}
		for i := 0; i < len(c.env); i += 2 {
			os.Unsetenv(c.env[i])
		}
	}
}

// startJob starts `strata train --config cfg --devices 2 --steps 100000
// --out out` plus args as a job of 2 processes and waits until steps.jsonl
// has n lines; it returns mpirun's command and its output so far.
func startJob(t *testing.T, cfg, out string, n int, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	return startJobEnv(t, nil, cfg, out, n, args...)
}

// startJobEnv is startJob with env added to the processes' environment.
func startJobEnv(t *testing.T, env []string, cfg, out string, n int, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	mpitest.Need(t)
	a, _ := json.Marshal(append([]string{"train", "--config", cfg, "--devices", "2", "--steps", "100000", "--out", out, "--no-progress"}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cmd := mpitest.Command(ctx, 2, append([]string{"STRATA_TEST_MAIN=" + string(a)}, env...), os.Args[0])
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(out, "steps.jsonl"))
		if n == 0 || bytes.Count(b, []byte("\n")) >= n {
			return cmd, log
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job wrote no %d steps in 2 minutes:\n%s", n, log.String())
		}
	}
}

// evalLosses are the eval losses of steps.jsonl, in order.
func evalLosses(t *testing.T, dir string) []float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var l struct {
			Eval *float64 `json:"eval_loss"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if l.Eval != nil {
			out = append(out, *l.Eval)
		}
	}
	return out
}

// TestBenchComm: `mpirun -np 2 strata bench comm --json` reports the two
// all-reduces of the same bytes with equal sums (a + b either way), and
// outside a job it says how to run it.
func TestBenchComm(t *testing.T) {
	out, err := mpiStrata(t, 2, "bench", "comm", "--size", "1MiB", "--rounds", "3", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var res struct {
		Processes int       `json:"processes"`
		Bytes     int64     `json:"bytes"`
		Identical bool      `json:"identical"`
		Ratio     float64   `json:"ratio"`
		StrataS   []float64 `json:"strata_s"`
	}
	line := out[strings.Index(out, "{"):]
	if err := json.Unmarshal([]byte(strings.TrimSpace(line[:strings.Index(line, "\n")+1])), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if res.Processes != 2 || res.Bytes != 1<<20 || !res.Identical || !(res.Ratio > 0) || len(res.StrataS) != 3 {
		t.Errorf("bench comm: %+v", res)
	}
	if _, _, err := run(t, "bench", "comm"); err == nil || !strings.Contains(err.Error(), "mpirun -np 2 strata bench comm") {
		t.Errorf("bench comm alone: %v", err)
	}
}
