package engine

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/strata-ai/strata/checkpoint"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
)

// The frozen runs use deepShapeJSON (6 blocks, 8 chunks: embeddings,
// h.0-h.5, ln_f) and freeze the embeddings (a chunk the backward holds
// from the head to the end), two blocks apart (their GradReady between
// trainable ones), and ln_f (gathered on every device at stage 3, below
// the persistence threshold), with substrings and globs.
var (
	freezePatterns = []string{"w?e", "h.1.", "h.[4]*", "ln_f"}
	freezeChunks   = []bool{true, false, true, false, false, true, false, true}
)

// withStrata adds keys (JSON text) to a test config's strata block.
func withStrata(js, keys string) string {
	return strings.Replace(js, `"strata": {`, `"strata": {`+keys+`, `, 1)
}

// withFreeze sets strata.freeze.
func withFreeze(js string, patterns []string) string {
	q := make([]string, len(patterns))
	for i, p := range patterns {
		q[i] = fmt.Sprintf("%q", p)
	}
	return withStrata(js, `"freeze": [`+strings.Join(q, ", ")+`]`)
}

// freezeSpec is one row of the freeze tables: stage, devices, where the
// optimizer state lives (none: the device, cpu: host RAM, nvme), where the
// params live (nvme needs the optimizer off the device), and extra strata
// keys (overlap modes).
type freezeSpec struct {
	stage, n   int
	opt, param string
	extra      string
}

func (s freezeSpec) String() string {
	name := fmt.Sprintf("stage%d/N%d/opt-%s/param-%s", s.stage, s.n, s.opt, s.param)
	if s.extra != "" {
		name += "/" + strings.NewReplacer(`"`, "", " ", "", ":", "=").Replace(s.extra)
	}
	return name
}

// configJSON is the spec's config, without clipping, on deepShapeJSON.
func (s freezeSpec) configJSON(t *testing.T) string {
	var js string
	switch s.opt {
	case "nvme":
		nvmetest.Require(t)
		ts := tierSpec{n: s.n, param: s.param, opt: "nvme", shapeJSON: deepShapeJSON}
		js = strings.Replace(ts.configJSON(nvmetest.Dir(t)), `"gradient_clipping": 1.0`, `"gradient_clipping": 0`, 1)
	default:
		rs := runSpec{stage: s.stage, n: s.n, offload: s.opt == "cpu", micro: 1, accum: 1}
		js = strings.Replace(rs.configJSON(), testShapeJSON, deepShapeJSON, 1)
		if s.param != "none" {
			js = strings.Replace(js, `"offload_optimizer"`, fmt.Sprintf(`"offload_param": {"device": %q}, "offload_optimizer"`, s.param), 1)
		}
	}
	if s.extra != "" {
		js = withStrata(js, s.extra)
	}
	return js
}

// freezeSpecs are the rows for n devices: every stage with the optimizer
// on the device, stages 1-3 with it in host RAM, stage 3 with params in
// host RAM, optimizer state on NVMe with params on the device and on NVMe.
func freezeSpecs(n int) []freezeSpec {
	specs := []freezeSpec{{stage: 0, n: n, opt: "none", param: "none"}}
	for stage := 1; stage <= 3; stage++ {
		specs = append(specs, freezeSpec{stage: stage, n: n, opt: "none", param: "none"}, freezeSpec{stage: stage, n: n, opt: "cpu", param: "none"})
	}
	return append(specs, freezeSpec{stage: 3, n: n, opt: "cpu", param: "cpu"},
		freezeSpec{stage: 3, n: n, opt: "nvme", param: "none"}, freezeSpec{stage: 3, n: n, opt: "nvme", param: "nvme"})
}

type frozenRun struct {
	res   result
	stats []report.StepStats
	e     *Engine
}

// runFrozenJSON trains steps steps of js on n devices; zeroLR gives chunks
// learning rate 0 and weight decay 0 (the reference of a frozen run).
func runFrozenJSON(t *testing.T, js string, n, steps int, zeroLR []bool) frozenRun {
	t.Helper()
	e := newEngineJSON(t, js, n)
	e.zeroLR = zeroLR
	out := frozenRun{e: e}
	for range steps {
		st, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		out.res.losses = append(out.res.losses, st.Loss)
		out.res.norms = append(out.res.norms, st.GradNorm)
		out.stats = append(out.stats, st)
	}
	var err error
	if out.res.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if out.res.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return out
}

