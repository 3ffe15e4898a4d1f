package engine

import (
	"fmt"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
)

// withFP16 swaps a test config's bf16 block for an fp16 block with keys.
func withFP16(js, keys string) string {
	out := strings.Replace(js, `"bf16": {"enabled": true}`, `"fp16": {"enabled": true`+keys+`}`, 1)
	if out == js {
		panic("withFP16: no bf16 block in the config")
	}
	return out
}

// overflowSchedule is the scripted overflow of TestFP16ScaleSchedule:
// steps 2, 4 and 5 (1-based) have an Inf in rank 1's gradient shard of
// the last chunk; the scale starts at 2^4 with a window of 3 steps.
var overflowSchedule = []bool{false, true, false, true, true, false, false, false, false}

// scaleRules are the three hysteresis settings and the scales DeepSpeed's
// rules give for overflowSchedule (worked out by hand from
// internal/lossscale's doc, which is loss_scaler.py's update_scale):
//
//	hysteresis 2: step 2 spends the hysteresis, 4 halves (it was not
//	  refilled), 5 halves; 3 good steps after step 5 double at step 8.
//	hysteresis 2, consecutive: step 3 refills it, so step 4 only spends
//	  it again and 5 halves; doubled after step 8 as well.
//	hysteresis 1: every overflow halves.
var scaleRules = []struct {
	name   string
	keys   string
	scales []float64 // the scale each step ran with
}{
	{"hysteresis2", `, "hysteresis": 2`, []float64{16, 16, 16, 16, 8, 4, 4, 4, 8}},
	{"hysteresis2-consecutive", `, "hysteresis": 2, "consecutive_hysteresis": true`, []float64{16, 16, 16, 16, 16, 8, 8, 8, 16}},
	{"hysteresis1", `, "hysteresis": 1`, []float64{16, 16, 8, 8, 4, 2, 2, 2, 4}},
}

// TestFP16ScaleSchedule: a scripted overflow schedule (an Inf in one
// rank's reduced gradient at chosen steps) gives exactly the scale
// sequence and the skipped steps of DeepSpeed's rules, at stages 0-3,
// with the optimizer on the device, on the host (serial, exact, dpu,
// update_in_backward) and on NVMe; a skipped step leaves master, m, v and
// the optimizer's step count bit-identical (and the params, except under
// dpu, whose skipped step's pass uploads the update before it, as it
// would have anyway).
func TestFP16ScaleSchedule(t *testing.T) {
	type run struct {
		name string
		js   func(t *testing.T) string
		dpu  bool
	}
	var runs []run
	for stage := range 4 {
		s := runSpec{stage: stage, n: 2, micro: 1, accum: 2, clip: 1}
		runs = append(runs, run{name: fmt.Sprintf("stage%d/device", stage), js: func(*testing.T) string { return s.configJSON() }})
	}
	for stage := 1; stage <= 3; stage++ {
		s := runSpec{stage: stage, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
		for _, ov := range []string{OverlapSerial, OverlapExact, OverlapDPU} {
			runs = append(runs, run{name: fmt.Sprintf("stage%d/host/%s", stage, ov), dpu: ov == OverlapDPU,
				js: func(*testing.T) string { return withDPUWarmup(withOverlap(s.configJSON(), ov)) }})
		}
	}
	bwd := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1}
	runs = append(runs, run{name: "stage2/host/update_in_backward", js: func(*testing.T) string { return inBackward(withOverlap(bwd.configJSON(), OverlapExact)) }})
	for _, ov := range []string{OverlapSerial, OverlapExact, OverlapDPU} {
		s := tierSpec{n: 2, param: "cpu", opt: "nvme", strata: fmt.Sprintf(`"overlap": %q, "dpu_warmup_steps": 1, `, ov)}
		runs = append(runs, run{name: "stage3/nvme/" + ov, dpu: ov == OverlapDPU, js: func(t *testing.T) string {
			nvmetest.Require(t)
			return s.configJSON(nvmetest.Dir(t))
		}})
	}
	for _, r := range runs {
		for _, rule := range scaleRules {
			t.Run(r.name+"/"+rule.name, func(t *testing.T) {
				js := withFP16(r.js(t), `, "initial_scale_power": 4, "loss_scale_window": 3`+rule.keys)
				e := newEngineJSON(t, js, 2)
				last := e.layout.Chunks[len(e.layout.Chunks)-1].Name
				// An overflow in one rank's gradient reaches every rank's
				// shard sum: at stage 0 through the AllReduce, which every
				// rank holds whole (rank 0's sum is the norm), so the
				// Inf goes there; at stages 1-3 into rank 1's shard.
				faulty := 1
				if e.stage == 0 {
					faulty = 0
				}
				for i, overflow := range overflowSchedule {
					var before *checkpoint.State
					if overflow {
						before = stateOf(t, e)
						e.gradFault = func(rank, c int) bool { return rank == faulty && c == len(e.layout.Chunks)-1 }
					}
					updates := e.updates()
					st, err := e.Step()
					e.gradFault = nil
					if err != nil {
						t.Fatalf("step %d: %v", i+1, err)
					}
					if st.LossScale != rule.scales[i] || st.Skipped != overflow {
						t.Fatalf("step %d ran with scale %g, skipped %v; the rules give %g, %v (Inf in rank %d's %s gradient: %v)",
							i+1, st.LossScale, st.Skipped, rule.scales[i], overflow, faulty, last, overflow)
					}
					if !overflow {
						if e.updates() != updates+1 {
							t.Fatalf("step %d: optimizer step count %d -> %d", i+1, updates, e.updates())
						}
						continue
					}
					if e.updates() != updates || e.StepCount() != int64(i+1) {
						t.Fatalf("skipped step %d: optimizer step count %d -> %d, step %d", i+1, updates, e.updates(), e.StepCount())
					}
					after := stateOf(t, e)
					after.Step = before.Step
					if r.dpu {
						dropParams(before)
						dropParams(after)
					}
					sameState(t, fmt.Sprintf("after the skipped step %d vs before it", i+1), after, before)
				}
				if e.SkippedSteps() != 3 || e.Summary().SkippedSteps != 3 {
					t.Fatalf("skipped steps %d, summary %d, want 3", e.SkippedSteps(), e.Summary().SkippedSteps)
				}
			})
		}
	}
}

