package engine

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/internal/shard"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// The activation_checkpointing blocks of the tests: every block, one of
// the two blocks (the last: number_checkpoints 1), every block with the
// inputs in host memory.
var ckptBlocks = []string{`{}`, `{"number_checkpoints": 1}`, `{"cpu_checkpointing": true}`, `{"number_checkpoints": 1, "cpu_checkpointing": true}`}

// sameRun checks that got ends with the params, master weights, losses
// and gradient norms (where want has them) of want, bit for bit.
func sameRun(t *testing.T, got, want result) {
	t.Helper()
	if m, d := diff(got.params, want.params); m != 0 {
		t.Errorf("params: %d differ (max %g)", m, d)
	}
	if m, d := diff(got.master, want.master); m != 0 {
		t.Errorf("master: %d differ (max %g)", m, d)
	}
	for i := range want.losses {
		if math.Float64bits(got.losses[i]) != math.Float64bits(want.losses[i]) {
			t.Errorf("step %d: loss %v, without checkpointing %v", i+1, got.losses[i], want.losses[i])
			break
		}
	}
	for i := range want.norms {
		if got.norms[i] != want.norms[i] {
			t.Errorf("step %d: grad norm %v, without checkpointing %v", i+1, got.norms[i], want.norms[i])
			break
		}
	}
}

// TestCheckpointingEquivalence: with activation checkpointing (every
// block, one block; the inputs on the device or in host memory through the
// tier store) 20 steps end with params, master weights, losses and norms
// bit-identical to the same run without it, at stages 0-3, with the
// optimizer on the device and on the host, in bf16 and fp32 activations,
// with 2 micro-batches of 2 rows per step. Why: a checkpointed block's
// recompute is its forward again with the same parameters from the same
// bits of its input (saved on the device, or copied to host memory and
// back as bytes), and every kernel is deterministic.
func TestCheckpointingEquivalence(t *testing.T) {
	for stage := 0; stage <= 3; stage++ {
		for _, offload := range []bool{false, true} {
			if offload && stage == 0 {
				continue // offload_optimizer needs stage 1+
			}
			for _, fp32Acts := range []bool{false, true} {
				base := runSpec{stage: stage, n: 2, offload: offload, micro: 2, accum: 2, clip: 1, fp32Acts: fp32Acts}
				want, be := runEngine(t, base, testSteps)
				for _, ck := range ckptBlocks {
					s := base
					s.ckpt = ck
					t.Run(s.String(), func(t *testing.T) {
						got, e := runEngine(t, s, testSteps)
						sameRun(t, got, want)
						checkMemory(t, s, e)
						checkOffloadedInputs(t, e, be)
					})
				}
			}
		}
	}
}

// checkOffloadedInputs: with cpu_checkpointing the saved inputs went to
// the host and came back every step, and from the third step on (the
// planner plans from the step before) they were ready or on their way
// when the backward asked for them: e missed no more accesses than base,
// the same run without checkpointing, and the first two steps' restores.
func checkOffloadedInputs(t *testing.T, e, base *Engine) {
	t.Helper()
	if !e.act.Offload {
		return
	}
	sum := e.Summary()
	in := model.InputBytes(e.layout.Shape, e.micro, e.seq, e.act)
	blocks := int64(0)
	for l := range e.layout.Shape.Layers {
		if e.act.Checkpointed(l, e.layout.Shape.Layers) {
			blocks++
		}
	}
	if want := int64(e.n) * blocks * in; sum.ActivationHostBytes != want {
		t.Errorf("saved inputs in host memory %d, want %d", sum.ActivationHostBytes, want)
	}
	ts := sum.Tier
	if ts == nil {
		t.Fatal("no tier store")
	}
	// Each step each rank brings its saved inputs back once per
	// micro-batch (the copies down are the rank's own, into the host
	// home it leases).
	perStep := int64(e.n) * int64(e.accum) * blocks * in
	if up := ts.LinkBytes[shard.HostToHBM]; up < testSteps*perStep {
		t.Errorf("moved %d B up in %d steps, want at least %d", up, testSteps, testSteps*perStep)
	}
	t.Logf("tier: %d accesses, %d hits, %d late, %d missed, %d divergences", ts.Accesses, ts.Hits, ts.Late, ts.Misses, ts.Divergences)
	var baseMisses int64
	if bt := base.Summary().Tier; bt != nil {
		baseMisses = bt.Misses
	}
	// Not prefetched, every restore would miss: 20 steps' worth. The first
	// step's miss (the planner has no trace yet), and the second's may
	// (its compute times come from the first, slowed by the demand
	// fetches).
	if first := int64(e.n*e.accum) * blocks; ts.Misses > baseMisses+2*first {
		t.Errorf("%d accesses missed, more than the run without checkpointing (%d) and twice the %d restores of the first step: the saved inputs are not prefetched", ts.Misses, baseMisses, first)
	}
}

