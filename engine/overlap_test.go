package engine

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// withOverlap sets strata.overlap in a test config.
func withOverlap(js, overlap string) string {
	return strings.Replace(js, `"strata": {`, fmt.Sprintf(`"strata": {"overlap": %q, `, overlap), 1)
}

// overlapRun trains steps steps of the config js on n devices and returns
// the losses, params, master weights and per-step stats, with pending[i]
// whether every rank still had a host update pending when Step i+1
// returned.
type overlapRun struct {
	res       result
	stats     []report.StepStats
	pending   []bool
	bwdChunks int   // chunks updated during a backward, all ranks
	undoBytes int64 // Summary.HostUndoBytes
	// Summary.BackwardUpdates and BackwardRedos: steps whose update began
	// in the backward, and of them those clipped and updated again.
	bwdSteps, bwdRedos int64
	hostBytes          int64 // Summary.HostBytes: the store's host homes
}

func runOverlap(t *testing.T, js string, n, steps int) overlapRun {
	t.Helper()
	e := newEngineJSON(t, js, n)
	var out overlapRun
	for range steps {
		st, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		out.res.losses = append(out.res.losses, st.Loss)
		out.stats = append(out.stats, st)
		all := true
		for _, r := range e.ranks {
			all = all && r.run != nil
		}
		out.pending = append(out.pending, all)
	}
	var err error
	if out.res.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if out.res.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	for _, r := range e.ranks {
		if r.run == nil {
			continue
		}
		if _, delayed := r.run.sched.(delayedSchedule); !delayed { // dpu: the upload waits for the next pass
			t.Errorf("rank %d: a host update still pending after Params (%s)", r.idx, r.run.state)
		}
	}
	for _, r := range e.ranks {
		out.bwdChunks += r.bwdChunks
	}
	s := e.Summary()
	if s.Overlap == "" || s.HostOpt.Adam <= 0 {
		t.Errorf("summary: overlap %q, host optimizer %+v", s.Overlap, s.HostOpt)
	}
	out.undoBytes, out.hostBytes = s.HostUndoBytes, s.HostBytes
	out.bwdSteps, out.bwdRedos = s.BackwardUpdates, s.BackwardRedos
	return out
}

// TestOverlapExact: with the optimizer on the host, overlap exact (Step
// returns with every rank's update pending; the next step's reads of a
// chunk wait for that chunk) ends bit-identical to serial (the update
// inside Step) at stages 1-3 on 2 devices, with params and optimizer state
// in host RAM and on NVMe: params, master weights and every loss. It also
// checks where the host optimizer's figures are reported: with serial in
// the step that ran it, with exact in the next one.
func TestOverlapExact(t *testing.T) {
	const steps = 6
	type spec struct {
		name string
		js   func(t *testing.T) string
	}
	var specs []spec
	for _, stage := range []int{1, 2, 3} {
		s := runSpec{stage: stage, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
		specs = append(specs, spec{s.String(), func(*testing.T) string { return s.configJSON() }})
	}
	ts := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
	specs = append(specs, spec{ts.String(), func(t *testing.T) string { return ts.configJSON(nvmetest.Dir(t)) }})
	for _, sp := range specs {
		t.Run(sp.name, func(t *testing.T) {
			serial := runOverlap(t, withOverlap(sp.js(t), OverlapSerial), 2, steps)
			exact := runOverlap(t, withOverlap(sp.js(t), OverlapExact), 2, steps) // its own swap directory
			if !slices.Equal(serial.res.losses, exact.res.losses) {
				t.Errorf("losses differ:\nserial %v\nexact  %v", serial.res.losses, exact.res.losses)
			}
			if m, d := diff(exact.res.params, serial.res.params); m != 0 {
				t.Errorf("params: %d differ (max %g)", m, d)
			}
			if m, d := diff(exact.res.master, serial.res.master); m != 0 {
				t.Errorf("master: %d differ (max %g)", m, d)
			}
			for i := range steps {
				if serial.pending[i] || !exact.pending[i] {
					t.Errorf("step %d: update pending after Step: serial %v, exact %v (want false, true)", i+1, serial.pending[i], exact.pending[i])
				}
				if serial.stats[i].HostOpt.Adam <= 0 {
					t.Errorf("step %d: serial reports no cpu adam time", i+1)
				}
				if got := exact.stats[i].HostOpt.Adam > 0; got != (i > 0) {
					t.Errorf("step %d: exact reports cpu adam time %v (want it from step 2 on: the previous step's update)", i+1, exact.stats[i].HostOpt.Adam)
				}
				if h := serial.stats[i].HostOpt; h.AdamExposed > h.Adam || h.IOExposed > h.IOWait {
					t.Errorf("step %d: exposed above busy: %+v", i+1, h)
				}
			}
		})
	}
}

// TestHostOptFraction: the exposed fraction of cpuadam's time (the
// figures themselves are timeline's: TestExposedOf).
func TestHostOptFraction(t *testing.T) {
	if f := (report.HostOptStats{Adam: 4, AdamExposed: 1}).AdamExposedFraction(); f != 0.25 {
		t.Errorf("exposed fraction %v, want 0.25", f)
	}
}

// TestForwardOrder: the host optimizer runs the chunks in the order the
// forward first reads them: the embeddings, the blocks, the final
// layernorm; under dpu in the order the backward makes their gradients.
func TestForwardOrder(t *testing.T) {
	if got := forwardOrder(model.AccessOrder(model.Shape{Layers: 3}), 5); !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("forward order %v", got)
	}
	// A delayed update's: the backward's, which makes the final
	// layernorm's gradient ready first and the tied embeddings' last.
	if got := gradientOrder(model.AccessOrder(model.Shape{Layers: 3}), 5); !slices.Equal(got, []int{4, 3, 2, 1, 0}) {
		t.Errorf("gradient order %v", got)
	}
}

