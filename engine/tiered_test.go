package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/gpu/cpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
)

// tierSpec is a stage-3 run with the tier store: where the params and the
// optimizer state live (none, cpu, nvme), the host budget, the devices'
// memory.
type tierSpec struct {
	n           int
	param, opt  string
	hostBudget  int64
	hbmBytes    int64
	shapeJSON   string
	persistence int64
	seq         int    // 0 = testSeq
	ckpt        string // an activation_checkpointing block; "" for none
	// wrap, when set, stands in for the devices the engine is given (a
	// fault injector over them).
	wrap func([]gpu.Device) []gpu.Device
	// registrar registers the pinned pools with the CPU backend's
	// devices (Options.HostRegistrar).
	registrar bool
	// strata is more keys of the strata block (`"overlap": "dpu", `).
	strata string
	stage  int // ZeRO stage; 0 = 3
}

func (s tierSpec) String() string {
	return fmt.Sprintf("N%d/param-%s/opt-%s", s.n, s.param, s.opt)
}

func (s tierSpec) configJSON(dir string) string {
	shape := s.shapeJSON
	if shape == "" {
		shape = testShapeJSON
	}
	path := ""
	if dir != "" {
		path = fmt.Sprintf(`, "nvme_path": %q`, dir)
	}
	persist := s.persistence
	if persist == 0 {
		persist = 1000
	}
	seq := s.seq
	if seq == 0 {
		seq = testSeq
	}
	stage := s.stage
	if stage == 0 {
		stage = 3
	}
	return fmt.Sprintf(`{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 5, "warmup_type": "linear", "total_num_steps": 40}},
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": %d, "stage3_param_persistence_threshold": %d,
    "offload_param": {"device": %q%s}, "offload_optimizer": {"device": %q%s}},
  "aio": {"block_size": 65536, "queue_depth": 8, "intra_op_parallelism": 2},%s
  "strata": {%s"model": %s, "devices": %d, "seq_len": %d, "seed": %d, "host_budget": %d}
}`, stage, persist, s.param, path, s.opt, path, runSpec{ckpt: s.ckpt}.ckptJSON(), s.strata, shape, s.n, seq, testSeed, s.hostBudget)
}

func newTierEngine(t testing.TB, s tierSpec, opts Options) *Engine {
	t.Helper()
	dir := ""
	if s.param == "nvme" || s.opt == "nvme" {
		dir = nvmetest.Dir(t)
	}
	cfg := testConfig(t, s.configJSON(dir))
	hbm := s.hbmBytes
	if hbm == 0 {
		hbm = 256 << 20
	}
	devs, comms, err := cpu.New(cpu.Options{Devices: s.n, HBMBytes: hbm})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Corpus == nil {
		opts.Corpus = model.Tokens(testTokens)
	}
	if opts.OptimizerThreads == 0 {
		opts.OptimizerThreads = 2
	}
	if s.registrar {
		opts.HostRegistrar = devs[0].HostRegistrar()
	}
	gdevs := cpu.Devices(devs)
	if s.wrap != nil {
		gdevs = s.wrap(gdevs)
	}
	e, err := startEngine(t, cfg, gdevs, comms, opts)
	if err != nil {
		t.Fatalf("%v: %v", s, err)
	}
	return e
}

// deepShapeJSON has more chunks (8) than the host staging room holds, so
// state homed on NVMe moves every step.
const deepShapeJSON = `{"n_layer": 6, "n_embd": 16, "n_head": 2, "vocab_size": 256, "max_seq_len": 16}`

type tierRun struct {
	params, master [][]float32
	losses         []float64
	stats          []report.StepStats
}

func runTier(t *testing.T, s tierSpec, opts Options, steps int) (tierRun, *Engine) {
	t.Helper()
	e := newTierEngine(t, s, opts)
	var res tierRun
	if err := e.Run(t.Context(), steps, func(st report.StepStats) error {
		res.losses = append(res.losses, st.Loss)
		res.stats = append(res.stats, st)
		return nil
	}); err != nil {
		t.Fatalf("%v: %v", s, err)
	}
	var err error
	if res.params, err = e.Params(); err != nil {
		t.Fatal(err)
	}
	if res.master, err = e.Master(); err != nil {
		t.Fatal(err)
	}
	return res, e
}

