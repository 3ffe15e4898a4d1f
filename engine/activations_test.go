package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
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
// the host and came back every step, and each rank's planner brings them
// back ahead of the backward as it does params (checkInputsPlanned).
// Whether a planned upload lands before its access in real time depends on
// how busy this machine is (the planner's deadlines come from the compute
// times it measured and the bandwidths the store measured), so the
// real-time hit, late and miss counts are only logged.
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
	var baseMisses int64
	if bt := base.Summary().Tier; bt != nil {
		baseMisses = bt.Misses
	}
	t.Logf("tier (real time, not asserted): %d accesses, %d hits, %d late, %d missed (%d without checkpointing), %d divergences",
		ts.Accesses, ts.Hits, ts.Late, ts.Misses, baseMisses, ts.Divergences)
	for r := range e.ranks {
		checkInputsPlanned(t, e, r)
	}
}

// checkInputsPlanned: rank r's planner plans its saved inputs from its
// trace (the last step it recorded), as it does params. The trace declares
// them, per micro-batch: each checkpointed block's input written in host
// memory in the forward, in block order, then read in HBM in the backward,
// in reverse order. And the planner, replaying that trace in its simulated
// time (prefetch.Plan, as checkPlanHitRate: the configured bandwidths, every
// access computing for twice the longest transfer of any shard of the
// trace, so that nothing depends on this machine's load), brings every
// one of them up ahead (checkRestores).
func checkInputsPlanned(t *testing.T, e *Engine, r int) {
	t.Helper()
	d := e.tiers.runners[r]
	var tr prefetch.Trace
	d.Do(func() { tr = d.p.Trace() })
	var got, want []string
	for _, a := range tr.Accesses {
		if a.Key.State == shard.Activation {
			got = append(got, a.String())
		}
	}
	layers := e.layout.Shape.Layers
	for range e.accum {
		for l := range layers {
			if e.act.Checkpointed(l, layers) {
				want = append(want, shard.Access{Key: akey(l, r), Phase: shard.Forward, Tier: shard.Host, Kind: shard.Write}.String())
			}
		}
		for l := layers - 1; l >= 0; l-- {
			if e.act.Checkpointed(l, layers) {
				want = append(want, shard.Access{Key: akey(l, r), Phase: shard.Backward, Tier: shard.HBM, Kind: shard.Read}.String())
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rank %d: the planner's trace has the saved-input accesses\n%s\nwant\n%s", r, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	resid, err := e.tiers.residency(r)
	if err != nil {
		t.Fatal(err)
	}
	opts := e.tiers.popts
	opts.BandwidthBytesPerSec = e.opts.LinkBandwidth // the configured ones, not the measured
	var longest time.Duration
	for _, a := range tr.Accesses {
		for l := range shard.LinkCount {
			longest = max(longest, opts.TransferTime(shard.Link(l), resid[a.Key].SizeBytes))
		}
	}
	for i := range tr.Accesses {
		tr.Accesses[i].Compute = 2 * longest
	}
	const steps = 3
	sched, err := prefetch.Plan(tr, resid, opts, steps)
	if err != nil {
		t.Fatalf("rank %d: %v", r, err)
	}
	hits, late := checkRestores(t, r, sched, len(tr.Accesses))
	if n := (steps - 1) * len(want) / 2; hits+late != n {
		t.Errorf("rank %d: %d restores simulated from the second step, want %d", r, hits+late, n)
	}
	t.Logf("rank %d: %d saved-input restores a step in the trace; simulated steps 2-%d: %d prefetched and landed, %d prefetched right after their save (late)", r, len(want)/2, steps, hits, late)
}

// checkRestores: in the simulated schedule sched, from the second step
// (accesses from index n on), the HBM copy of every restored input is
// brought by a Prefetch from host memory (never a demand fetch) issued
// after the input's save was released and before its restore began; it
// has landed by then (a hit) unless the restore is the very next access
// after the save (the last checkpointed block: its input is written and
// read back with no access between, so no transfer can land in between
// and the restore is dependent, its prefetch issued as soon as the save
// ended, or late when another transfer was ahead of it on the link).
// It returns the hits and the late ones.
func checkRestores(t *testing.T, r int, sched *prefetch.Schedule, n int) (hits, late int) {
	t.Helper()
	saved := map[shard.Key]prefetch.ScheduledAccess{}
	for _, a := range sched.Accesses {
		if a.Key.State != shard.Activation {
			continue
		}
		if a.Kind == shard.Write {
			saved[a.Key] = a
			continue
		}
		sv, ok := saved[a.Key]
		if a.Step == 0 && (!ok || a.Index < n) {
			continue
		}
		if !ok || sv.Step != a.Step {
			t.Errorf("rank %d, simulated step %d: %s restored with no save before it", r, a.Step+1, a.Key)
			continue
		}
		var up *prefetch.ScheduledMove // the last move into HBM issued between the save and the restore
		for i := range sched.Moves {
			m := &sched.Moves[i]
			if m.Key == a.Key && m.To == shard.HBM && !m.Instant() && m.IssueSeq > sv.EndSeq && m.IssueSeq < a.StartSeq {
				up = m
			}
		}
		adjacent := a.Index == sv.Index+1
		switch {
		case up == nil || up.Reason != shard.Prefetch || up.From != shard.Host:
			t.Errorf("rank %d, simulated step %d: the restore of %s (a %s) found no prefetch from host memory issued after its save (%+v)", r, a.Step+1, a.Key, a.Outcome, up)
		case a.Outcome == prefetch.Hit && up.DoneSeq < a.StartSeq:
			hits++
		case (a.Outcome == prefetch.Late || a.Outcome == prefetch.Dependent) && adjacent:
			late++
		default:
			t.Errorf("rank %d, simulated step %d: the restore of %s is a %s (%d accesses after its save), its prefetch issued at %v, landed at %v, the restore began at %v", r, a.Step+1, a.Key, a.Outcome, a.Index-sv.Index, up.Issue, up.Done, a.Start)
		}
	}
	return hits, late
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

func stepNorms(st []report.StepStats) []float64 {
	out := make([]float64, len(st))
	for i, s := range st {
		out[i] = s.GradNorm
	}
	return out
}

// TestActivationPeakMatchesEstimate: on the small and medium shapes (one
// step of micro-batch 8 × 256 tokens on medium, 4 × 256 on small, stage 3
// on 2 devices, the optimizer on the host), each device's measured peak of
// activation memory is within 5 % of estimate.Activations (what `strata
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
				want := estimate.Activations(e.layout.Shape, c.micro, 256, e.act).DeviceBytes()
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

// TestRestoreInputOOM: with cpu_checkpointing at stage 3 on 2 devices, the
// HBM copies of the saved inputs brought back for the backward live in
// the tier store's slots, taken at New (no step allocates them:
// TestTierNoDeviceAllocsCheckpointing). So the last rank's device refusing
// them fails New, with the *gpu.OutOfMemoryError naming them ("tier hbm
// inputs") and one error naming the engine once and the rank, leaving
// nothing allocated; an engine made next on the same devices trains to
// the bits of a run that never failed.
func TestRestoreInputOOM(t *testing.T) {
	const steps = 3
	s := runSpec{stage: 3, n: 2, micro: 1, accum: 1, ckpt: `{"cpu_checkpointing": true}`}
	want, _ := runEngine(t, s, steps)
	devs, comms, err := cpu.New(cpu.Options{Devices: 2, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	gdevs := cpu.Devices(devs)
	faulty := &allocFaults{Device: gdevs[1], purpose: tier.InputSlotPurpose}
	gdevs[1] = faulty
	faulty.arm(1)
	cfg := testConfig(t, s.configJSON())
	opts := Options{Corpus: model.Tokens(testTokens)}
	_, err = startEngine(t, cfg, gdevs, comms, opts)
	checkNewOOM(t, err, faulty, tier.InputSlotPurpose, 1)
	var oom *gpu.OutOfMemoryError
	if errors.As(err, &oom) && oom.Tag.Kind != gpu.Activation {
		t.Errorf("the refused slots are %s, want %s", oom.Tag.Kind, gpu.Activation)
	}
	e, err := startEngine(t, cfg, gdevs, comms, opts)
	if err != nil {
		t.Fatal(err)
	}
	trainFor(t, e, steps)
	p, m := readState(t, e)
	if d, x := diff(p, want.params); d != 0 {
		t.Errorf("%d params differ from the run without a failure (max %g)", d, x)
	}
	if d, x := diff(m, want.master); d != 0 {
		t.Errorf("%d master weights differ (max %g)", d, x)
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