// withDPUWarmup makes dpu delay from the second update on.
func withDPUWarmup(js string) string {
	return strings.Replace(js, `"strata": {`, `"strata": {"dpu_warmup_steps": 1, `, 1)
}

// dropParams removes the params from a state (dpu compares master, m, v).
func dropParams(st *checkpoint.State) {
	if k := st.StateIndex(shard.Param); k >= 0 {
		st.States = append(st.States[:k:k], st.States[k+1:]...)
		for r := range st.Data {
			for c := range st.Data[r] {
				st.Data[r][c] = append(st.Data[r][c][:k:k], st.Data[r][c][k+1:]...)
			}
		}
	}
}

// TestFP16MinScale: an overflow at min_loss_scale is one error naming the
// step and the scale, and nothing is updated (nor the step count).
func TestFP16MinScale(t *testing.T) {
	s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1}
	e := newEngineJSON(t, withFP16(s.configJSON(), `, "initial_scale_power": 4, "hysteresis": 1, "min_loss_scale": 4`), 2)
	e.gradFault = func(rank, c int) bool { return rank == 0 && c == 0 }
	for step, scale := range []float64{16, 8} {
		if st, err := e.Step(); err != nil || !st.Skipped || st.LossScale != scale {
			t.Fatalf("step %d: %+v, %v; want skipped at scale %g", step+1, st, err, scale)
		}
	}
	before := stateOf(t, e)
	_, err := e.Step()
	if err == nil || !strings.Contains(err.Error(), "step 3: fp16 gradients overflow at loss scale 4, which is fp16.min_loss_scale") {
		t.Fatalf("got %v, want the min_loss_scale error of step 3 at scale 4", err)
	}
	if e.StepCount() != 2 || e.LossScale() != 4 {
		t.Fatalf("after the error: step %d scale %g, want 2 and 4", e.StepCount(), e.LossScale())
	}
	sameState(t, "after the min_loss_scale error vs before", stateOf(t, e), before)
}