// TestTierEquivalence: stage 3 on N = 1, 2, 4 with params and optimizer
// state on NVMe (and on the host, and mixed) ends 20 steps with params
// and master weights bit-identical to the same run with nothing offloaded,
// and the same losses; with params on NVMe also when the tier's HBM share
// holds only two param shards, where no evicted HBM copy is written back
// through host (its host copy went to NVMe behind the upload; fp32
// master). Why it holds: the optimizer runs the same cpuadam
// kernel on the same bytes (the device optimizer calls it too), and every
// shard moves between tiers as bytes, unchanged.
func TestTierEquivalence(t *testing.T) {
	nvmetest.Require(t)
	for _, n := range []int{1, 2, 4} {
		base, _ := runTier(t, tierSpec{n: n, param: "none", opt: "none", shapeJSON: deepShapeJSON}, Options{}, testSteps)
		for _, where := range [][3]string{{"nvme", "nvme"}, {"cpu", "cpu"}, {"none", "nvme"}, {"cpu", "nvme"}, {"nvme", "nvme", "squeeze"}, {"nvme", "nvme", "squeeze-remainder"}} {
			s := tierSpec{n: n, param: where[0], opt: where[1], shapeJSON: deepShapeJSON}
			var opts Options
			name := s.String()
			if where[2] != "" {
				// The tier's HBM share holds two of the largest param
				// shard (the embeddings'): every new param's HBM copy is
				// evicted before the next update writes it, so its host
				// copy is written behind to NVMe, not dropped
				// (prefetch/testdata/writeback_overflow.txt).
				opts.TierHBMBytes = 2 * ioBytes(int64(4352/n)*2)
				name += "/" + where[2]
				// "squeeze" with the fp32 master; "squeeze-remainder"
				// with the default, the remainder, whose update reads
				// the old params, from HBM when that copy is the nearest.
				if where[2] == "squeeze" {
					s.strata = `"optimizer_state": {"master": "fp32"}, `
				}
			}
			t.Run(name, func(t *testing.T) {
				got, e := runTier(t, s, opts, testSteps)
				if _, rem := e.masters.(remMaster); rem != (s.opt == "nvme" && where[2] != "squeeze") {
					t.Errorf("remainder master %v with the optimizer on %s (%s): the default is the remainder on NVMe only", rem, s.opt, where[2])
				}
				if where[2] != "" {
					var shards int64 // one rank's param shards in the store
					for c, p := range e.chunks {
						if e.paramTiered(c) {
							shards += int64(p.shard) * 2
						}
					}
					if e.tiers.hbmBudget >= shards {
						t.Fatalf("the hbm share %d B holds every param shard (%d B): nothing is evicted", e.tiers.hbmBudget, shards)
					}
				}
				var moved [4]int64
				for _, st := range got.stats {
					if st.Tier == nil {
						t.Fatal("no tier stats")
					}
					for l, b := range st.Tier.LinkBytes {
						moved[l] += b
					}
				}
				t.Logf("step %d: %+v", testSteps, *got.stats[testSteps-1].Tier)
				// The shards went where the config says: NVMe both ways
				// every step when anything lives there.
				if e.tiers.swap != nil && (moved[0] < testSteps || moved[3] < testSteps) {
					t.Errorf("nvme moved %d B in, %d B out in %d steps", moved[0], moved[3], testSteps)
				}
				if where[2] == "squeeze" && moved[shard.HBMToHost] != 0 {
					// Nothing writes a param in HBM: a write-back from
					// there is a new param whose host copy was dropped.
					t.Errorf("hbm->host moved %d B: an evicted HBM copy was written back through host", moved[shard.HBMToHost])
				}
				if s.param != "none" && moved[1] < testSteps {
					t.Errorf("host->hbm moved %d B in %d steps", moved[1], testSteps)
				}
				if m, d := diff(got.params, base.params); m != 0 {
					t.Errorf("params: %d differ from the run with nothing offloaded (max %g)", m, d)
				}
				if m, d := diff(got.master, base.master); m != 0 {
					t.Errorf("master: %d differ (max %g)", m, d)
				}
				for i := range got.losses {
					if got.losses[i] != base.losses[i] {
						t.Errorf("step %d loss %v, want %v", i+1, got.losses[i], base.losses[i])
						break
					}
				}
			})
		}
	}
}