// TestOverlapDuringBackward: with strata.update_in_backward and without
// clipping, each chunk's cpuadam starts
// during the backward, once its reduced gradient is in host memory, and
// the run still ends bit-identical to serial (stages 1-3 on 2 devices,
// optimizer state in host RAM).
func TestOverlapDuringBackward(t *testing.T) {
	const steps = 5
	for _, stage := range []int{1, 2, 3} {
		s := runSpec{stage: stage, n: 2, offload: true, micro: 1, accum: 1}
		t.Run(s.String(), func(t *testing.T) {
			serial := runOverlap(t, inBackward(withOverlap(s.configJSON(), OverlapSerial)), 2, steps)
			exact := runOverlap(t, inBackward(withOverlap(s.configJSON(), OverlapExact)), 2, steps)
			if !slices.Equal(serial.res.losses, exact.res.losses) {
				t.Errorf("losses differ:\nserial %v\nexact  %v", serial.res.losses, exact.res.losses)
			}
			if m, d := diff(exact.res.params, serial.res.params); m != 0 {
				t.Errorf("params: %d differ (max %g)", m, d)
			}
			if m, d := diff(exact.res.master, serial.res.master); m != 0 {
				t.Errorf("master: %d differ (max %g)", m, d)
			}
			// Every chunk of every rank in every step (none is a
			// tier-store param without offload_param).
			if want := steps * 2 * 4; exact.bwdChunks != want || serial.bwdChunks != 0 {
				t.Errorf("chunks updated during the backward: exact %d (want %d), serial %d (want 0)", exact.bwdChunks, want, serial.bwdChunks)
			}
			// Off by default: the undo copy costs host RAM the size of
			// the optimizer state.
			if def := runOverlap(t, withOverlap(s.configJSON(), OverlapExact), 2, 1); def.bwdChunks != 0 || def.undoBytes != 0 {
				t.Errorf("without strata.update_in_backward %d chunks were updated during the backward, undo copy %d B", def.bwdChunks, def.undoBytes)
			}
			// The undo copy is counted: master, m and v (12 B) of every
			// element whose state is homed in host RAM with its bf16
			// gradient shard (2 B), every rank.
			if exact.undoBytes == 0 || 14*exact.undoBytes != 12*exact.hostBytes {
				t.Errorf("summary: undo copy %d B, want 12/14 of the %d B of host homes", exact.undoBytes, exact.hostBytes)
			}
		})
	}
}

