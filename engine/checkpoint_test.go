package engine

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// trainFor runs steps steps and returns their losses.
func trainFor(t *testing.T, e *Engine, steps int) []float64 {
	t.Helper()
	var losses []float64
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error {
		losses = append(losses, st.Loss)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return losses
}

func stateOf(t *testing.T, e *Engine) *checkpoint.State {
	t.Helper()
	st, err := e.CheckpointState()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sameState says whether a and b hold the same step and, chunk by chunk,
// the same bytes of every state (gathered: the device counts may differ).
func sameState(t *testing.T, what string, a, b *checkpoint.State) {
	t.Helper()
	if a.Step != b.Step {
		t.Errorf("%s: step %d vs %d", what, a.Step, b.Step)
	}
	for k, spec := range a.States {
		kb := b.StateIndex(spec.Kind)
		if kb < 0 {
			t.Errorf("%s: %s missing", what, spec)
			continue
		}
		diffs := 0
		for c := range a.Chunks {
			if !bytes.Equal(a.Gather(c, k), b.Gather(c, kb)) {
				diffs++
			}
		}
		if diffs > 0 {
			t.Errorf("%s: %s differs in %d of %d chunks", what, spec, diffs, len(a.Chunks))
		}
	}
}

// checkResume is the must-show: train k steps, save, train k more (A); a
// new engine loads the checkpoint and trains k steps (B): the losses of
// steps k+1..2k and the whole final state (params, master, m, v, step)
// are bit-identical.
func checkResume(t *testing.T, newEngine func(*testing.T) *Engine, k int) {
	t.Helper()
	dir := t.TempDir()
	a := newEngine(t)
	trainFor(t, a, k)
	path, err := a.SaveCheckpoint(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, fmt.Sprintf("step-%08d", k)); path != want {
		t.Errorf("saved to %s, want %s", path, want)
	}
	lossA := trainFor(t, a, k)
	stA := stateOf(t, a)

	b := newEngine(t)
	if err := b.LoadCheckpoint(dir); err != nil {
		t.Fatal(err)
	}
	if b.StepCount() != int64(k) {
		t.Fatalf("step %d after load, want %d", b.StepCount(), k)
	}
	lossB := trainFor(t, b, k)
	for i := range lossA {
		if lossA[i] != lossB[i] {
			t.Errorf("step %d: loss %v resumed, %v uninterrupted", k+i+1, lossB[i], lossA[i])
		}
	}
	sameState(t, "resumed vs uninterrupted", stA, stateOf(t, b))
	pa, _ := a.Params()
	pb, _ := b.Params()
	if m, d := diff(pa, pb); m != 0 {
		t.Errorf("Params: %d differ (max %g)", m, d)
	}
}

// TestCheckpointResume is the must-show of resuming: bit-identical
// continuation for stage 3 on 2 devices with the host optimizer, stage 2 on
// 1 device with the device optimizer (and gradient accumulation), and
// stage 3 on 2 devices with params and optimizer state on NVMe.
func TestCheckpointResume(t *testing.T) {
	const k = 10
	for _, s := range []runSpec{
		{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1},
		{stage: 2, n: 1, micro: 2, accum: 2, clip: 1},
	} {
		t.Run(s.String(), func(t *testing.T) {
			checkResume(t, func(t *testing.T) *Engine { return newTestEngine(t, s) }, k)
		})
	}
	s := tierSpec{n: 2, param: "nvme", opt: "nvme"}
	t.Run(s.String(), func(t *testing.T) {
		nvmetest.Require(t)
		checkResume(t, func(t *testing.T) *Engine {
			e := newTierEngine(t, s, Options{})
			if e.tiers == nil || e.tiers.swap == nil {
				t.Fatal("no NVMe swap: the config does not offload to NVMe")
			}
			return e
		}, k)
	})
}

// TestCheckpointResumeAll: the same, shorter, for every stage, N = 1, 2, 4,
// optimizer on the device and on the host, bf16 and fp32, and the other
// tier-store placements.
func TestCheckpointResumeAll(t *testing.T) {
	const k = 3
	var specs []runSpec
	for stage := range 4 {
		for _, n := range []int{1, 2, 4} {
			specs = append(specs, runSpec{stage: stage, n: n, micro: 1, accum: 1, clip: 1})
			if stage > 0 {
				specs = append(specs, runSpec{stage: stage, n: n, offload: true, micro: 1, accum: 1, clip: 1})
			}
		}
	}
	specs = append(specs,
		runSpec{stage: 0, n: 2, micro: 1, accum: 1, fp32: true},
		runSpec{stage: 3, n: 2, micro: 1, accum: 1, fp32: true},
		runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, fp32: true})
	for _, s := range specs {
		t.Run(s.String(), func(t *testing.T) {
			checkResume(t, func(t *testing.T) *Engine { return newTestEngine(t, s) }, k)
		})
	}
	for _, where := range [][2]string{{"cpu", "cpu"}, {"none", "nvme"}, {"cpu", "nvme"}} {
		for _, n := range []int{1, 4} {
			s := tierSpec{n: n, param: where[0], opt: where[1], shapeJSON: deepShapeJSON}
			t.Run(s.String(), func(t *testing.T) {
				if where[1] == "nvme" {
					nvmetest.Require(t)
				}
				checkResume(t, func(t *testing.T) *Engine { return newTierEngine(t, s, Options{}) }, k)
			})
		}
	}
}

// TestCheckpointReshard: a checkpoint of stage 3 on 2 devices (host
// optimizer, 2 micro-batches each) loads on 1 device (4 micro-batches, the
// same global batch) and on 4 devices at stage 1 with the device optimizer:
// the restored state is the saved one bit for bit, the first step's loss
// (same params, same rows, summed in the same order) is bit-identical, and
// the run goes on within the tolerance of TestAcrossDeviceCounts. Not bit
// for bit: with another N the gradient is summed in another grouping (per
// rank in bf16, across ranks in fp32), so runs on different N differ by a
// few bf16 ulps even from the same start (TestAcrossDeviceCounts measures
// 2e-4 after 10 steps with fp32 activations, which these runs keep: with
// bf16 activations a param one ulp apart flips activation roundings and
// the runs drift further).
func TestCheckpointReshard(t *testing.T) {
	const k = 10
	dir := t.TempDir()
	src := runSpec{stage: 3, n: 2, offload: true, micro: 1, accum: 2, clip: 1, fp32Acts: true}
	a := newTestEngine(t, src)
	trainFor(t, a, k)
	if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	saved := stateOf(t, a)
	lossA := trainFor(t, a, k)
	pa, _ := a.Params()

	for _, dst := range []runSpec{
		{stage: 3, n: 1, offload: true, micro: 1, accum: 4, clip: 1, fp32Acts: true},
		{stage: 1, n: 4, micro: 1, accum: 1, clip: 1, fp32Acts: true},
	} {
		t.Run(dst.String(), func(t *testing.T) {
			b := newTestEngine(t, dst)
			if err := b.LoadCheckpoint(dir); err != nil {
				t.Fatal(err)
			}
			got := stateOf(t, b)
			if got.Devices != dst.n {
				t.Fatalf("state on %d devices, want %d", got.Devices, dst.n)
			}
			sameState(t, "restored vs saved", saved, got)
			lossB := trainFor(t, b, k)
			if lossB[0] != lossA[0] {
				t.Errorf("step %d: loss %v on N=%d, %v on N=2", k+1, lossB[0], dst.n, lossA[0])
			}
			for i := range lossA {
				if math.Abs(lossA[i]-lossB[i]) > 1e-3*lossA[i] {
					t.Errorf("step %d: loss %v on N=%d, %v on N=2", k+i+1, lossB[i], dst.n, lossA[i])
				}
			}
			pb, _ := b.Params()
			m, d := diff(pa, pb)
			t.Logf("N=%d after %d resumed steps: %d params differ from N=2, max |diff| %g", dst.n, k, m, d)
			if d > 3e-3 {
				t.Errorf("params differ from the N=2 run by %g", d)
			}
		})
	}
}

// TestCheckpointMismatch: a checkpoint of another shape or precision is
// refused with an error naming what differs, and the engine is unchanged.
func TestCheckpointMismatch(t *testing.T) {
	dir := t.TempDir()
	s := runSpec{stage: 2, n: 2, micro: 1, accum: 1}
	a := newTestEngine(t, s)
	trainFor(t, a, 2)
	if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}

	b := newEngineJSON(t, strings.Replace(s.configJSON(), `"n_layer": 2`, `"n_layer": 3`, 1), s.n)
	before := stateOf(t, b)
	err := b.LoadCheckpoint(dir)
	if err == nil || !strings.Contains(err.Error(), "shape") || !strings.Contains(err.Error(), "L=2") || !strings.Contains(err.Error(), "L=3") {
		t.Errorf("other shape: %v", err)
	}
	sameState(t, "after a refused load", before, stateOf(t, b))

	f := s
	f.fp32 = true
	c := newTestEngine(t, f)
	err = c.LoadCheckpoint(dir)
	if err == nil || !strings.Contains(err.Error(), "param f32") || !strings.Contains(err.Error(), "param bf16") || !strings.Contains(err.Error(), "precision") {
		t.Errorf("fp32 engine, bf16 checkpoint: %v", err)
	}
	if c.StepCount() != 0 {
		t.Errorf("step %d after a refused load", c.StepCount())
	}
}