// TestTierBudgets: a model whose model state (16Ψ) is more than ten times
// each device's memory trains with params and optimizer state on NVMe,
// and no tier's measured peak exceeds its budget: each device's (the
// backend's own peak), the tier store's HBM share, its host budget and the
// pinned pool (strata.host_budget), the swap.
func TestTierBudgets(t *testing.T) {
	nvmetest.Require(t)
	const shape = `{"n_layer": 24, "n_embd": 128, "n_head": 4, "vocab_size": 256, "max_seq_len": 8}`
	s := tierSpec{n: 4, param: "nvme", opt: "nvme", shapeJSON: shape, seq: 8, hostBudget: 24 << 20, hbmBytes: 7 << 20}
	res, e := runTier(t, s, Options{}, 3)
	state := 16 * e.layout.ParamCount()
	if state < 10*s.hbmBytes {
		t.Fatalf("model state %d B is not ten times the device budget %d B", state, s.hbmBytes)
	}
	for _, r := range e.ranks {
		if ms := r.dev.MemStats(); ms.PeakBytes > s.hbmBytes {
			t.Errorf("%s: peak %d B over its %d B", r.dev.Name(), ms.PeakBytes, s.hbmBytes)
		}
	}
	for _, st := range res.stats {
		ts := st.Tier
		for tr := range ts.PeakBytes {
			if ts.PeakBytes[tr] > ts.BudgetBytes[tr] {
				t.Errorf("step %d: %s peak %d B over its budget %d B", st.Step, shard.Tier(tr), ts.PeakBytes[tr], ts.BudgetBytes[tr])
			}
		}
	}
	if ps := e.tiers.pool.Stats(); ps.PeakBytes > s.hostBudget {
		t.Errorf("pinned pool peak %d B over host_budget %d B", ps.PeakBytes, s.hostBudget)
	}
	sum := e.Summary()
	t.Logf("model state %s = %.1f x the device budget; %+v", fmtB(state), float64(state)/float64(s.hbmBytes), sum.Tier)
	// The homes the engine measured are the estimate's, state by state.
	if sum.Tier.HostHomeBytes != sum.Tier.EstimateHostBytes || sum.Tier.NVMeHomeBytes != sum.Tier.EstimateNVMeBytes {
		t.Errorf("homes: host %d nvme %d, estimate host %d nvme %d", sum.Tier.HostHomeBytes, sum.Tier.NVMeHomeBytes, sum.Tier.EstimateHostBytes, sum.Tier.EstimateNVMeBytes)
	}
}