// TestClippedDuringBackward: with gradient clipping,
// strata.update_in_backward speculates (each chunk's update begins in the
// backward as if the step were not clipped) and validates: a step that is
// not clipped commits it, one that is undoes it and updates after the
// backward, and the step after a clipped one does not speculate. On 2
// devices at stage 2, with the threshold at the median of an unclipped
// run's gradient norms (so that some steps clip and some do not), the run
// ends bit-identical to serial (losses, params, master), and the steps that
// speculated and were redone are those the norms say. With an fp32 master
// and with a remainder (whose undo puts back the params it completes).
func TestClippedDuringBackward(t *testing.T) {
	for _, master := range []string{"fp32", "bf16+remainder"} {
		t.Run(master, func(t *testing.T) { clippedDuringBackward(t, master) })
	}
}

func clippedDuringBackward(t *testing.T, master string) {
	const steps = 8
	s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1}
	js := func(overlap string) string {
		js := withOverlap(s.configJSON(), overlap)
		return strings.Replace(js, `"strata": {`, fmt.Sprintf(`"strata": {"optimizer_state": {"master": %q}, `, master), 1)
	}
	var norms []float64
	for _, st := range runOverlap(t, js(OverlapSerial), 2, steps).stats {
		norms = append(norms, st.GradNorm)
	}
	slices.Sort(norms)
	s.clip = norms[steps/2]
	serial := runOverlap(t, js(OverlapSerial), 2, steps)
	bwd := runOverlap(t, inBackward(js(OverlapExact)), 2, steps)
	sameResult(t, "update in the backward against serial", bwd.res, serial.res)
	var specs, redos, commits int64
	var clipped []bool
	for i, st := range serial.stats {
		clipped = append(clipped, st.ClipCoef < 1)
		if i > 0 && clipped[i-1] {
			continue // no speculation after a clipped step
		}
		specs++
		if clipped[i] {
			redos++
		} else {
			commits++
		}
	}
	if redos == 0 || commits == 0 {
		t.Fatalf("clipping at %g: steps clipped %v: the test needs a speculation redone and one committed", s.clip, clipped)
	}
	if bwd.bwdSteps != specs || bwd.bwdRedos != redos || bwd.bwdChunks != int(specs)*2*4 {
		t.Errorf("steps clipped %v: %d steps began their update in the backward (%d chunks), %d redone; want %d (%d chunks), %d",
			clipped, bwd.bwdSteps, bwd.bwdChunks, bwd.bwdRedos, specs, specs*2*4, redos)
	}
}

// inBackward switches strata.update_in_backward on in a test config.
func inBackward(js string) string {
	return strings.Replace(js, `"strata": {`, `"strata": {"update_in_backward": true, `, 1)
}

// TestNonFiniteDuringBackward: a NaN in one rank's gradient of the chunk
// reduced last (the embeddings), on 2 ranks, stops the step after the
// other chunks were updated during the backward: the step fails with
// ErrNonFinite and every state (params, master, m, v, the step) is what
// it was before it; the step retried without the NaN ends bit-identical
// to a run that never saw it. With an fp32 master and with a remainder.
func TestNonFiniteDuringBackward(t *testing.T) {
	for _, master := range []string{"fp32", "bf16+remainder"} {
		t.Run(master, func(t *testing.T) { nonFiniteDuringBackward(t, master) })
	}
}

// nonFiniteDuringBackward is TestNonFiniteDuringBackward with the master
// kept as master (strata.optimizer_state.master): a remainder's undo puts
// back the params it completes too.
func nonFiniteDuringBackward(t *testing.T, master string) {
	s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1}
	js := inBackward(withOverlap(s.configJSON(), OverlapExact))
	js = strings.Replace(js, `"strata": {`, fmt.Sprintf(`"strata": {"optimizer_state": {"master": %q}, `, master), 1)
	e := newEngineJSON(t, js, 2)
	clean := newEngineJSON(t, js, 2)
	for range 2 {
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		if _, err := clean.Step(); err != nil {
			t.Fatal(err)
		}
	}
	before := stateOf(t, e)
	emb := e.layout.Chunks[0].Name
	e.gradFault = func(r, c int) bool { return r == 1 && c == 0 }
	if _, err := e.Step(); !errors.Is(err, model.ErrNonFinite) {
		t.Fatalf("got %v, want ErrNonFinite (NaN in rank 1's %s gradient)", err, emb)
	}
	e.gradFault = nil
	if n := e.ranks[0].bwdChunks; n < 3*4-1 {
		t.Fatalf("rank 0 updated %d chunks during the backward, want the failed step's too", n)
	}
	sameState(t, "after the non-finite step vs before it", stateOf(t, e), before)
	for range 2 {
		if _, err := e.Step(); err != nil {
			t.Fatal(err)
		}
		if _, err := clean.Step(); err != nil {
			t.Fatal(err)
		}
	}
	sameState(t, "retried vs never failed", stateOf(t, e), stateOf(t, clean))
}