// initialParams is chunk c's initial params as the devices hold them
// (bf16) and as the optimizer would hold them (the initial fp32 values).
func initialParams(e *Engine, c int) (param, master []float32) {
	v := e.layout.InitChunk(e.cfg.Strata.Seed, c)
	return decode(encode(v, e.precision), e.precision), v
}

// sameBits counts the elements whose bits differ.
func sameBits(a, b []float32) int {
	n := 0
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n
}

// TestFreezeEquivalence is the check of frozen parameters, for
// stages 0-3, N = 1 and 2, the optimizer on the device, in host RAM and on
// NVMe (and params in host RAM and on NVMe), without clipping:
//
//   - the frozen chunks end with their initial params, to the bit, and
//     the trainable chunks bit-identical (params, master weights) to a run
//     that trains every chunk but gives the frozen ones learning rate 0
//     and weight decay 0 (zeroLR), with the same losses at every step.
//     Why: both runs compute the same forward (the frozen params never
//     change: Adam adds -0·x to the master, and multiplies by 1 - 0·0) and
//     so the same gradients of the trainable chunks, which both update
//     with the same cpuadam calls.
//   - freezing costs nothing but params: no gradient collective for a
//     frozen chunk (the ranks' per-chunk counters), less collective
//     traffic in all; no device model state beyond params (the measured
//     peak equals the estimate, and the reference's peak exceeds it by
//     exactly the summary's savings per device); no tier-store state for
//     their gradients or optimizer state, no upload staging, no NVMe
//     bytes in either direction (no write at all for a frozen param on
//     NVMe: it is never dirty); host and NVMe homes smaller than the
//     reference's by exactly the summary's savings.
func TestFreezeEquivalence(t *testing.T) {
	const steps = 5
	for _, n := range []int{1, 2} {
		specs := freezeSpecs(n)
		if n == 2 { // the host optimizer's other schedules
			specs = append(specs,
				freezeSpec{stage: 2, n: n, opt: "cpu", param: "none", extra: `"update_in_backward": true`},
				freezeSpec{stage: 1, n: n, opt: "cpu", param: "none", extra: `"overlap": "serial"`},
				freezeSpec{stage: 3, n: n, opt: "cpu", param: "none", extra: `"overlap": "dpu", "dpu_warmup_steps": 2`})
		}
		for _, s := range specs {
			t.Run(s.String(), func(t *testing.T) {
				js := s.configJSON(t)
				ref := runFrozenJSON(t, js, n, steps, freezeChunks)
				got := runFrozenJSON(t, withFreeze(js, freezePatterns), n, steps, nil)
				checkFrozenValues(t, got, ref)
				checkFrozenCosts(t, s, got, ref, steps)
			})
		}
	}
}

// checkFrozenValues: frozen chunks at their initial bits, trainable ones
// and the losses as the reference's.
func checkFrozenValues(t *testing.T, got, ref frozenRun) {
	t.Helper()
	e := got.e
	for c, frozen := range freezeChunks {
		if frozen != e.isFrozen(c) {
			t.Fatalf("chunk %d frozen %v, want %v", c, e.isFrozen(c), frozen)
		}
		p0, _ := initialParams(e, c)
		if !frozen {
			if sameBits(got.res.params[c], p0) == 0 {
				t.Errorf("trainable chunk %d did not train", c)
			}
			if m := sameBits(got.res.params[c], ref.res.params[c]); m != 0 {
				t.Errorf("trainable chunk %d: %d params differ from the zero-lr reference", c, m)
			}
			if m := sameBits(got.res.master[c], ref.res.master[c]); m != 0 {
				t.Errorf("trainable chunk %d: %d master weights differ from the zero-lr reference", c, m)
			}
			continue
		}
		if m := sameBits(got.res.params[c], p0); m != 0 {
			t.Errorf("frozen chunk %d: %d params changed", c, m)
		}
		if m := sameBits(got.res.master[c], p0); m != 0 { // its master is its params, widened
			t.Errorf("frozen chunk %d: %d master weights are not its params", c, m)
		}
		if m := sameBits(ref.res.params[c], p0); m != 0 {
			t.Errorf("reference: chunk %d at lr 0 changed %d params: the reference is wrong", c, m)
		}
	}
	if !slices.Equal(got.res.losses, ref.res.losses) {
		t.Errorf("losses differ:\nfrozen    %v\nreference %v", got.res.losses, ref.res.losses)
	}
}

