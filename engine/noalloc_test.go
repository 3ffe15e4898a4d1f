package engine

import (
	"fmt"
	"strings"
	"testing"

	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// noAllocSteps is how long each run of the tests below trains: step 1
// takes what the rings have not (the backends' scratch), steps 2-4 must
// take nothing. Four steps also cover the host optimizer's update of step
// 1 running under step 2 (exact overlap), the first uploads and their
// AllGathers.
const noAllocSteps = 4

// checkNoAllocs checks the summary's driver counters of e after its steps:
// something was allocated (the counters count), nothing after step 1; the
// workspace rings; the pinned pools' registration (every one ok with the
// tier store, for the host optimizer or cpu_checkpointing, none without). It returns the bytes each device copied
// from and to pageable host memory after step 1 (after1: the link
// counters then).
func checkNoAllocs(t *testing.T, e *Engine, after1 []gpu.LinkCounters) (up, down []int64) {
	t.Helper()
	sum := e.Summary()
	for i, d := range sum.PerDevice {
		if d.Driver.Allocs == 0 {
			t.Errorf("%s: no driver allocation counted at all", d.Device)
		}
		if d.DeviceAllocsAfterStep1 != 0 {
			t.Errorf("%s: %d device allocations and frees after step 1 (in all %+v)", d.Device, d.DeviceAllocsAfterStep1, d.Driver)
		}
		if d.WorkspaceRingBytes > d.WorkspacePeakBytes || e.stage >= 2 && d.WorkspaceRingBytes == 0 {
			t.Errorf("%s: workspace rings %d B, workspace peak %d B", d.Device, d.WorkspaceRingBytes, d.WorkspacePeakBytes)
		}
		now := e.ranks[i].dev.Counters()
		up = append(up, now.HostToDevicePageable-after1[i].HostToDevicePageable)
		down = append(down, now.DeviceToHostPageable-after1[i].DeviceToHostPageable)
	}
	for _, h := range sum.HostRegistration {
		if h.Outcome != report.RegistrationOK || h.RegisteredBytes != h.Bytes || h.Bytes == 0 {
			t.Errorf("registration %+v", h)
		}
	}
	if (e.tiers != nil) != (len(sum.HostRegistration) == 2) {
		t.Errorf("tier store %v, registrations %+v", e.tiers != nil, sum.HostRegistration)
	}
	return up, down
}

// checkPageable checks that a run with the host optimizer copied, after
// step 1, no more pageable bytes than the model's own (its token ids up,
// its losses down: base, a run with the optimizer on the device, less the
// gradient norms it downloads to Go memory): the new params it uploads,
// the gradients and norms it downloads, all come from registered pinned
// memory.
func checkPageable(t *testing.T, e *Engine, up, down, baseUp, baseDown []int64) {
	t.Helper()
	norms := int64(8*len(e.chunks)) * (noAllocSteps - 1)
	for i := range up {
		if up[i] != baseUp[i] || down[i] != baseDown[i]-norms {
			t.Errorf("%s: pageable copies after step 1: %d B up, %d B down; the model's own: %d B up, %d B down",
				e.ranks[i].dev.Name(), up[i], down[i], baseUp[i], baseDown[i]-norms)
		}
		moved := e.ranks[i].dev.Counters()
		if moved.HostToDevice-moved.HostToDevicePageable == 0 || moved.DeviceToHost-moved.DeviceToHostPageable == 0 {
			t.Errorf("%s: no copy of registered memory (%+v)", e.ranks[i].dev.Name(), moved)
		}
	}
}

// trainCounting runs e for noAllocSteps steps and returns each device's
// link counters after step 1.
func trainCounting(t *testing.T, e *Engine) []gpu.LinkCounters {
	t.Helper()
	if _, err := e.Step(); err != nil {
		t.Fatal(err)
	}
	if d := e.Summary().PerDevice[0]; d.DeviceAllocsAfterStep1 != 0 {
		t.Fatalf("%d allocations after step 1 counted at step 1", d.DeviceAllocsAfterStep1)
	}
	after1 := e.counters()
	trainFor(t, e, noAllocSteps-1)
	return after1
}

// TestNoDeviceAllocsAfterStep1: after the first step no device memory is
// allocated or freed (gpu.DriverCounters, the summary's
// DeviceAllocsAfterStep1): stages 0-3, N = 1, 2, 4, the optimizer on the
// device or the host, one or two micro-batches. Gathered chunks, gradient
// buckets and reduce shards come from the rings New takes, the
// collectives' scratch from what New reserved.
func TestNoDeviceAllocsAfterStep1(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		for stage := range 4 {
			for _, accum := range []int{1, 2} {
				if accum == 2 && stage < 2 {
					continue
				}
				var baseUp, baseDown []int64
				for _, offload := range []bool{false, true} {
					if offload && stage == 0 {
						continue
					}
					s := runSpec{stage: stage, n: n, offload: offload, micro: 1, accum: accum, clip: 1}
					t.Run(s.String(), func(t *testing.T) {
						e := newCountingEngine(t, s, s.configJSON())
						up, down := checkNoAllocs(t, e, trainCounting(t, e))
						if !offload {
							baseUp, baseDown = up, down
						} else if baseUp != nil {
							checkPageable(t, e, up, down, baseUp, baseDown)
						}
					})
				}
			}
		}
	}
}