// TestTierFaultInOptimizer: with the optimizer state on NVMe (params in
// host RAM, so every NVMe read is the optimizer's), an NVMe read error
// under the pipelined update ends a Step (the one that leases, or the next
// one, whose pass finishes the update) with one error naming the engine
// once, the shard and the swap file, on 2 ranks, without hanging; the
// next Step fails too, and Close (a cleanup) ends every goroutine. The
// same under dpu (one exact step, then delayed: the leases of the pass and
// the store of the new params at its end), with the params on NVMe too.
func TestTierFaultInOptimizer(t *testing.T) {
	nvmetest.Require(t)
	for _, c := range []struct {
		param, strata string
		nth           int // the read that fails: early, or in the steps whose pass leases
	}{{"cpu", "", 3}, {"cpu", "", 40}, {"nvme", `"overlap": "dpu", "dpu_warmup_steps": 1, `, 40}} {
		t.Run(fmt.Sprintf("%s/%s/read%d", c.param, map[bool]string{true: "exact", false: "dpu"}[c.strata == ""], c.nth), func(t *testing.T) {
			var faulty *nvme.Faulty
			s := tierSpec{n: 2, param: c.param, opt: "nvme", shapeJSON: deepShapeJSON, strata: c.strata}
			e := newTierEngine(t, s, Options{NVMeDevice: func(d nvme.Device) nvme.Device {
				faulty = nvme.NewFaulty(d, nvme.Fault{Kind: nvme.FaultEIO, Op: nvme.OpRead, Nth: c.nth})
				return faulty
			}})
			var err error
			for range 8 {
				if _, err = stepWithin(t, e); err != nil {
					break
				}
			}
			if err == nil {
				t.Fatalf("8 steps without an error; %d faults injected", faulty.Injected(nvme.FaultEIO))
			}
			t.Logf("step %d: %v", e.StepCount()+1, err)
			checkFaultMessage(t, err, ".swap", "EIO")
			if _, err2 := stepWithin(t, e); err2 == nil {
				t.Error("the step after the failure succeeded")
			}
		})
	}
}

// dpuSpec is a host-optimizer run with overlap dpu after warm steps.
func dpuJSON(s runSpec, warm int) string {
	return strings.Replace(withOverlap(s.configJSON(), OverlapDPU), `"strata": {`, fmt.Sprintf(`"strata": {"dpu_warmup_steps": %d, `, warm), 1)
}