// checkFrozenCosts: no reduction, no optimizer state, no NVMe traffic for
// the frozen chunks, and the summary's savings are the measured
// differences with the reference.
func checkFrozenCosts(t *testing.T, s freezeSpec, got, ref frozenRun, steps int) {
	t.Helper()
	e := got.e
	reduced := int64(0) // gradient collectives per trainable chunk and rank
	if s.stage >= 2 || s.n > 1 {
		reduced = int64(steps)
	}
	for _, r := range e.ranks {
		for c, frozen := range freezeChunks {
			if want := map[bool]int64{true: 0, false: reduced}[frozen]; r.reductions[c] != want {
				t.Errorf("rank %d chunk %d (frozen %v): %d gradient collectives, want %d", r.idx, c, frozen, r.reductions[c], want)
			}
		}
		for c, b := range r.st.grad {
			if b != nil && freezeChunks[c] {
				t.Errorf("rank %d: frozen chunk %d has a gradient buffer", r.idx, c)
			}
		}
	}
	var moved, refMoved int64
	for i := range got.stats {
		moved, refMoved = moved+got.stats[i].Moved.Collective, refMoved+ref.stats[i].Moved.Collective
	}
	if s.n > 1 && !(moved < refMoved) {
		t.Errorf("collectives moved %d bytes, the reference %d: freezing saved nothing", moved, refMoved)
	}
	sum, rsum := e.Summary(), ref.e.Summary()
	checkFrozenSummary(t, e, sum)
	for i, d := range sum.PerDevice {
		if d.ModelStatePeakBytes != d.EstimateBytes+d.TierSlotBytes {
			t.Errorf("%s: model-state peak %d, estimate %d + tier-store param slots %d", d.Device, d.ModelStatePeakBytes, d.EstimateBytes, d.TierSlotBytes)
		}
		saved := rsum.PerDevice[i].ModelStatePeakBytes - d.ModelStatePeakBytes
		if want := sum.FrozenSavedTierBytes(shard.HBM) / int64(s.n); saved != want {
			t.Errorf("%s: the reference holds %d bytes more model state, the summary says freezing saves %d per device", d.Device, saved, want)
		}
	}
	if e.tiers == nil {
		return
	}
	if sum.HostBytes != sum.HostFormula {
		t.Errorf("host model state %d, estimate %d", sum.HostBytes, sum.HostFormula)
	}
	homes := sum.Tier.HostHomeBytes + sum.Tier.NVMeHomeBytes
	refHomes := rsum.Tier.HostHomeBytes + rsum.Tier.NVMeHomeBytes
	if want := sum.FrozenSavedTierBytes(shard.Host) + sum.FrozenSavedTierBytes(shard.NVMe); refHomes-homes != want {
		t.Errorf("tier-store homes %d, the reference's %d: %d less, the summary says %d", homes, refHomes, refHomes-homes, want)
	}
	if sum.Tier.NVMeHomeBytes != sum.Tier.EstimateNVMeBytes {
		t.Errorf("NVMe homes %d, estimate %d", sum.Tier.NVMeHomeBytes, sum.Tier.EstimateNVMeBytes)
	}
	for k := range e.tiers.specs {
		if freezeChunks[k.Chunk] && k.State != shard.Param {
			t.Errorf("the tier store holds %s of a frozen chunk", k)
		}
	}
	for r, bs := range e.tiers.upload {
		for c, b := range bs {
			if b != nil && freezeChunks[c] {
				t.Errorf("rank %d: upload staging for frozen chunk %d", r, c)
			}
		}
	}
	var trainedNVMe int64
	for c, frozen := range freezeChunks {
		for st := range shard.StateCount {
			rd, wr := e.tiers.nvmeRead[c][st].Load(), e.tiers.nvmeWritten[c][st].Load()
			switch {
			case !frozen:
				trainedNVMe += rd + wr
			case wr != 0 || rd != 0 && shard.State(st) != shard.Param:
				t.Errorf("frozen chunk %d %s: %d bytes read from NVMe, %d written", c, shard.State(st), rd, wr)
			}
		}
	}
	if s.opt == "nvme" && trainedNVMe == 0 {
		t.Errorf("no NVMe traffic counted for the trainable chunks: the counters count nothing")
	}
}