// TestFP16NaturalOverflow: a scale far too large for fp16 (2^40: the
// weight gradients pass 65504) overflows for real, with no fault
// injected; the steps are skipped, halving the scale each time
// (hysteresis 1), until one fits, and training goes on from the initial
// state: nothing of the skipped steps was applied.
func TestFP16NaturalOverflow(t *testing.T) {
	s := runSpec{stage: 1, n: 2, offload: true, micro: 1, accum: 1}
	e := newEngineJSON(t, withFP16(s.configJSON(), `, "initial_scale_power": 40, "hysteresis": 1`), 2)
	init := stateOf(t, e)
	scale := float64(1 << 40)
	skipped := 0
	for step := 1; ; step++ {
		st, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		if st.LossScale != scale {
			t.Fatalf("step %d ran with scale %g, want %g", step, st.LossScale, scale)
		}
		if !st.Skipped {
			break
		}
		skipped++
		scale /= 2
		if step == 40 {
			t.Fatal("40 steps skipped")
		}
		now := stateOf(t, e)
		now.Step = init.Step
		sameState(t, fmt.Sprintf("after skipped step %d vs the initial state", step), now, init)
	}
	if skipped < 10 {
		t.Fatalf("%d steps skipped from 2^40: fp16's largest value is 65504, the scaled gradients should overflow for 2^20 of scale at least", skipped)
	}
	losses := trainFor(t, e, 10)
	if last := losses[len(losses)-1]; !(last > 0 && last < losses[0]*1.5) {
		t.Fatalf("losses after the overflows: %v", losses)
	}
}

// TestFP16Resume: an fp16 run saved after skipped steps resumes with its
// scale, its hysteresis and its skipped-step count, bit-identical to the
// run that went on (dpu: the last step before the save skipped, so the
// resumed run owes no upload).
func TestFP16Resume(t *testing.T) {
	for _, ov := range []string{OverlapExact, OverlapDPU} {
		t.Run(ov, func(t *testing.T) {
			s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
			js := withFP16(withDPUWarmup(withOverlap(s.configJSON(), ov)), `, "initial_scale_power": 4, "loss_scale_window": 3`)
			a := newEngineJSON(t, js, 2)
			for i, overflow := range overflowSchedule[:5] {
				if overflow {
					a.gradFault = func(rank, c int) bool { return rank == 0 && c == 1 }
				}
				if _, err := a.Step(); err != nil {
					t.Fatalf("step %d: %v", i+1, err)
				}
				a.gradFault = nil
			}
			dir := t.TempDir()
			path, err := a.SaveCheckpoint(dir, checkpoint.Options{})
			if err != nil {
				t.Fatal(err)
			}
			m, _, err := checkpoint.ReadManifest(path)
			if err != nil || m.FP16 == nil || m.FP16.SkippedSteps != 3 || m.FP16.Scaler.Scale != 4 || m.FP16.Scaler.LastOverflow != 4 || m.FP16.Scaler.Iter != 5 {
				t.Fatalf("manifest fp16 %+v, %v; want 3 skipped, scale 4, the last step skipped", m.FP16, err)
			}
			b := newEngineJSON(t, js, 2)
			if err := b.LoadCheckpoint(path); err != nil {
				t.Fatal(err)
			}
			if b.LossScale() != 4 || b.SkippedSteps() != 3 || b.updates() != 2 {
				t.Fatalf("resumed: scale %g, skipped %d, updates %d", b.LossScale(), b.SkippedSteps(), b.updates())
			}
			la, lb := trainFor(t, a, 4), trainFor(t, b, 4)
			for i := range la {
				if la[i] != lb[i] {
					t.Fatalf("step %d: loss %v went on, %v resumed", 6+i, la[i], lb[i])
				}
			}
			sameState(t, "resumed vs went on", stateOf(t, b), stateOf(t, a))
			if a.LossScale() != b.LossScale() {
				t.Fatalf("scale %g went on, %g resumed", a.LossScale(), b.LossScale())
			}
		})
	}
}