// TestNoDeviceAllocsWideChunks: with the host optimizer at stages 1-2
// the first AllGather of updated params comes in step 2 (the update of
// step 1 runs under it), larger, on 4 ranks of a chunk of 4352 params a
// rank, than any collective of step 1: the scratch New reserved for it
// holds it.
func TestNoDeviceAllocsWideChunks(t *testing.T) {
	const wide = `{"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 256, "max_seq_len": 16}`
	for _, stage := range []int{1, 2} {
		s := runSpec{stage: stage, n: 4, offload: true, micro: 1, accum: 1, clip: 1}
		t.Run(s.String(), func(t *testing.T) {
			e := newCountingEngine(t, s, strings.Replace(s.configJSON(), testShapeJSON, wide, 1))
			if sh := e.chunks[0].shard; sh <= 4096 {
				t.Fatalf("embedding shard of %d elements: the ReduceScatters of step 1 take as much scratch as its AllGather", sh)
			}
			checkNoAllocs(t, e, trainCounting(t, e))
		})
	}
}

// newCountingEngine is an engine for spec s on config js, on CPU devices
// whose host registrar it is given.
func newCountingEngine(t *testing.T, s runSpec, js string) *Engine {
	t.Helper()
	cdevs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Corpus: model.Tokens(testTokens), OptimizerThreads: 2, HostRegistrar: cdevs[0].HostRegistrar()}
	e, err := startEngine(t, testConfig(t, js), cpu.Devices(cdevs), comms, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestTierNoDeviceAllocsAfterStep1: as TestNoDeviceAllocsAfterStep1 with
// the tier store (stage 3; params and optimizer state on the host, on
// NVMe, mixed), with the default HBM share (every param shard fits) and a
// squeezed one that evicts param copies every step: the copies move in
// and out of the store's HBM slots (two shard sizes here: the embeddings'
// and the blocks'), the gradient shards bound for the store through their
// ring.
func TestTierNoDeviceAllocsAfterStep1(t *testing.T) {
	nvmetest.Require(t)
	for _, n := range []int{1, 2, 4} {
		// The model's own pageable copies: stage 3 with the optimizer on
		// the device.
		e := newTierEngine(t, tierSpec{n: n, param: "none", opt: "none", shapeJSON: deepShapeJSON}, Options{})
		baseUp, baseDown := checkNoAllocs(t, e, trainCounting(t, e))
		for _, where := range [][2]string{{"cpu", "cpu"}, {"nvme", "nvme"}, {"none", "nvme"}, {"cpu", "nvme"}} {
			for _, squeeze := range []bool{false, true} {
				if squeeze && where[0] == "none" {
					continue
				}
				s := tierSpec{n: n, param: where[0], opt: where[1], shapeJSON: deepShapeJSON, registrar: true}
				t.Run(fmt.Sprintf("%v/squeeze%v", s, squeeze), func(t *testing.T) {
					opts := Options{}
					if squeeze {
						// Two of the largest param shard (the embeddings',
						// 4352 params; the store's minimum).
						opts.TierHBMBytes = 2 * ioBytes(int64(4352/n)*2)
					}
					e := newTierEngine(t, s, opts)
					up, down := checkNoAllocs(t, e, trainCounting(t, e))
					checkPageable(t, e, up, down, baseUp, baseDown)
					var shards int64 // one rank's param shards in the store
					for c, p := range e.chunks {
						if e.paramTiered(c) {
							shards += int64(p.shard) * 2
						}
					}
					for _, d := range e.Summary().PerDevice {
						if where[0] != "none" && (d.TierSlotBytes < min(shards, e.tiers.hbmBudget) || d.TierHBMBytes > e.tiers.hbmBudget) {
							t.Errorf("%s: tier slots %d B, copies peak %d B, budget %d B", d.Device, d.TierSlotBytes, d.TierHBMBytes, e.tiers.hbmBudget)
						}
					}
					if squeeze && e.tiers.hbmBudget >= shards {
						t.Fatalf("the hbm share %d B holds every param shard (%d B): nothing is evicted", e.tiers.hbmBudget, shards)
					}
				})
			}
		}
	}
}

// TestTierNoDeviceAllocsCheckpointing: as TestTierNoDeviceAllocsAfterStep1
// with activation checkpointing and cpu_checkpointing (every block, or
// one): the saved inputs go to their host homes in the tier store and
// come back every step into the store's HBM slots, beside the param
// copies (params on the device, on the host, on NVMe, with the default
// HBM share and a squeezed one), and after step 1 no device memory is
// allocated or freed. The inputs' slots are on every device, tagged as
// activations, and the inputs moved up after step 1.
func TestTierNoDeviceAllocsCheckpointing(t *testing.T) {
	nvmetest.Require(t)
	for _, n := range []int{1, 2} {
		base := newTierEngine(t, tierSpec{n: n, param: "none", opt: "none", shapeJSON: deepShapeJSON}, Options{})
		baseUp, baseDown := checkNoAllocs(t, base, trainCounting(t, base))
		for _, ck := range []string{`{"cpu_checkpointing": true}`, `{"number_checkpoints": 1, "cpu_checkpointing": true}`} {
			for _, where := range [][2]string{{"none", "none"}, {"none", "cpu"}, {"cpu", "cpu"}, {"nvme", "nvme"}} {
				for _, squeeze := range []bool{false, true} {
					if squeeze && where[0] == "none" {
						continue
					}
					s := tierSpec{n: n, param: where[0], opt: where[1], shapeJSON: deepShapeJSON, registrar: true, ckpt: ck}
					t.Run(fmt.Sprintf("%v/ckpt%s/squeeze%v", s, ck, squeeze), func(t *testing.T) {
						opts := Options{}
						if squeeze {
							opts.TierHBMBytes = 2 * ioBytes(int64(4352/n)*2) // two of the largest param shard
						}
						e := newTierEngine(t, s, opts)
						up, down := checkNoAllocs(t, e, trainCounting(t, e))
						checkPageable(t, e, up, down, baseUp, baseDown)
						for _, r := range e.ranks {
							ms := r.dev.MemStats()
							if ms.InUseByPurpose[tier.InputSlotPurpose] == 0 {
								t.Errorf("%s: no HBM slots for the saved inputs (%s)", r.dev.Name(), ms)
							}
						}
						// Every step, every rank brought each saved input back.
						var blocks int64
						for l := range e.layout.Shape.Layers {
							if e.act.Checkpointed(l, e.layout.Shape.Layers) {
								blocks++
							}
						}
						in := model.InputBytes(e.layout.Shape, e.micro, e.seq, e.act)
						if up, want := e.Summary().Tier.LinkBytes[shard.HostToHBM], noAllocSteps*int64(n)*blocks*in; up < want {
							t.Errorf("moved %d B up in %d steps, want at least %d (the saved inputs)", up, noAllocSteps, want)
						}
					})
				}
			}
		}
	}
}
