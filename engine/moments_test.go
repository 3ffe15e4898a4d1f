package engine

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
)

// momentsShapeJSON has shards of at least dtype.Q8MinElems on N = 2 (a
// block is 12·64² params, the embedding 256·64), so int8 moments are
// stored as codes, not in the small-shard fp32.
const momentsShapeJSON = `{"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "max_seq_len": 16}`

func momentsSpec(moments string, stage int, param, opt string) tierSpec {
	return tierSpec{n: 2, stage: stage, param: param, opt: opt, shapeJSON: momentsShapeJSON,
		strata: fmt.Sprintf(`"optimizer_state": {"moments": %q}, `, moments)}
}

// TestNarrowMomentsEquivalence: with bf16 and int8 moments, stages 1, 2
// and 3 with the optimizer on the host, and stage 3 with params and
// optimizer state on NVMe, end 8 steps with params, master weights and
// losses bit-identical to each other (each precision against itself: the
// same cpuadam kernels on the same bytes, whatever the stage and tier);
// the tier store holds m and v in the precision's bytes; and the runs
// stay near the fp32-moments run (final loss within 2 %: a sanity bound;
// the parity of long runs is bench/moments-parity.sh's).
func TestNarrowMomentsEquivalence(t *testing.T) {
	const steps = 8
	ref, _ := runTier(t, momentsSpec("fp32", 1, "none", "cpu"), Options{}, steps)
	for _, mo := range []string{"bf16", "int8"} {
		base, e := runTier(t, momentsSpec(mo, 1, "none", "cpu"), Options{}, steps)
		dt := map[string]dtype.DType{"bf16": dtype.BF16, "int8": dtype.Q8}[mo]
		var want int64
		for c := range e.chunks {
			want += int64(e.n) * dt.Bytes(e.optElems(c))
		}
		if got := e.tiers.homes[shard.AdamM][shard.Host]; got != want {
			t.Errorf("%s: adam_m in the tier store: %d B, want %d", mo, got, want)
		}
		if f32 := e.tiers.homes[shard.Master][shard.Host]; mo == "int8" && 3*want > f32 {
			t.Errorf("int8 adam_m %d B is more than a third of the fp32 master's %d B", want, f32)
		}
		last, refLast := base.losses[steps-1], ref.losses[steps-1]
		if math.Abs(last-refLast) > 0.02*refLast || base.losses[steps-1] >= base.losses[0] {
			t.Errorf("%s: losses %v, fp32 moments %v", mo, base.losses, ref.losses)
		}
		if m, _ := diff(base.master, ref.master); m == 0 {
			t.Errorf("%s: master weights identical to the fp32-moments run's: the precision was not applied", mo)
		}
		specs := []tierSpec{momentsSpec(mo, 2, "none", "cpu"), momentsSpec(mo, 3, "none", "cpu")}
		if nvmeOK(t) {
			specs = append(specs, momentsSpec(mo, 3, "nvme", "nvme"))
		}
		for _, s := range specs {
			t.Run(mo+"/stage"+fmt.Sprint(s.stage)+"/"+s.String(), func(t *testing.T) {
				got, _ := runTier(t, s, Options{}, steps)
				if m, d := diff(got.params, base.params); m != 0 {
					t.Errorf("params: %d differ from stage 1 (max %g)", m, d)
				}
				if m, d := diff(got.master, base.master); m != 0 {
					t.Errorf("master: %d differ from stage 1 (max %g)", m, d)
				}
				for i := range got.losses {
					if got.losses[i] != base.losses[i] {
						t.Errorf("step %d: loss %v, stage 1 %v", i+1, got.losses[i], base.losses[i])
						break
					}
				}
			})
		}
	}
}

// nvmeOK reports whether NVMe tests can run here (nvmetest.Require's
// condition) without skipping t.
func nvmeOK(t *testing.T) bool {
	ok := false
	t.Run("nvme-available", func(t *testing.T) { nvmetest.Require(t); ok = true })
	return ok
}