// checkFrozenSummary: the summary names the frozen chunks and their
// parameters, and its savings are the frozen chunks' gradient and
// optimizer-state bytes computed here from the chunk lengths alone.
func checkFrozenSummary(t *testing.T, e *Engine, sum report.Summary) {
	t.Helper()
	var params, optB, gradB int64
	n := int64(e.n)
	for c, frozen := range freezeChunks {
		if !frozen {
			continue
		}
		p := e.chunks[c]
		params += int64(p.len)
		S, full := int64(p.shard), n*int64(p.shard)
		opt := S // each rank's master, m and v
		if e.stage == 0 {
			opt = full
		}
		mo := e.estimate.Options // the master and moments as stored: the remainder master by default on NVMe
		optB += n * (mo.StateDType(shard.Master).Bytes(int(opt)) + 2*mo.StateDType(shard.AdamM).Bytes(int(opt)))
		switch {
		case e.stage < 2:
			gradB += n * 2 * full // full gradient on every device
		case !e.gradTiered:
			gradB += n * 2 * S // the device's reduced shard
		}
		if e.offload {
			gradB += n * 2 * S // its host copy
		}
	}
	if sum.FrozenParams != params || sum.FrozenOptimizerSavedBytes() != optB || sum.FrozenGradSavedBytes() != gradB {
		t.Errorf("summary: frozen params %d, optimizer state saved %d, gradients saved %d; from the layout %d, %d, %d",
			sum.FrozenParams, sum.FrozenOptimizerSavedBytes(), sum.FrozenGradSavedBytes(), params, optB, gradB)
	}
	if want := []string{"embeddings", "block 1", "block 4", "ln_f"}; !slices.Equal(sum.FrozenChunks, want) {
		t.Errorf("summary: frozen chunks %q, want %q", sum.FrozenChunks, want)
	}
	if sum.FrozenDescribed != "embeddings, block 1, block 4, ln_f" {
		t.Errorf("summary: frozen chunks described as %q", sum.FrozenDescribed)
	}
}

// TestFreezeNorm: the global gradient norm is the trainable chunks' only.
// With clipping on, the first step of a frozen run (same params as the
// reference's) reports the norm of the reference's per-chunk sums of
// squares over the trainable chunks, added in the engine's order (chunk
// by chunk, ranks in order; stage 0: rank 0), so to the bit; the reference
// (every chunk trains) reports a larger one. The clip coefficient follows
// the trainable norm.
func TestFreezeNorm(t *testing.T) {
	for _, s := range []runSpec{{stage: 0, n: 2, micro: 1, accum: 1, clip: 0.05}, {stage: 3, n: 2, offload: true, micro: 1, accum: 1, clip: 0.05}} {
		t.Run(s.String(), func(t *testing.T) {
			js := strings.Replace(s.configJSON(), testShapeJSON, deepShapeJSON, 1)
			ref := newEngineJSON(t, js, s.n)
			rst, err := ref.Step()
			if err != nil {
				t.Fatal(err)
			}
			var sq float64
			for c, frozen := range freezeChunks {
				for _, r := range ref.ranks {
					if !frozen && (s.stage > 0 || r.idx == 0) {
						sq += r.normSq(c)
					}
				}
			}
			got := newEngineJSON(t, withFreeze(js, freezePatterns), s.n)
			st, err := got.Step()
			if err != nil {
				t.Fatal(err)
			}
			if st.GradNorm != math.Sqrt(sq) || !(st.GradNorm < rst.GradNorm) {
				t.Errorf("norm %v; the trainable chunks' %v, every chunk's %v", st.GradNorm, math.Sqrt(sq), rst.GradNorm)
			}
			if want := s.clip / (st.GradNorm + 1e-6); st.ClipCoef != want {
				t.Errorf("clip coefficient %v, want %v", st.ClipCoef, want)
			}
		})
	}
}