// newEngineJSON builds an engine for a config text on n CPU devices.
func newEngineJSON(t testing.TB, js string, n int) *Engine {
	t.Helper()
	devs, comms, err := cpu.New(cpu.Options{Devices: n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestCheckpointCorrupt: a flipped byte in a rank file is refused with an
// error naming the file (checkpoint.ErrChecksum), and nothing is restored.
func TestCheckpointCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := runSpec{stage: 3, n: 2, offload: true, micro: 1, accum: 1}
	a := newTestEngine(t, s)
	trainFor(t, a, 2)
	path, err := a.SaveCheckpoint(dir, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(path, "rank-00001.safetensors")
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-100] ^= 0x10 // in the data of the last tensor
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	b := newTestEngine(t, s)
	before := stateOf(t, b)
	err = b.LoadCheckpoint(dir)
	if !errors.Is(err, checkpoint.ErrChecksum) || !strings.Contains(err.Error(), file) {
		t.Fatalf("corrupted file: %v", err)
	}
	sameState(t, "after a refused load", before, stateOf(t, b))
}

// TestCheckpointCrashMidSave: what a save that crashed leaves (a
// temporary directory with a partial rank file; a complete checkpoint
// directory renamed into place but never named by latest) is not what
// LoadCheckpoint picks: it restores the last complete save, and the next
// save clears the leftovers.
func TestCheckpointCrashMidSave(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	s := runSpec{stage: 1, n: 2, micro: 1, accum: 1}
	a := newTestEngine(t, s)
	trainFor(t, a, 3)
	if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	at3 := stateOf(t, a)
	trainFor(t, a, 3)
	// A crash after the rename of step 6, before latest was replaced.
	p6, err := a.SaveCheckpoint(other, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p6, filepath.Join(dir, filepath.Base(p6))); err != nil {
		t.Fatal(err)
	}
	// A crash in the middle of writing step 7's rank files.
	tmp := filepath.Join(dir, ".tmp-step-00000007-123456")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	part, _ := os.ReadFile(filepath.Join(dir, "step-00000003", "rank-00000.safetensors"))
	if err := os.WriteFile(filepath.Join(tmp, "rank-00000.safetensors"), part[:len(part)/2], 0o644); err != nil {
		t.Fatal(err)
	}

	b := newTestEngine(t, s)
	if err := b.LoadCheckpoint(dir); err != nil {
		t.Fatal(err)
	}
	if b.StepCount() != 3 {
		t.Fatalf("loaded step %d, want 3 (the last complete save)", b.StepCount())
	}
	sameState(t, "loaded vs step 3", at3, stateOf(t, b))

	trainFor(t, b, 1)
	if _, err := b.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	ls, err := checkpoint.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ls.Latest != "step-00000004" {
		t.Errorf("latest %q, want step-00000004", ls.Latest)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("the crashed save's temporary directory is still there: %v", err)
	}
}

// TestCheckpointTieredAfterStep: an engine with the tier store refuses a
// restore once it has run a step.
func TestCheckpointTieredAfterStep(t *testing.T) {
	s := tierSpec{n: 1, param: "cpu", opt: "cpu"}
	a := newTierEngine(t, s, Options{})
	trainFor(t, a, 1)
	st := stateOf(t, a)
	if err := a.RestoreState(st); err == nil || !strings.Contains(err.Error(), "new engine") {
		t.Errorf("restore after a step: %v", err)
	}
}

// benchShapeJSON is 3.2M params: 51 MB of model state (16Ψ).
const benchShapeJSON = `{"n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 256, "max_seq_len": 16}`

// BenchmarkCheckpointVsRaw measures, side by side in one run (alternating
// within each iteration), the engine's SaveCheckpoint (collect every
// rank's shards from the devices, host memory or the tier store, then
// checkpoint.SaveWith) against checkpoint.SaveWith of the same state
// already in memory (the anchor: the files alone), LoadCheckpoint into a
// new engine against checkpoint.Load, and a training step:
//
//	go test -run XXX -bench CheckpointVsRaw -benchtime 5x ./engine/
//
// save/raw and load/raw are the engine's overhead over the files; save/step
// is what a checkpoint costs in steps (to choose --save-every).
func BenchmarkCheckpointVsRaw(b *testing.B) {
	type config struct {
		name string
		mk   func(b *testing.B) *Engine
	}
	host := runSpec{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
	dev := runSpec{stage: 2, n: 2, micro: 1, accum: 1, clip: 1}
	nv := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: benchShapeJSON}
	for _, c := range []config{
		{"stage3-N2-host", func(b *testing.B) *Engine {
			return newEngineJSON(b, strings.Replace(host.configJSON(), testShapeJSON, benchShapeJSON, 1), host.n)
		}},
		{"stage2-N2-device", func(b *testing.B) *Engine {
			return newEngineJSON(b, strings.Replace(dev.configJSON(), testShapeJSON, benchShapeJSON, 1), dev.n)
		}},
		{"stage3-N2-nvme-nvme", func(b *testing.B) *Engine { return newTierEngine(b, nv, Options{}) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := c.mk(b)
			if err := e.Run(b.Context(), 2, nil); err != nil {
				b.Fatal(err)
			}
			st, err := e.CheckpointState()
			if err != nil {
				b.Fatal(err)
			}
			dir, raw := b.TempDir(), b.TempDir()
			var tSave, tRaw, tLoad, tRawLoad, tStep time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := e.SaveCheckpoint(dir, checkpoint.Options{Keep: 1}); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := checkpoint.SaveWith(raw, st, checkpoint.Options{Keep: 1}); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				if _, err := e.Step(); err != nil {
					b.Fatal(err)
				}
				t3 := time.Now()
				b.StopTimer()
				fresh := c.mk(b)
				b.StartTimer()
				t4 := time.Now()
				if err := fresh.LoadCheckpoint(dir); err != nil {
					b.Fatal(err)
				}
				t5 := time.Now()
				if _, err := checkpoint.Load(raw); err != nil {
					b.Fatal(err)
				}
				t6 := time.Now()
				b.StopTimer()
				fresh.Close()
				b.StartTimer()
				tSave += t1.Sub(t0)
				tRaw += t2.Sub(t1)
				tStep += t3.Sub(t2)
				tLoad += t5.Sub(t4)
				tRawLoad += t6.Sub(t5)
			}
			n := float64(b.N)
			b.ReportMetric(tSave.Seconds()*1e3/n, "save-ms")
			b.ReportMetric(tSave.Seconds()/tRaw.Seconds(), "save/raw")
			b.ReportMetric(tLoad.Seconds()/tRawLoad.Seconds(), "load/raw")
			b.ReportMetric(tSave.Seconds()/tStep.Seconds(), "save/step")
			b.ReportMetric(float64(16*e.layout.ParamCount())/1e6, "state-MB")
		})
	}
}

// TestCheckpointRestoreInPlace: an engine without the tier store restored
// between steps to a state it saved earlier (RestoreState's contract) goes
// on exactly as it did from that state the first time: no gathered chunk,
// optimizer copy or counter kept across the restore.
func TestCheckpointRestoreInPlace(t *testing.T) {
	const k = 3
	for _, s := range []runSpec{
		{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1},
		{stage: 3, n: 2, micro: 1, accum: 2, clip: 1},
		{stage: 0, n: 2, micro: 1, accum: 1, fp32: true},
	} {
		t.Run(s.String(), func(t *testing.T) {
			e := newTestEngine(t, s)
			trainFor(t, e, k)
			saved := stateOf(t, e)
			first := trainFor(t, e, k)
			end := stateOf(t, e)
			if err := e.RestoreState(saved); err != nil {
				t.Fatal(err)
			}
			if e.StepCount() != k {
				t.Fatalf("step %d after the restore, want %d", e.StepCount(), k)
			}
			again := trainFor(t, e, k)
			for i := range first {
				if first[i] != again[i] {
					t.Errorf("step %d: loss %v after the restore, %v the first time", k+i+1, again[i], first[i])
				}
			}
			sameState(t, "after the restore vs the first time", end, stateOf(t, e))
		})
	}
}

// checkpointFiles returns the rank files of the checkpoint under dir.
func checkpointFiles(t *testing.T, dir string) (*checkpoint.Manifest, [][]byte) {
	t.Helper()
	m, path, err := checkpoint.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files [][]byte
	for _, f := range m.Files {
		b, err := os.ReadFile(filepath.Join(path, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, b)
	}
	return m, files
}

// TestCheckpointStreamSameFiles: the streaming SaveCheckpoint writes the
// same rank files, byte for byte, as checkpoint.SaveWith of the whole
// State that CheckpointState collects (the save before streaming; and
// checkpoint's TestStreamSaveMatchesLegacy ties SaveWith to the former
// whole-State writer), for the device, host and tier-store (NVMe) homes
// and the replicated stage 0.
func TestCheckpointStreamSameFiles(t *testing.T) {
	type config struct {
		name string
		mk   func(t *testing.T) *Engine
	}
	var cs []config
	for _, s := range []runSpec{
		{stage: 0, n: 2, micro: 1, accum: 1, clip: 1},
		{stage: 2, n: 2, micro: 1, accum: 1, clip: 1},
		{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1},
		{stage: 3, n: 4, micro: 1, accum: 1, fp32: true},
	} {
		cs = append(cs, config{s.String(), func(t *testing.T) *Engine { return newTestEngine(t, s) }})
	}
	nv := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	cs = append(cs, config{nv.String(), func(t *testing.T) *Engine {
		nvmetest.Require(t)
		return newTierEngine(t, nv, Options{})
	}})
	for _, c := range cs {
		t.Run(c.name, func(t *testing.T) {
			e := c.mk(t)
			trainFor(t, e, 2)
			stream, whole := t.TempDir(), t.TempDir()
			if _, err := e.SaveCheckpoint(stream, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			st := stateOf(t, e)
			if err := checkpoint.SaveWith(whole, st, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			ms, fs := checkpointFiles(t, stream)
			mw, fw := checkpointFiles(t, whole)
			for r := range fw {
				if !bytes.Equal(fs[r], fw[r]) {
					t.Errorf("rank %d: the streamed file (%d bytes) differs from the whole-State save's (%d bytes)", r, len(fs[r]), len(fw[r]))
				}
				if ms.Files[r] != mw.Files[r] {
					t.Errorf("rank %d: manifest %+v vs %+v", r, ms.Files[r], mw.Files[r])
				}
			}
		})
	}
}

// boundShapeJSON is 16 blocks of 12·96² parameters: 1.8M params, 29 MB of
// model state (16Ψ) in 18 chunks; the largest padded chunk of f32 state is
// 0.45 MB on 2 ranks.
const boundShapeJSON = `{"n_layer": 16, "n_embd": 96, "n_head": 4, "vocab_size": 256, "max_seq_len": 16}`

// heapAllocated is every byte the process has allocated on the heap so far
// (the Go runtime's count: it only grows, so a difference bounds the peak
// of what was allocated in between).
func heapAllocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// TestCheckpointStreamMemoryBound is the must-show of the bound, end to
// end: SaveCheckpoint and LoadCheckpoint of a model with 29 MB of state
// allocate on the heap, in all, at most k = 2 of its largest padded chunk
// of f32 state (2·N of the largest shard tensor: the two stream buffers)
// plus fixed overhead (N × 256 KiB for the load's CRC pass, 1 MiB for
// headers, manifest, goroutines and the engine's bookkeeping per chunk;
// with the remainder master, the default on NVMe, N × its scratch, about
// one more chunk: remScratchBytes):
// 2.5 MB here (measured 1.2 - 1.9 MB) against 16Ψ = 29 MB for the whole-State save. For
// the host optimizer and for params and optimizer on NVMe (tier store).
func TestCheckpointStreamMemoryBound(t *testing.T) {
	for _, c := range boundEngines() {
		t.Run(c.name, func(t *testing.T) {
			a := c.mk(t)
			b := c.mk(t)
			meta := a.checkpointMeta()
			whole := meta.MaxWholeBytes()
			state := 16 * a.layout.ParamCount()
			const overhead = 1 << 20
			bound := 2*whole + 2*256<<10 + overhead + a.n*int(remScratchBytes(a)) // the remainder master's scratch per rank
			if state < int64(8*bound) {                                           // 9.9× with the remainder master
				t.Fatalf("state %d bytes is not much larger than the bound %d", state, bound)
			}
			dir := t.TempDir()
			before := heapAllocated()
			if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			saved := heapAllocated() - before
			before = heapAllocated()
			if err := b.LoadCheckpoint(dir); err != nil {
				t.Fatal(err)
			}
			loaded := heapAllocated() - before
			t.Logf("16Ψ = %d bytes; largest padded f32 chunk %d; allocated by the save %d, by the load %d (bound %d)", state, whole, saved, loaded, bound)
			if saved > uint64(bound) || loaded > uint64(bound) {
				t.Errorf("save allocated %d bytes, load %d: over the bound %d = 2 × %d + %d", saved, loaded, bound, whole, bound-2*whole)
			}
			sameState(t, "loaded vs saved", stateOf(t, a), stateOf(t, b))
		})
	}
}

// TestCheckpointMasterChunks: MasterChunks hands over, chunk by chunk and
// in order, exactly what Master gathers (bit for bit), for the device,
// host and tier-store (NVMe) homes, the replicated stage 0 and fp32 mode;
// and an error of fn stops it and comes back as is.
func TestCheckpointMasterChunks(t *testing.T) {
	type config struct {
		name string
		mk   func(t *testing.T) *Engine
	}
	var cs []config
	for _, s := range []runSpec{
		{stage: 0, n: 2, micro: 1, accum: 1, clip: 1},
		{stage: 2, n: 2, micro: 1, accum: 1, clip: 1},
		{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1},
		{stage: 3, n: 3, micro: 1, accum: 1, fp32: true},
		{stage: 2, n: 2, offload: true, micro: 1, accum: 1, fp32: true},
	} {
		cs = append(cs, config{s.String(), func(t *testing.T) *Engine { return newTestEngine(t, s) }})
	}
	nv := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	cs = append(cs, config{nv.String(), func(t *testing.T) *Engine {
		nvmetest.Require(t)
		return newTierEngine(t, nv, Options{})
	}})
	for _, c := range cs {
		t.Run(c.name, func(t *testing.T) {
			e := c.mk(t)
			trainFor(t, e, 2)
			want, err := e.Master()
			if err != nil {
				t.Fatal(err)
			}
			next := 0
			err = e.MasterChunks(func(c int, data []float32) error {
				if c != next {
					t.Fatalf("chunk %d handed over, want %d", c, next)
				}
				next++
				if len(data) != len(want[c]) {
					t.Fatalf("chunk %d: %d elements, Master has %d", c, len(data), len(want[c]))
				}
				for i := range data {
					if math.Float32bits(data[i]) != math.Float32bits(want[c][i]) {
						t.Fatalf("chunk %d element %d: %v, Master has %v", c, i, data[i], want[c][i])
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if next != len(want) {
				t.Errorf("%d chunks handed over, want %d", next, len(want))
			}
			boom := errors.New("boom")
			if err := e.MasterChunks(func(c int, _ []float32) error {
				if c == 1 {
					return boom
				}
				return nil
			}); err != boom {
				t.Errorf("fn's error came back as %v", err)
			}
			trainFor(t, e, 1) // the engine goes on after a stopped MasterChunks
		})
	}
}

// TestCheckpointExportMemoryBound is the must-show of `strata train
// --out`'s weights export: MasterChunks into hf.ExportStream
// allocates on the heap, in all, at most one padded chunk of f32 (N × its
// shard: MasterChunks' buffer), the largest tensor and the 1 MiB write
// buffer of the export, and 1 MiB for the header, goroutines and the
// engine's bookkeeping per chunk (measured 1.9 MB against a 2.7 MB
// bound, most of it fixed), for a model whose fp32 weights are 7.3 MB
// (Master's 4Ψ, which the export held before); the file is the one
// hf.Export of Master writes.
func TestCheckpointExportMemoryBound(t *testing.T) {
	for _, c := range boundEngines() {
		t.Run(c.name, func(t *testing.T) {
			e := c.mk(t)
			trainFor(t, e, 1)
			whole, tensor := 0, 0
			for _, p := range e.chunks {
				whole = max(whole, 4*e.n*p.shard)
			}
			for _, ch := range e.layout.Chunks {
				for _, ts := range ch.Tensors {
					tensor = max(tensor, 4*ts.Len)
				}
			}
			const writeBuf, overhead = 1 << 20, 1 << 20
			bound := whole + tensor + writeBuf + overhead + e.n*int(remScratchBytes(e)) // the remainder master's scratch per rank
			weights := 4 * e.layout.ParamCount()
			if weights < int64(2*bound) {
				t.Fatalf("weights %d bytes are not much larger than the bound %d", weights, bound)
			}
			dir := t.TempDir()
			got, want := filepath.Join(dir, "got"), filepath.Join(dir, "want")
			opts := hf.ExportOptions{Step: e.StepCount()}
			before := heapAllocated()
			err := hf.ExportStream(got, e.Layout(), opts, func(w *hf.ExportWriter) error {
				return e.MasterChunks(w.F32)
			})
			if err != nil {
				t.Fatal(err)
			}
			used := heapAllocated() - before
			t.Logf("4Ψ = %d bytes; largest padded f32 chunk %d; allocated by the streamed export %d (bound %d)", weights, whole, used, bound)
			if used > uint64(bound) {
				t.Errorf("streamed export allocated %d bytes, over the bound %d = %d + %d + %d + %d", used, bound, whole, tensor, writeBuf, overhead)
			}
			m, err := e.Master()
			if err != nil {
				t.Fatal(err)
			}
			if err := hf.Export(want, e.Layout(), m, opts); err != nil {
				t.Fatal(err)
			}
			a, _ := os.ReadFile(got)
			b, _ := os.ReadFile(want)
			if !bytes.Equal(a, b) {
				t.Errorf("the streamed export (%d bytes) differs from Export of Master (%d bytes)", len(a), len(b))
			}
		})
	}
}

// boundEngine makes an engine of the bound tests' model (boundShapeJSON).
type boundEngine struct {
	name string
	mk   func(t *testing.T) *Engine
}

// boundEngines are the memory-bound tests' setups: stage 3 on 2 devices
// with the host optimizer, and with params and optimizer on NVMe.
func boundEngines() []boundEngine {
	host := runSpec{stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
	nv := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: boundShapeJSON}
	return []boundEngine{
		{host.String(), func(t *testing.T) *Engine {
			return newEngineJSON(t, strings.Replace(host.configJSON(), testShapeJSON, boundShapeJSON, 1), host.n)
		}},
		{nv.String(), func(t *testing.T) *Engine {
			nvmetest.Require(t)
			return newTierEngine(t, nv, Options{})
		}},
	}
}