// TestNarrowMomentsResume: int8 and bf16 moments resume bit-identically
// (host and NVMe); a checkpoint of int8 moments restored by a run with bf16
// moments, or on another device count, is converted through fp32 and says
// so in a note.
func TestNarrowMomentsResume(t *testing.T) {
	const k = 4
	for _, mo := range []string{"bf16", "int8"} {
		for _, s := range []tierSpec{momentsSpec(mo, 3, "none", "cpu"), momentsSpec(mo, 3, "nvme", "nvme")} {
			t.Run(mo+"/"+s.String(), func(t *testing.T) {
				if s.opt == "nvme" {
					nvmetest.Require(t)
				}
				checkResume(t, func(t *testing.T) *Engine { return newTierEngine(t, s, Options{}) }, k)
			})
		}
	}
	a := newTierEngine(t, momentsSpec("int8", 3, "none", "cpu"), Options{})
	trainFor(t, a, k)
	dir := t.TempDir()
	if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	st := stateOf(t, a)
	if k := st.StateIndex(shard.AdamM); st.States[k].DType != dtype.Q8 {
		t.Fatalf("adam_m saved as %v, want q8", st.States[k].DType)
	}
	for _, s := range []tierSpec{momentsSpec("bf16", 3, "none", "cpu"), {n: 1, param: "none", opt: "cpu", shapeJSON: momentsShapeJSON, strata: `"optimizer_state": {"moments": "int8"}, `}} {
		b := newTierEngine(t, s, Options{})
		if err := b.LoadCheckpoint(dir); err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		converted := strings.Contains(strings.Join(b.Notes(), "\n"), "adam_m q8 → bf16")
		if converted != strings.Contains(s.strata, "bf16") {
			t.Errorf("%v: notes %q", s, b.Notes())
		}
		ma, _ := a.Master()
		mb, _ := b.Master()
		if m, d := diff(ma, mb); m != 0 {
			t.Errorf("%v: master weights differ after the load (%d, max %g)", s, m, d)
		}
		if losses := trainFor(t, b, 2); math.IsNaN(losses[1]) || losses[1] > 2*losses[0] {
			t.Errorf("%v: losses after the converted load %v", s, losses)
		}
	}
}

// remainderSpec is momentsSpec with strata.optimizer_state.master too.
func remainderSpec(moments, master string, stage int, param, opt, more string) tierSpec {
	s := momentsSpec(moments, stage, param, opt)
	s.strata = fmt.Sprintf(`"optimizer_state": {"moments": %q, "master": %q}, `, moments, master) + more
	return s
}

// TestRemainderMasterEquivalence: a master kept as the bf16 param plus a
// remainder (strata.optimizer_state.master "bf16+remainder") trains to
// the bits of the fp32 master's run, with fp32 and int8 moments: losses,
// params and master weights after 8 steps, at stage 1 and 3 with the
// optimizer on the host (the params it completes in the upload staging),
// with offload_param (in the tier store's param copy, leased for Update),
// on NVMe, under dpu (staged again) and with LoRA (the base frozen: no
// master; the adapters' masters kept so); the tier store holds 2.125 bytes
// per master. It fails when the remainder drops its up bit or the params
// it completes are not the masters' (a stale staging or param copy).
func TestRemainderMasterEquivalence(t *testing.T) {
	const steps = 8
	budget := int64(7 << 19)
	type cfg struct {
		stage      int
		param, opt string
		more       string
		hostBudget int64 // 0: none
	}
	cfgs := []cfg{{1, "none", "cpu", "", 0}, {3, "none", "cpu", "", 0}, {3, "cpu", "cpu", "", 0}, {3, "cpu", "cpu", `"overlap": "dpu", `, 0}, {2, "none", "cpu", `"overlap": "serial", `, 0},
		{3, "cpu", "cpu", loraKeys + ", ", 0}}
	if nvmeOK(t) {
		cfgs = append(cfgs, cfg{3, "nvme", "nvme", "", 0}, cfg{3, "nvme", "nvme", "", budget})
	}
	for _, mo := range []string{"fp32", "int8"} {
		for _, c := range cfgs {
			t.Run(fmt.Sprintf("%s/stage%d/param-%s/opt-%s/%s/budget-%d", mo, c.stage, c.param, c.opt, strings.Trim(c.more, `", `), c.hostBudget), func(t *testing.T) {
				spec := func(master string) tierSpec {
					s := remainderSpec(mo, master, c.stage, c.param, c.opt, c.more)
					s.hostBudget = c.hostBudget
					return s
				}
				want, _ := runTier(t, spec("fp32"), Options{}, steps)
				got, e := runTier(t, spec("bf16+remainder"), Options{}, steps)
				var rem int64
				for c := range e.chunks {
					if !e.isFrozen(c) {
						rem += int64(e.n) * dtype.Rem16.Bytes(e.optElems(c))
					}
				}
				if h := e.tiers.homes[shard.Master]; h[shard.Host]+h[shard.NVMe] != rem {
					t.Errorf("master in the tier store: %d B, want %d", h[shard.Host]+h[shard.NVMe], rem)
				}
				for i := range got.losses {
					if got.losses[i] != want.losses[i] {
						t.Fatalf("step %d: loss %v, fp32 master %v", i+1, got.losses[i], want.losses[i])
					}
				}
				if m, d := diff(got.params, want.params); m != 0 {
					t.Errorf("params: %d differ from the fp32 master's run (max %g)", m, d)
				}
				if m, d := diff(got.master, want.master); m != 0 {
					t.Errorf("master: %d differ from the fp32 master's run (max %g)", m, d)
				}
				checkUpdateReadsParams(t, e)
			})
		}
	}
}