// TestCheckpointingTiered: with params and optimizer state on NVMe or in
// host memory (stage 3, the tier store's HBM budget shared by param
// shards and restored inputs; with a host budget the saved inputs' homes
// come out of it before the optimizer state kept in RAM) cpu_checkpointing
// ends 20 steps bit-identical to the same run without checkpointing.
func TestCheckpointingTiered(t *testing.T) {
	nvmetest.Require(t)
	for _, c := range []struct {
		param, opt string
		hostBudget int64
	}{{"cpu", "cpu", 0}, {"nvme", "nvme", 0}, {"none", "nvme", 0}, {"nvme", "nvme", 1 << 20}} {
		base := tierSpec{n: 2, param: c.param, opt: c.opt, shapeJSON: deepShapeJSON, hostBudget: c.hostBudget}
		want, be := runTier(t, base, Options{}, testSteps)
		s := base
		s.ckpt = `{"cpu_checkpointing": true}`
		t.Run(fmt.Sprintf("%v/host%d/cpu_checkpointing", s, c.hostBudget), func(t *testing.T) {
			got, e := runTier(t, s, Options{}, testSteps)
			sameRun(t, result{params: got.params, master: got.master, losses: got.losses, norms: stepNorms(got.stats)},
				result{params: want.params, master: want.master, losses: want.losses, norms: stepNorms(want.stats)})
			checkOffloadedInputs(t, e, be)
			if p := e.Summary().Tier.PeakBytes[shard.HBM]; p > e.tiers.hbmBudget {
				t.Errorf("tier store HBM peak %d over its budget %d", p, e.tiers.hbmBudget)
			}
		})
	}
}

func stepNorms(st []StepStats) []float64 {
	out := make([]float64, len(st))
	for i, s := range st {
		out[i] = s.GradNorm
	}
	return out
}

// TestActivationPeakMatchesEstimate: on the small and medium shapes (one
// step of micro-batch 8 × 256 tokens on medium, 4 × 256 on small, stage 3
// on 2 devices, the optimizer on the host), each device's measured peak of
// activation memory is within 5 % of EstimateActivations (what `strata
// estimate` prints) without checkpointing, with it and with
// cpu_checkpointing; checkpointing halves it at least. The estimate is
// the model's allocations to the 256-byte tensor and the restored inputs'
// room; the measurement adds the device's 64-byte allocation granularity
// (a few KiB) and, with cpu_checkpointing, holds at most the two restored
// inputs the estimate counts.
func TestActivationPeakMatchesEstimate(t *testing.T) {
	for _, c := range []struct {
		name  string
		micro int
	}{{"small", 4}, {"medium", 8}} {
		var none int64
		for _, ck := range []string{"", `{}`, `{"cpu_checkpointing": true}`} {
			t.Run(fmt.Sprintf("%s/ckpt%s", c.name, ck), func(t *testing.T) {
				e := namedEngine(t, c.name, c.micro, ck)
				if _, err := e.Step(); err != nil {
					t.Fatal(err)
				}
				want := EstimateActivations(e.layout.Shape, c.micro, 256, e.act).DeviceBytes()
				for _, d := range e.Summary().PerDevice {
					t.Logf("%s: activation peak %d, estimate %d (%.4f)", d.Device, d.ActivationPeakBytes, want, d.ActivationRatio)
					if d.ActivationEstimateBytes != want || d.ActivationRatio < 0.95 || d.ActivationRatio > 1.05 {
						t.Errorf("%s: activation peak %d, estimate %d: ratio %.4f", d.Device, d.ActivationPeakBytes, d.ActivationEstimateBytes, d.ActivationRatio)
					}
					if ck == "" {
						none = d.ActivationPeakBytes
					} else if 2*d.ActivationPeakBytes > none {
						t.Errorf("%s: %d bytes with checkpointing, more than half of %d without", d.Device, d.ActivationPeakBytes, none)
					}
				}
			})
		}
	}
}