// TestTierHitRate: from the second step on the planners serve the engine's
// accesses from planned transfers. What is asserted does not depend on the
// clock:
//   - every step from the second has the same accesses, each counted once
//     as a hit, late or miss, and from the third each rank's trace repeats
//     (no divergence: the second differs from the first, which has no
//     pending update in its forward to lease);
//   - every step's new param shards are staged host->HBM (counted over the
//     steps: which step's window an upload falls in depends on timing);
//   - the plan is good: each rank's recorded trace, with its real residency
//     and budgets, the configured link bandwidths and every access's compute
//     set to twice the longest transfer of any of its shards (a step bound
//     by compute, as a GPU step is), replayed in the planner's simulated
//     time (prefetch.Plan), gets at least 99 % hits from the second step.
//
// Whether a planned transfer lands before its access in real time (a hit),
// is under way (late) or was not issued yet (a miss) depends on how busy
// this machine is, so the real-time hit rate is only logged. Params and
// optimizer state are homed on NVMe; the host budget holds the optimizer
// state and the param working set, so every step stages each new param
// shard host->HBM between the optimizer that writes it and the next forward
// (prefetch across the step boundary). The slack makes the planner issue
// each transfer as early as the budgets allow. (With the host holding only
// TierReadAhead chunks beyond the homes, every step also reads NVMe, and the
// optimizer phase is bound by the disk: `strata bench step` reports that
// hit rate.)
func TestTierHitRate(t *testing.T) {
	nvmetest.Require(t)
	const shape = `{"n_layer": 6, "n_embd": 64, "n_head": 2, "vocab_size": 256, "max_seq_len": 64}`
	s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: shape, seq: 64, hostBudget: 16 << 20}
	res, e := runTier(t, s, Options{PrefetchSlack: time.Second}, 8)
	var acc, hits, dep, staged int64
	for _, st := range res.stats[1:] {
		ts := st.Tier
		acc += ts.Accesses
		hits += ts.Hits
		dep += ts.Dependent
		t.Logf("step %d: hit rate %.3f (late %d, miss %d, dependent %d), stall hbm %v host %v, moved %v", st.Step, ts.HitRate, ts.Late, ts.Misses, ts.Dependent, ts.Stall[shard.HBM], ts.Stall[shard.Host], ts.LinkBytes)
		staged += ts.LinkBytes[shard.HostToHBM]
		if ts.Accesses == 0 || ts.Hits+ts.Late+ts.Misses+ts.Dependent != ts.Accesses {
			t.Errorf("step %d: %d accesses, %d hits + %d late + %d misses + %d dependent", st.Step, ts.Accesses, ts.Hits, ts.Late, ts.Misses, ts.Dependent)
		}
		// The trace repeats (Divergences, below); the accesses a step
		// counts need not: the optimizer's, declared ahead at the end of a
		// step, count in the step whose cpuadam awaits them.
		if st.Step > 2 && ts.Divergences != 0 {
			t.Errorf("step %d: %d ranks' accesses diverged from their trace", st.Step, ts.Divergences)
		}
		// The resources' figures (strata bench step's bound): the CPU
		// backend counts its compute stream's work, and a link that moved
		// bytes was active, never longer than the window it is counted in
		// (from the last step's end: at most this step and the gap before).
		if st.ComputeBusy <= 0 || st.ComputeBusy > st.Duration+time.Second {
			t.Errorf("step %d: compute busy %v in a step of %v", st.Step, st.ComputeBusy, st.Duration)
		}
		for l, b := range ts.LinkBytes {
			if a := ts.LinkActive[l]; (b > 0) != (a > 0) || a > st.Duration+time.Second {
				t.Errorf("step %d: %s moved %d B and was active %v in a step of %v", st.Step, shard.Link(l), b, a, st.Duration)
			}
		}
	}
	// Every step's optimizer writes every param shard in host memory, so
	// each must be staged host->HBM again before the next forward. Which
	// step's figures an upload lands in depends on timing (one written
	// early in the optimizer phase may go up before the step ends), so the
	// bound is on the sum: at least one full set per step after the
	// second, all ranks.
	paramBytes := e.tiers.homes[shard.Param][shard.NVMe]
	if want := int64(len(res.stats)-2) * paramBytes; paramBytes == 0 || staged < want {
		t.Errorf("steps 2-%d staged %d B host->hbm, want at least %d (%d B of param shards a step)", len(res.stats), staged, want, paramBytes)
	}
	t.Logf("hit rate from step 2 on (real time, not asserted): %d of %d less %d dependent = %.4f", hits, acc, dep, prefetch.HitRate(hits, acc, dep))
	t.Log(e.Summary().Tier)
	for r := range e.ranks {
		checkPlanHitRate(t, e, r, 0.99)
	}
}

