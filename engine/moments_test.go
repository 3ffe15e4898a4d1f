package engine

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/nvme/nvmetest"
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