// TestRemainderMasterResume: a remainder master resumes bit-identically
// (host and NVMe, exact overlap and dpu); its checkpoint holds fp32
// masters, so a checkpoint of the fp32 master's run loads into a remainder
// run (and back) and both go on to the same bits.
func TestRemainderMasterResume(t *testing.T) {
	const k = 4
	for _, s := range []tierSpec{remainderSpec("int8", "bf16+remainder", 3, "none", "cpu", ""), remainderSpec("fp32", "bf16+remainder", 3, "cpu", "cpu", `"overlap": "dpu", `),
		remainderSpec("fp32", "bf16+remainder", 3, "nvme", "nvme", "")} {
		t.Run(s.String()+"/"+s.strata, func(t *testing.T) {
			if s.opt == "nvme" {
				nvmetest.Require(t)
			}
			checkResume(t, func(t *testing.T) *Engine { return newTierEngine(t, s, Options{}) }, k)
		})
	}
	for _, from := range []string{"fp32", "bf16+remainder"} {
		to := map[string]string{"fp32": "bf16+remainder", "bf16+remainder": "fp32"}[from]
		a := newTierEngine(t, remainderSpec("fp32", from, 3, "cpu", "cpu", ""), Options{})
		trainFor(t, a, k)
		dir := t.TempDir()
		if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
			t.Fatal(err)
		}
		st := stateOf(t, a)
		if k := st.StateIndex(shard.Master); st.States[k].DType != dtype.F32 {
			t.Fatalf("%s: master saved as %v, want f32", from, st.States[k].DType)
		}
		b := newTierEngine(t, remainderSpec("fp32", to, 3, "cpu", "cpu", ""), Options{})
		if err := b.LoadCheckpoint(dir); err != nil {
			t.Fatalf("%s → %s: %v", from, to, err)
		}
		la, lb := trainFor(t, a, k), trainFor(t, b, k)
		ma, _ := a.Master()
		mb, _ := b.Master()
		if m, d := diff(ma, mb); m != 0 || fmt.Sprint(la) != fmt.Sprint(lb) {
			t.Errorf("%s → %s: losses %v and %v, %d masters differ (max %g)", from, to, la, lb, m, d)
		}
	}
}

// TestRemainderMasterRefused: a remainder master with fp32 params (a
// library's Options.Precision; the config refuses fp16 and an optimizer
// on the device itself) is one error at New, naming the key.
func TestRemainderMasterRefused(t *testing.T) {
	s := remainderSpec("fp32", "bf16+remainder", 3, "none", "cpu", "")
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	_, err = startEngine(t, testConfig(t, s.configJSON("")), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Precision: gpu.F32})
	if err == nil || !strings.Contains(err.Error(), `strata.optimizer_state.master "bf16+remainder" needs bf16 params`) {
		t.Fatalf("fp32 params with a remainder master: %v", err)
	}
}

// checkUpdateReadsParams: the host optimizer of a remainder master whose
// params live in the tier store (offload_param, not staged) declares its
// param access an Update (the old params are the masters' high halves;
// a Write would let the planner hand it a copy it never read from NVMe),
// and every other chunk's, or none, a Write.
func checkUpdateReadsParams(t *testing.T, e *Engine) {
	t.Helper()
	d := e.tiers.runners[0]
	var tr prefetch.Trace
	d.Do(func() { tr = d.p.Trace() })
	for _, a := range tr.Accesses {
		if a.Phase != shard.Optimizer || a.Key.State != shard.Param {
			continue
		}
		want := shard.Write
		if e.masters.params(e.ranks[0], int(a.Key.Chunk)) == nil {
			want = shard.Update
		}
		if a.Kind != want {
			t.Fatalf("the host optimizer's access %v, want %v", a, want)
		}
	}
}