// TestFreezeScratchBudget: the frozen chunks' gradient scratch (the
// largest frozen chunk, one per device) is allocated at New and counted in
// the device budget: a device of exactly what New took trains, one byte
// less is refused at New. (Stage 0 on one device needs no workspace, so a
// scratch taken in the step would not fit the exact budget.)
func TestFreezeScratchBudget(t *testing.T) {
	js := withFreeze(strings.Replace(runSpec{stage: 0, n: 1, micro: 1, accum: 1}.configJSON(), testShapeJSON, deepShapeJSON, 1), freezePatterns)
	engineOn := func(hbm int64) (*Engine, error) {
		devs, comms, err := cpu.New(cpu.Options{Devices: 1, HBMBytes: hbm})
		if err != nil {
			t.Fatal(err)
		}
		return startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens)})
	}
	e, err := engineOn(256 << 20)
	if err != nil {
		t.Fatal(err)
	}
	r := e.ranks[0]
	if got, want := r.frozenGrad.Len(), e.layout.Chunks[0].Len; got != want {
		t.Fatalf("scratch of %d elements, want the largest frozen chunk's %d", got, want)
	}
	ms := r.dev.MemStats()
	if ws := ms.PeakByKind[gpu.Workspace]; ws < r.frozenGrad.Bytes() {
		t.Fatalf("workspace %d bytes, less than the scratch's %d", ws, r.frozenGrad.Bytes())
	}
	exact, err := engineOn(ms.InUseBytes)
	if err != nil {
		t.Fatalf("a device of %d bytes, what New took: %v", ms.InUseBytes, err)
	}
	trainFor(t, exact, 2)
	if _, err := engineOn(ms.InUseBytes - 1); err == nil {
		t.Errorf("a device of %d bytes, one less than New takes, was accepted", ms.InUseBytes-1)
	}
}

