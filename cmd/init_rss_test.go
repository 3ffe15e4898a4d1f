package cmd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// peakRSS is the VmHWM of process pid (/proc/PID/status), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(rest) // "123456 kB"
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil || len(f) != 2 || f[1] != "kB" {
				t.Fatalf("VmHWM line %q", line)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestTrainInitStreamsRSS is the must-show of --init: a model of 50.8M
// params (194 MiB in fp32, a 97 MiB Hugging Face file of bf16; 256 blocks
// of 775 KiB in fp32, 3076 tensors) imported into a run whose params and
// optimizer state live on NVMe, with a host budget of 14 MiB (the least
// its tier store takes), peaks at no more than the resident set of the
// same run initialised from the seed plus 4 chunks in fp32 and 2 KiB per
// tensor (the headers and the placement of every tensor, which the import
// keeps: 1.2 KiB per tensor measured), and far under the model's fp32
// bytes: the weights pass through host memory a chunk at a time. Peak RSS
// is VmHWM of a `strata train` child process, read while it waits at
// start-up (the engine built, every weight written to its tier).
func TestTrainInitStreamsRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 97 MB model and 300 MB of swap twice (-short)")
	}
	if raceDetector {
		t.Skip("under the race detector a peak RSS measures its shadow memory, not the program (CI runs this test without -race too)")
	}
	nv := nvmetest.Dir(t)
	shape := model.Shape{Name: "rss-gpt2", Arch: model.ArchGPT2, Layers: 256, Dim: 128, Heads: 4, Vocab: 256, MaxSeq: 64}
	l, err := model.NewLayout(shape)
	if err != nil {
		t.Fatal(err)
	}
	hfDir := filepath.Join(t.TempDir(), "rss-gpt2")
	_, err = hf.ExportDir(hfDir, l, hf.DirOptions{DType: dtype.BF16}, func(w *hf.ExportWriter) error {
		for c := range l.Chunks {
			if err := w.F32(c, l.InitChunk(5, c)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	chunkBytes, tensors := int64(0), int64(0)
	for _, ch := range l.Chunks {
		chunkBytes = max(chunkBytes, 4*int64(ch.Len))
		tensors += int64(len(ch.Tensors))
	}
	modelBytes := 4 * l.ParamCount()
	const hostBudget = 14 << 20 // the least the tier store takes: 10.6 MiB and a quarter
	fi, _ := os.Stat(filepath.Join(hfDir, "model.safetensors"))
	shapeJSON, _ := json.Marshal(shape)
	cfg := func(withModel bool) string {
		m := ""
		if withModel {
			m = `, "model": ` + string(shapeJSON)
		}
		return writeFile(t, "nvme.json", `{
  "train_micro_batch_size_per_gpu": 1,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
    "offload_param": {"device": "nvme", "nvme_path": "`+nv+`"}, "offload_optimizer": {"device": "nvme", "nvme_path": "`+nv+`"}},
  "strata": {"devices": 2, "seq_len": 16, "hbm_bytes": "48MiB", "host_budget": `+strconv.Itoa(hostBudget)+m+`}
}`)
	}
	measure := func(args ...string) (int64, *child) {
		goFile := filepath.Join(t.TempDir(), "go")
		c := startChild(t, "start-up#1", goFile, append([]string{"train", "--no-progress", "--steps", "1"}, args...)...)
		c.waitAt(t, "start-up")
		return peakRSS(t, c.cmd.Process.Pid), c
	}
	seeded, c := measure("--config", cfg(true))
	c.cmd.Process.Kill()
	c.wait()
	imported, c := measure("--config", cfg(false), "--init", hfDir)
	c.cmd.Process.Kill()
	c.wait()
	bound := seeded + 4*chunkBytes + 2048*tensors
	t.Logf("model %d params, %s in fp32 (file %s of bf16), largest chunk %s in fp32, %d tensors, host budget %s: peak RSS seeded %s, imported %s (bound %s = seeded + 4 chunks + 2 KiB per tensor; imported - seeded = %.2f chunks)",
		l.ParamCount(), units.FormatBytes(modelBytes), units.FormatBytes(fi.Size()), units.FormatBytes(chunkBytes), tensors, units.FormatBytes(hostBudget),
		units.FormatBytes(seeded), units.FormatBytes(imported), units.FormatBytes(bound), float64(imported-seeded)/float64(chunkBytes))
	if imported > bound {
		t.Errorf("peak RSS of the import %s is over the seeded run's %s plus 4 chunks and 2 KiB per tensor (%s)", units.FormatBytes(imported), units.FormatBytes(seeded), units.FormatBytes(bound))
	}
	if imported >= modelBytes {
		t.Errorf("peak RSS of the import %s is not under the model's fp32 bytes %s", units.FormatBytes(imported), units.FormatBytes(modelBytes))
	}
}