// TestFP16ResumeAcrossPrecision: a bf16 checkpoint is refused by an fp16
// run (and the other way round) with the one error that says why and what
// to do, before anything is restored.
func TestFP16ResumeAcrossPrecision(t *testing.T) {
	s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1}
	bf := newEngineJSON(t, s.configJSON(), 2)
	fp := newEngineJSON(t, withFP16(s.configJSON(), ""), 2)
	trainFor(t, bf, 1)
	trainFor(t, fp, 1)
	for _, c := range []struct {
		from, into *Engine
		want       string
	}{{bf, newEngineJSON(t, withFP16(s.configJSON(), ""), 2), "saved in bf16 mixed precision, this run trains in f16"},
		{fp, newEngineJSON(t, s.configJSON(), 2), "saved in f16 mixed precision, this run trains in bf16"}} {
		path, err := c.from.SaveCheckpoint(t.TempDir(), checkpoint.Options{})
		if err != nil {
			t.Fatal(err)
		}
		before := stateOf(t, c.into)
		if err := c.into.LoadCheckpoint(path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("got %v, want %q", err, c.want)
		}
		sameState(t, "after the refused load", stateOf(t, c.into), before)
	}
}

// TestFP16NoUpdate: FP16NoUpdate is the error of an fp16 engine none of
// whose steps brought a gradient to the weights: all skipped for an
// overflow (initial_scale_power 100, hysteresis 1: 2^100 halves 3 times
// in 3 steps, still far past fp16's 65504; the static 1e30 never moves)
// or all with every gradient flushed to zero (static 1e-30: the scaled
// gradients are under fp16's smallest subnormal 2^-24); each error names
// the cause and the key to change. A run that skips its first steps and
// then updates is fine, and LoadCheckpoint starts the count afresh.
func TestFP16NoUpdate(t *testing.T) {
	s := runSpec{stage: 1, n: 2, offload: true, micro: 1, accum: 1}
	for _, c := range []struct {
		name, keys, want string
		skipped, zero    bool
	}{
		{"dynamic-overflow", `, "initial_scale_power": 100, "hysteresis": 1`, "engine: fp16: all 3 steps overflowed and were skipped (loss scale 1.26765e+30 at the first, 1.58456e+29 now): no update reached the weights; lower fp16.initial_scale_power", true, false},
		{"static-overflow", `, "loss_scale": 1e30`, "engine: fp16: all 3 steps overflowed at the static fp16.loss_scale 1e+30 and were skipped: no update reached the weights; lower loss_scale, or set it to 0", true, false},
		{"static-underflow", `, "loss_scale": 1e-30`, "engine: fp16: every gradient of 3 of the 3 steps flushed to zero at loss scale 1e-30 (a gradient norm of 0): no update reached the weights; raise fp16.loss_scale", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngineJSON(t, withFP16(s.configJSON(), c.keys), 2)
			if err := e.FP16NoUpdate(); err != nil {
				t.Fatalf("before any step: %v", err)
			}
			for range 3 {
				st, err := e.Step()
				if err != nil {
					t.Fatal(err)
				}
				if st.Skipped != c.skipped || (st.GradNorm == 0) != c.zero {
					t.Fatalf("step %d: skipped %v grad norm %v; want skipped %v, zero norm %v", st.Step, st.Skipped, st.GradNorm, c.skipped, c.zero)
				}
			}
			if err := e.FP16NoUpdate(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
	t.Run("some-skipped", func(t *testing.T) {
		e := newEngineJSON(t, withFP16(s.configJSON(), `, "initial_scale_power": 40, "hysteresis": 1`), 2)
		for {
			st, err := e.Step()
			if err != nil {
				t.Fatal(err)
			}
			if !st.Skipped {
				break
			}
		}
		if e.SkippedSteps() == 0 {
			t.Fatal("no step skipped from 2^40")
		}
		if err := e.FP16NoUpdate(); err != nil {
			t.Fatalf("skipped %d steps, then updated: %v", e.SkippedSteps(), err)
		}
		dir := t.TempDir()
		if _, err := e.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
			t.Fatal(err)
		}
		if err := e.LoadCheckpoint(dir); err != nil {
			t.Fatal(err)
		}
		if err := e.FP16NoUpdate(); err != nil {
			t.Fatalf("after LoadCheckpoint, no step run: %v", err)
		}
	})
}
