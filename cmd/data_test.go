package cmd

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
)

// dataConfig is a small run (tiny model, ZeRO-3 on 2 devices, the
// optimizer on the host) for the --data tests.
const dataConfig = `{
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": "tiny", "devices": 2, "seq_len": 32, "seed": 5}
}`

// TestTrainDataStreamed: `strata train --data FILE` (the file read in
// windows) ends bit-identical to the same run on the same bytes held in
// memory, the way --data read them before: every step's loss and the
// written model.safetensors.
func TestTrainDataStreamed(t *testing.T) {
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	data := writeFile(t, "corpus.txt", string(text))
	cfgPath := writeFile(t, "data.json", dataConfig)
	dir := t.TempDir()
	const steps = 6
	if _, stderr, err := runApp(t, "train", "--config", cfgPath, "--data", data, "--steps", strconv.Itoa(steps), "--out", dir, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}

	// The same run, its corpus in memory (model.Tokens as engine.Options.Corpus).
	cfg, err := config.Load(filepath.Join(dir, "config.json"), config.Options{LookupShape: lookupShape})
	if err != nil {
		t.Fatal(err)
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: cfg.Strata.Devices, HBMBytes: cfg.Strata.HBMBytes})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, cpu.Devices(devs), comms, engine.Options{Corpus: model.Tokens(model.Encode(text))})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	want := map[int64]float64{}
	if err := e.Run(steps, func(st engine.StepStats) error { want[st.Step] = st.Loss; return nil }); err != nil {
		t.Fatal(err)
	}
	sameLosses(t, "--data streamed", stepLosses(t, dir), want, 1, steps)
	memDir := t.TempDir()
	if err := writeRunOut(memDir, e, e.Summary(), 0, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if mem, _ := os.ReadFile(filepath.Join(memDir, "model.safetensors")); !bytes.Equal(got, mem) {
		t.Error("model.safetensors of the streamed run differs from the in-memory run's")
	}
}

// TestTrainDataRSS: a 4 GiB data file (sparse, with text at scattered
// offsets) trains 3 steps in a child process whose peak RSS stays within
// that of the same run on a 64 MiB file + 32 MiB: memory does not grow
// with the file. The parent samples the child's RSS and kills it past the
// bound, so a corpus read whole fails here without filling the machine.
func TestTrainDataRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two training processes and a 4 GiB sparse file")
	}
	text, err := os.ReadFile("../testdata/train/corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgPath := writeFile(t, "data.json", dataConfig)
	small := filepath.Join(dir, "small.txt")
	f, err := os.Create(small)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat(text, (1<<20)/len(text)+1)[:1<<20]
	for range 64 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	large := filepath.Join(dir, "large.txt")
	if f, err = os.Create(large); err != nil {
		t.Fatal(err)
	}
	const largeBytes = 4 << 30
	if err := f.Truncate(largeBytes); err != nil {
		t.Fatal(err)
	}
	for i := range int64(64) {
		if _, err := f.WriteAt(text, i*(largeBytes/64)+i*4099); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	const slackBytes = 32 << 20
	base := childPeakRSS(t, 0, "train", "--config", cfgPath, "--data", small, "--steps", "3", "--no-progress")
	bound := base + slackBytes
	peak := childPeakRSS(t, bound, "train", "--config", cfgPath, "--data", large, "--steps", "3", "--no-progress")
	t.Logf("peak RSS: %d MiB on a 64 MiB file, %d MiB on a 4 GiB file (bound %d MiB)", base>>20, peak>>20, bound>>20)
	if peak > bound {
		t.Errorf("peak RSS %d MiB on a 4 GiB file, over %d MiB (the 64 MiB file's %d MiB + %d MiB): memory grows with the file",
			peak>>20, bound>>20, base>>20, slackBytes>>20)
	}
}

// childPeakRSS runs `strata args...` in a child process and returns its
// peak RSS in bytes (getrusage's maxrss). With bound > 0 it samples the
// child's RSS every 10 ms and kills it once above bound, returning the
// sample.
func childPeakRSS(t *testing.T, bound int64, args ...string) int64 {
	t.Helper()
	c := startChild(t, "", "", args...)
	done := make(chan int, 1)
	go func() { done <- c.wait() }()
	var over int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case code := <-done:
			if over > 0 {
				return over
			}
			if code != 0 {
				t.Fatalf("strata %s: exit status %d\n%s", strings.Join(args, " "), code, c.stderr.String())
			}
			return c.cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB on Linux
		case <-tick.C:
			if rss := procRSS(c.cmd.Process.Pid); bound > 0 && rss > bound && over == 0 {
				over = rss
				c.cmd.Process.Kill()
			}
		}
	}
}

// procRSS is the resident set size of process pid in bytes (VmRSS of
// /proc/pid/status), 0 when it cannot be read.
func procRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kib << 10
		}
	}
	return 0
}