// namedEngine is stage 3 on 2 devices with the optimizer on the host for
// a named shape at micro×256 tokens, with the activation_checkpointing
// block ck ("" for none).
func namedEngine(t *testing.T, name string, micro int, ck string) *Engine {
	t.Helper()
	block := ""
	if ck != "" {
		block = `"activation_checkpointing": ` + ck + ","
	}
	js := fmt.Sprintf(`{"train_micro_batch_size_per_gpu": %d, %s
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
  "strata": {"model": %q, "devices": 2, "seq_len": 256}}`, micro, block, name)
	cfg, err := config.Parse([]byte(js), "test.json", config.Options{LookupShape: func(n string) (config.Shape, error) {
		s, err := model.Lookup(n)
		return config.Shape(s), err
	}})
	if err != nil {
		t.Fatal(err)
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: 2, HBMBytes: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	e, err := startEngine(t, cfg, cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestActivationOptionsFromConfig: the dtype follows the precision and
// strata.activation_dtype, the block count the activation_checkpointing
// block.
func TestActivationOptionsFromConfig(t *testing.T) {
	s, _ := model.Lookup("small")
	for _, c := range []struct {
		extra, strata string
		prec          gpu.DType
		want          model.ActivationOptions
	}{
		{"", "", gpu.BF16, model.ActivationOptions{DType: gpu.BF16}},
		{"", `, "activation_dtype": "fp32"`, gpu.BF16, model.ActivationOptions{DType: gpu.F32}},
		{"", "", gpu.F32, model.ActivationOptions{DType: gpu.F32}},
		{`"activation_checkpointing": {},`, "", gpu.BF16, model.ActivationOptions{DType: gpu.BF16, Checkpoint: 4}},
		{`"activation_checkpointing": {"number_checkpoints": 2, "cpu_checkpointing": true},`, "", gpu.BF16, model.ActivationOptions{DType: gpu.BF16, Checkpoint: 2, Offload: true}},
	} {
		js := fmt.Sprintf(`{"train_micro_batch_size_per_gpu": 1, %s "strata": {"model": "small"%s}}`, c.extra, c.strata)
		cfg, err := config.Parse([]byte(js), "", config.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := ActivationOptionsFromConfig(cfg, s, c.prec); got != c.want {
			t.Errorf("%s %s %s: %+v, want %+v", c.extra, c.strata, c.prec, got, c.want)
		}
	}
}

// TestRestoreInputOOM: with cpu_checkpointing at stage 3 on 2 devices, the
// last rank's device refusing the HBM copy of a saved input (the tier
// store's move that brings it back) ends the step with one error naming
// the chunk, the rank and the state, without hanging the other rank, and
// updates nothing. (A tier store move that failed stops the rank's
// planner: the later steps refuse to run, as after an NVMe error.)
func TestRestoreInputOOM(t *testing.T) {
	s := runSpec{stage: 3, n: 2, micro: 1, accum: 1, ckpt: `{"cpu_checkpointing": true}`}
	devs, comms, err := cpu.New(cpu.Options{Devices: 2, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	gdevs := cpu.Devices(devs)
	faulty := &allocFaults{Device: gdevs[1], purpose: shard.Activation.String()}
	gdevs[1] = faulty
	e, err := startEngine(t, testConfig(t, s.configJSON()), gdevs, comms, Options{Corpus: model.Tokens(testTokens)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	params, master := readState(t, e)
	faulty.arm(1)
	_, err = stepWithin(t, e)
	if err == nil {
		t.Fatalf("step 2 succeeded; %d allocations refused", faulty.failed.Load())
	}
	t.Logf("%v", err)
	var oom *gpu.OutOfMemoryError
	if !errors.As(err, &oom) || oom.Tag.Purpose != "activation" {
		t.Errorf("%v is not the refused input copy", err)
	}
	checkFaultMessage(t, err, "step 2", "rank 1", "restore block")
	p2, m2 := readTierState(t, e)
	if m, _ := diff(p2, params); m != 0 {
		t.Errorf("%d params changed in the failed step", m)
	}
	if m, _ := diff(m2, master); m != 0 {
		t.Errorf("%d master weights changed in the failed step", m)
	}
	if _, err := stepWithin(t, e); err == nil {
		t.Error("the step after the failure succeeded")
	}
}

// TestCheckpointingOverlapModes: the host optimizer's other schedules
// (serial, the update during the backward, the delayed update past its
// warm-up) read the same params in a block's recompute as in its forward:
// with activation checkpointing, on the device or cpu_checkpointing, 10
// steps end bit-identical to the same schedule without it (stage 2, 2
// devices, optimizer on the host; no clipping for update_in_backward).
func TestCheckpointingOverlapModes(t *testing.T) {
	const steps = 10
	for _, mode := range []struct {
		name string
		js   func(runSpec) string
	}{
		{"serial", func(s runSpec) string { return withOverlap(s.configJSON(), OverlapSerial) }},
		{"update_in_backward", func(s runSpec) string {
			return strings.Replace(s.configJSON(), `"strata": {`, `"strata": {"update_in_backward": true, `, 1)
		}},
		{"dpu", func(s runSpec) string { return dpuJSON(s, 3) }},
	} {
		base := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1}
		want := runOverlap(t, mode.js(base), 2, steps)
		for _, ck := range []string{`{}`, `{"cpu_checkpointing": true}`} {
			s := base
			s.ckpt = ck
			t.Run(mode.name+"/"+ck, func(t *testing.T) {
				got := runOverlap(t, mode.js(s), 2, steps)
				sameRun(t, got.res, want.res)
			})
		}
	}
}

// TestCheckpointingResume: a run with cpu_checkpointing (the tier store
// holds the saved inputs, and with the optimizer on the host the model
// state too) saves a checkpoint and a new engine resumes it bit-identically
// to the run that was not stopped.
func TestCheckpointingResume(t *testing.T) {
	for _, offload := range []bool{false, true} {
		s := runSpec{stage: 3, n: 2, offload: offload, micro: 1, accum: 1, clip: 1, ckpt: `{"cpu_checkpointing": true}`}
		t.Run(s.String(), func(t *testing.T) {
			checkResume(t, func(t *testing.T) *Engine { return newTestEngine(t, s) }, 3)
		})
	}
}

// TestEstimateActivationHostBytes: with the optimizer on NVMe and a host
// budget, the saved inputs' host homes come out of the budget first: the
// optimizer state kept in host RAM shrinks by whole shards, at least by
// what the inputs take.
func TestEstimateActivationHostBytes(t *testing.T) {
	s, _ := model.Lookup("gpt2")
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	o := MemoryOptions{ChunkParams: ChunkParams(l), Devices: 2, Stage: 3, OptimizerTier: shard.NVMe, ParamTier: shard.NVMe, HostBudgetBytes: 4 << 30}
	kept := func(o MemoryOptions) int64 {
		e, err := EstimateMemory(o)
		if err != nil {
			t.Fatal(err)
		}
		return e.TierBytes(shard.Host)
	}
	without := kept(o)
	act := model.ActivationOptions{DType: gpu.BF16, Checkpoint: s.Layers, Offload: true}
	o.ActivationHostBytes = inputHostBytes(s, 8, 1024, act)
	with := kept(o)
	if o.ActivationHostBytes != 12*ioBytes(8*1024*768*2) || without-with < o.ActivationHostBytes {
		t.Errorf("inputs take %d B of host RAM per rank; the optimizer state kept there went from %d to %d", o.ActivationHostBytes, without, with)
	}
}