// TestDPU: the delayed parameter update. (1) During the warm-up it is
// exact: bit-identical to exact. (2) After it, step t's pass reads the
// params of step t-1: the first delayed step's loss equals exact's (same
// params), the next differs. (3) Resume: train k steps, save, train k more;
// a new engine loads the checkpoint and trains k steps: bit-identical
// states and losses (the pending upload is rebuilt from master). (4)
// Convergence against exact on the same data: over 40 steps (warm-up 5)
// the mean loss of the last 10 steps is within 2 % of exact's (measured:
// see the log), and it goes down.
func TestDPU(t *testing.T) {
	const warm = 5
	for _, stage := range []int{1, 2, 3} {
		s := runSpec{stage: stage, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
		t.Run(s.String(), func(t *testing.T) {
			exact := runOverlap(t, withOverlap(s.configJSON(), OverlapExact), 2, warm+2)
			dpu := runOverlap(t, dpuJSON(s, warm), 2, warm+2)
			for i := range warm + 1 {
				if dpu.res.losses[i] != exact.res.losses[i] {
					t.Errorf("step %d: dpu loss %v, exact %v: want equal (warm-up, or the first delayed step's pass on the same params)", i+1, dpu.res.losses[i], exact.res.losses[i])
				}
			}
			if dpu.res.losses[warm+1] == exact.res.losses[warm+1] {
				t.Errorf("step %d: dpu loss equals exact's: the update was not delayed", warm+2)
			}
			js := dpuJSON(s, warm)
			checkResume(t, func(t *testing.T) *Engine { return newEngineJSON(t, js, 2) }, warm+2) // saved past the warm-up
		})
	}
	t.Run("tiers", func(t *testing.T) {
		// The delayed update does not depend on where the state lives:
		// params and optimizer state in host RAM or on NVMe train
		// bit-identical to the params on the devices with the optimizer
		// state in host RAM (stage 3, N = 2). With the optimizer state on
		// NVMe the rank leases a window of chunks at the step's end and
		// the rest within the next pass, as the delayed cpuadam gives
		// leases back (leasing every chunk at the step's end deadlocked:
		// its cpuadam waits for the next pass). With offload_param the
		// new params wait in the staging for the pass's end
		// (storeDelayed). Resume is bit-identical with the params on
		// NVMe too.
		nvmetest.Require(t)
		const steps = warm + 4
		dpu := fmt.Sprintf(`"overlap": "dpu", "dpu_warmup_steps": %d, `, warm)
		base, _ := runTier(t, tierSpec{n: 2, param: "none", opt: "cpu", shapeJSON: deepShapeJSON, strata: dpu}, Options{}, steps)
		exact, _ := runTier(t, tierSpec{n: 2, param: "none", opt: "cpu", shapeJSON: deepShapeJSON}, Options{}, steps)
		if base.losses[warm+1] == exact.losses[warm+1] {
			t.Fatalf("step %d: dpu loss equals exact's: the update was not delayed", warm+2)
		}
		for _, where := range [][2]string{{"none", "nvme"}, {"cpu", "cpu"}, {"nvme", "nvme"}, {"nvme", "cpu"}} {
			s := tierSpec{n: 2, param: where[0], opt: where[1], shapeJSON: deepShapeJSON, strata: dpu}
			got, _ := runTier(t, s, Options{}, steps)
			if !reflect.DeepEqual(base.losses, got.losses) || !reflect.DeepEqual(base.params, got.params) || !reflect.DeepEqual(base.master, got.master) {
				t.Errorf("dpu, params %s, optimizer %s: losses %v, want those of the params on the devices %v, and the same params and master", where[0], where[1], got.losses, base.losses)
			}
			// Each rank's accesses repeat once the delayed steps run (the
			// first two after the warm-up change the pattern).
			for _, st := range got.stats[warm+2:] {
				if st.Tier.Divergences != 0 {
					t.Errorf("dpu, params %s, optimizer %s: step %d: %d ranks' accesses diverged from their trace", where[0], where[1], st.Step, st.Tier.Divergences)
				}
			}
		}
		s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON, strata: dpu}
		checkResume(t, func(t *testing.T) *Engine { return newTierEngine(t, s, Options{}) }, warm+2)
	})
	t.Run("backward", func(t *testing.T) {
		// A delayed update runs on under the next backward: the rank
		// leases its chunks in the backward's order, half of them at the
		// forward's flushes and the rest at the gradient writes, each
		// write waiting for its own chunk's update only. In forward
		// order, the backward's first write (the last layer's) waited
		// for the whole update, and its I/O ran under the forward alone.
		// Checked at the backward's second gradient write of a delayed
		// step (the first has been written): with the optimizer state on
		// NVMe (a window of 2 chunks) the update has not leased every
		// chunk yet. Its bits are the tiers subtest's.
		nvmetest.Require(t)
		const layers = 12
		shape := fmt.Sprintf(`{"n_layer": %d, "n_embd": 16, "n_head": 2, "vocab_size": 256, "max_seq_len": 16}`, layers)
		s := tierSpec{n: 1, param: "none", opt: "nvme", shapeJSON: shape, strata: fmt.Sprintf(`"overlap": "dpu", "dpu_warmup_steps": %d, `, warm)}
		e := newTierEngine(t, s, Options{})
		if err := e.Run(t.Context(), warm+1, nil); err != nil {
			t.Fatal(err)
		}
		writes, lent, left := 0, -1, 0
		e.gradFault = func(rk, c int) bool {
			if writes++; writes == 2 {
				u := e.ranks[rk].run
				lent = len(u.lent)
				for c := range u.chunks {
					if !u.chunks[c].handed { // the rank's goroutine's (the rest is cpuadam's)
						left++
					}
				}
			}
			return false
		}
		if err := e.Run(t.Context(), 1, nil); err != nil {
			t.Fatal(err)
		}
		e.gradFault = nil
		chunks := len(e.chunks)
		if lent < 1 || left == 0 || lent+left != chunks {
			t.Errorf("at the delayed step's second gradient write the update had leased %d of %d chunks (%d not yet): want some left for the backward", lent, chunks, left)
		}
		t.Logf("at the second gradient write: %d of %d chunks leased", lent, chunks)
		if err := e.Run(t.Context(), 2, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("convergence", func(t *testing.T) {
		s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
		const steps = 40
		exact := runOverlap(t, withOverlap(s.configJSON(), OverlapExact), 2, steps)
		dpu := runOverlap(t, dpuJSON(s, warm), 2, steps)
		mean := func(l []float64) float64 {
			var sum float64
			for _, v := range l {
				sum += v
			}
			return sum / float64(len(l))
		}
		e, d := mean(exact.res.losses[steps-10:]), mean(dpu.res.losses[steps-10:])
		t.Logf("mean loss of steps %d-%d: exact %.4f, dpu %.4f (%+.2f %%); first %.4f", steps-9, steps, e, d, 100*(d-e)/e, exact.res.losses[0])
		if math.Abs(d-e) > 0.02*e {
			t.Errorf("dpu's mean loss %.4f is not within 2 %% of exact's %.4f", d, e)
		}
		if d >= dpu.res.losses[0] {
			t.Errorf("dpu's loss did not go down: %.4f -> %.4f", dpu.res.losses[0], d)
		}
	})
	t.Run("fp32 refused", func(t *testing.T) {
		// fp32 keeps no master apart from the params, which lag the
		// update under dpu: a checkpoint could not hold the pending one.
		s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
		devs, comms, err := cpu.New(cpu.Options{Devices: 2, HBMBytes: 256 << 20})
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(testConfig(t, dpuJSON(s, warm)), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Precision: gpu.F32})
		if !errors.Is(err, ErrNotBuilt) || !strings.Contains(err.Error(), "fp32") {
			t.Errorf("dpu in fp32: %v, want ErrNotBuilt naming fp32", err)
		}
	})
}

// TestDPUStart: a delayed update's cpuadam is let go at the next pass's
// dpuStartFlush-th flushChunk, after a mark on the compute stream, not at
// the first (when the pass has enqueued nothing and the devices are idle);
// the waits that need the update start it with no mark.
func TestDPUStart(t *testing.T) {
	s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, clip: 1}
	e := newEngineJSON(t, dpuJSON(s, 0), 2)
	r := e.ranks[0]
	run := newPending(1, delayedSchedule{}, runLeased, 0)
	run.closed = true // nothing to lease
	r.run = run
	defer func() { r.run = nil }()
	closed := func() bool {
		select {
		case <-run.start:
			return true
		default:
			return false
		}
	}
	for i := 1; i < dpuStartFlush; i++ {
		r.flushChunk(0)
		if closed() {
			t.Fatalf("cpuadam let go at flushChunk call %d, want at %d", i, dpuStartFlush)
		}
	}
	r.flushChunk(0)
	if !closed() || run.startEv == nil {
		t.Fatalf("after %d flushChunk calls: started %v, mark %v; want started after a mark on the compute stream", dpuStartFlush, closed(), run.startEv)
	}
	run.startEv.Synchronize()
	r.flushChunk(0) // later calls change nothing
	other := newPending(1, delayedSchedule{}, runLeasing, 0)
	other.begin(nil) // wait's path: at once, no mark
	if other.startEv != nil {
		t.Error("begin(nil) left a mark")
	}
}