// TestFreezeCheckpoint: a frozen run resumes bit-identically from its
// checkpoints (every stage's layout, device and host optimizer, NVMe,
// fp32); its checkpoint holds, for a frozen chunk, the params, as master
// the params widened and zero m and v.
func TestFreezeCheckpoint(t *testing.T) {
	const k = 3
	specs := []freezeSpec{
		{stage: 0, n: 1, opt: "none", param: "none"},
		{stage: 1, n: 2, opt: "none", param: "none"},
		{stage: 2, n: 2, opt: "cpu", param: "none"},
		{stage: 3, n: 2, opt: "cpu", param: "none"},
		{stage: 3, n: 2, opt: "nvme", param: "nvme"},
		// past the warm-up: the restore rebuilds the upload dpu owes, of the trainable chunks only
		{stage: 2, n: 2, opt: "cpu", param: "none", extra: `"overlap": "dpu", "dpu_warmup_steps": 1`},
	}
	for _, s := range specs {
		t.Run(s.String(), func(t *testing.T) {
			js := withFreeze(s.configJSON(t), freezePatterns)
			checkResume(t, func(t *testing.T) *Engine { return newEngineJSON(t, js, s.n) }, k)
			checkFrozenCheckpoint(t, stateOf(t, newEngineJSON(t, js, s.n)))
		})
	}
	t.Run("fp32", func(t *testing.T) {
		s := runSpec{stage: 2, n: 2, offload: true, micro: 1, accum: 1, fp32: true}
		plain := strings.Replace(s.configJSON(), testShapeJSON, deepShapeJSON, 1)
		js := withFreeze(plain, freezePatterns)
		newFP32 := func(t *testing.T) *Engine {
			devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
			if err != nil {
				t.Fatal(err)
			}
			e, err := startEngine(t, testConfig(t, js), cpu.Devices(devs), comms, Options{Corpus: model.Tokens(testTokens), Precision: gpu.F32})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
		checkResume(t, newFP32, k)
		// fp32 counts 4-byte gradients and no device master: the
		// reference holds exactly what the summary says is not kept.
		e := newFP32(t)
		trainFor(t, e, 1)
		js = plain
		ref := newFP32(t)
		trainFor(t, ref, 1)
		sum, rsum := e.Summary(), ref.Summary()
		for i, d := range sum.PerDevice {
			saved := rsum.PerDevice[i].ModelStatePeakBytes - d.ModelStatePeakBytes
			if d.ModelStatePeakBytes != d.EstimateBytes || saved != sum.FrozenSavedTierBytes(shard.HBM)/2 || saved == 0 {
				t.Errorf("%s: peak %d, estimate %d; the reference holds %d more, the summary says %d", d.Device, d.ModelStatePeakBytes, d.EstimateBytes, saved, sum.FrozenSavedTierBytes(shard.HBM)/2)
			}
		}
		if saved := rsum.HostBytes - sum.HostBytes; saved != sum.FrozenSavedTierBytes(shard.Host) || sum.HostBytes != sum.HostFormula {
			t.Errorf("host %d (estimate %d), the reference's %d: the summary says %d not kept", sum.HostBytes, sum.HostFormula, rsum.HostBytes, sum.FrozenSavedTierBytes(shard.Host))
		}
	})
}

// checkFrozenCheckpoint: a frozen chunk's master is its params widened,
// its m and v are zero; a trainable chunk's master is not its params (the
// check would pass on anything else).
func checkFrozenCheckpoint(t *testing.T, st *checkpoint.State) {
	t.Helper()
	kp, km := st.StateIndex(shard.Param), st.StateIndex(shard.Master)
	for c, frozen := range freezeChunks {
		params := decode(st.Gather(c, kp), gpu.BF16)
		master := decode(st.Gather(c, km), gpu.F32)
		if same := sameBits(params, master) == 0; same != frozen {
			t.Errorf("chunk %d (frozen %v): master equal to the widened params: %v", c, frozen, same)
		}
		for _, s := range []shard.State{shard.AdamM, shard.AdamV} {
			zero := !slices.ContainsFunc(st.Gather(c, st.StateIndex(s)), func(b byte) bool { return b != 0 })
			if frozen && !zero {
				t.Errorf("frozen chunk %d: %s is not zero", c, s)
			}
		}
	}
}

// TestFreezeRestoreAnotherSet: a checkpoint saved with one freeze set,
// restored with another. A chunk that trained in the checkpoint and is
// frozen now is handled: it keeps the checkpoint's params and drops its
// optimizer state, and the run goes on bit-identical (trainable chunks and
// losses) to the saving run continued with learning rate 0 for those
// chunks. A chunk frozen in the checkpoint that trains now is refused
// (by LoadCheckpoint and RestoreState), naming the chunks, and nothing is
// restored.
func TestFreezeRestoreAnotherSet(t *testing.T) {
	const k = 3
	for _, s := range []freezeSpec{{stage: 1, n: 2, opt: "none", param: "none"}, {stage: 3, n: 2, opt: "cpu", param: "none"}} {
		t.Run(s.String(), func(t *testing.T) {
			js := s.configJSON(t)
			dir := t.TempDir()
			a := newEngineJSON(t, js, s.n)
			trainFor(t, a, k)
			if _, err := a.SaveCheckpoint(dir, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			saved, _ := a.Params()
			a.zeroLR = freezeChunks
			lossA := trainFor(t, a, k)
			pa, _ := a.Params()

			b := newEngineJSON(t, withFreeze(js, freezePatterns), s.n)
			if err := b.LoadCheckpoint(dir); err != nil {
				t.Fatalf("a checkpoint where every chunk trained, into a frozen run: %v", err)
			}
			lossB := trainFor(t, b, k)
			pb, _ := b.Params()
			if !slices.Equal(lossA, lossB) {
				t.Errorf("losses after the restore %v, the saving run's at lr 0 %v", lossB, lossA)
			}
			for c, frozen := range freezeChunks {
				want := pa[c]
				if frozen {
					want = saved[c]
				}
				if m := sameBits(pb[c], want); m != 0 {
					t.Errorf("chunk %d (frozen %v): %d params differ", c, frozen, m)
				}
			}

			// The frozen run's checkpoint, into a run where every chunk trains.
			fdir := t.TempDir()
			if _, err := b.SaveCheckpoint(fdir, checkpoint.Options{}); err != nil {
				t.Fatal(err)
			}
			c := newEngineJSON(t, js, s.n)
			before := stateOf(t, c)
			want := `chunk "embeddings", "block 1", "block 4", "ln_f" was frozen in the checkpoint`
			if err := c.LoadCheckpoint(fdir); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("LoadCheckpoint: %v, want an error containing %q", err, want)
			}
			if err := c.RestoreState(stateOf(t, b)); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("RestoreState: %v, want an error containing %q", err, want)
			}
			sameState(t, "after the refused restores", before, stateOf(t, c))
		})
	}
}