// checkPlanHitRate replays rank r's recorded trace in the planner's
// simulated time (see TestTierHitRate) and wants at least min hits from
// the second step.
func checkPlanHitRate(t *testing.T, e *Engine, r int, min float64) {
	t.Helper()
	d := e.tiers.runners[r]
	var tr prefetch.Trace
	d.Do(func() { tr = d.p.Trace() })
	resid, err := e.tiers.residency(r)
	if err != nil {
		t.Fatal(err)
	}
	opts := e.tiers.popts
	opts.BandwidthBytesPerSec = e.opts.LinkBandwidth // the configured ones, not the measured
	var longest time.Duration
	for _, a := range tr.Accesses {
		for _, l := range []shard.Link{shard.NVMeToHost, shard.HostToHBM, shard.HostToNVMe} {
			longest = max(longest, opts.TransferTime(l, resid[a.Key].SizeBytes))
		}
	}
	for i := range tr.Accesses {
		tr.Accesses[i].Compute = 2 * longest
	}
	const steps = 4
	sched, err := prefetch.Plan(tr, resid, opts, steps)
	if err != nil {
		t.Fatalf("rank %d: %v", r, err)
	}
	n := len(tr.Accesses)
	var planned int
	for _, a := range sched.Accesses[n:] {
		if a.Outcome == prefetch.Hit {
			planned++
		}
	}
	rate := float64(planned) / float64((steps-1)*n)
	t.Logf("rank %d: %d accesses a step; simulated hit rate from step 2: %.4f", r, n, rate)
	if rate < min {
		t.Errorf("rank %d: the plan of the engine's trace reaches a hit rate of %.4f from step 2 in simulated time, want at least %.2f", r, rate, min)
	}
}

// TestTierFaults: an NVMe read error, or a checksum mismatch, during a
// step stops training with an error that names the shard (chunk, rank,
// state) and the swap file; the next step fails too (nothing is silently
// replaced).
func TestTierFaults(t *testing.T) {
	nvmetest.Require(t)
	for _, kind := range []nvme.FaultKind{nvme.FaultEIO, nvme.FaultFlipByte} {
		t.Run(kind.String(), func(t *testing.T) {
			var faulty *nvme.Faulty
			s := tierSpec{n: 2, param: "nvme", opt: "nvme", shapeJSON: deepShapeJSON}
			e := newTierEngine(t, s, Options{NVMeDevice: func(d nvme.Device) nvme.Device {
				faulty = nvme.NewFaulty(d, nvme.Fault{Kind: kind, Op: nvme.OpRead, Nth: 5})
				return faulty
			}})
			var err error
			for range 5 {
				if _, err = e.Step(); err != nil {
					break
				}
			}
			if err == nil {
				t.Fatalf("5 steps without an error; %d faults injected", faulty.Injected(kind))
			}
			t.Logf("step %d: %v", e.StepCount()+1, err)
			checkFaultMessage(t, err)
			if kind == nvme.FaultFlipByte && !errors.Is(err, nvme.ErrCorrupt) {
				t.Errorf("a flipped byte is not reported as corruption: %v", err)
			}
			if _, err2 := e.Step(); err2 == nil {
				t.Error("the step after the failure succeeded")
			}
		})
	}
}

func fmtB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// TestSwapQueueDepth: the swap's ring holds 4 moves of aio's queue_depth ×
// thread_count requests, at least swapMinQueueDepth (the requests the drive
// works on while the goroutines that refill the ring wait for a core) and
// at most the NVMe engine's 4096.
func TestSwapQueueDepth(t *testing.T) {
	for _, c := range []struct {
		qd, threads, want int
	}{
		{8, 1, 512}, // aio's defaults: 32 requests, raised to the floor
		{64, 4, 1024},
		{1024, 64, 4096},
		{0, 0, 512},
	} {
		if got := SwapQueueDepth(config.AIO{QueueDepth: c.qd, ThreadCount: c.threads}); got != c.want {
			t.Errorf("queue_depth %d, thread_count %d: %d requests, want %d", c.qd, c.threads, got, c.want)
		}
	}
}
