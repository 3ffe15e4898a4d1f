package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/lossscale"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// ErrNotBuilt says a configuration asks for something this engine does not
// do yet (the dpu overlap mode with the optimizer on the device, or in
// fp32).
var ErrNotBuilt = errors.New("engine: not built yet")

// chunkPlan is how one chunk is laid out over the ranks.
type chunkPlan struct {
	len        int  // parameters
	shard      int  // ShardElems: each rank's slice; the chunk padded is n·shard
	persistent bool // stage 3: stays gathered on every device (below the persistence threshold)
	frozen     bool // strata.freeze: params only, no gradient, no optimizer state, no update (freeze.go)
	path       paramPath
	tiered     bool // the param shard is a tier-store state (offload_param, not persistent)
	staged     bool // the host optimizer writes the new params into an upload staging (uploads)
	// opt is the rank's optimizer state of the chunk: elems long, rank r's
	// at r·stride in the padded chunk.
	opt struct{ elems, stride int }
}

// Engine trains one model with ZeRO across the local devices: one rank per
// device, each a goroutine with a compute stream and a communication stream.
// Construct with New, run Step (or Run) from one goroutine, read Params or
// Master, Close at the end.
type Engine struct {
	cfg       *config.Config
	opts      Options
	model     Model          // what trains: Options.Model or the config's decoder (model.go)
	layout    *model.Layout  // model.Layout()
	order     []model.Access // e.model.AccessOrder(), checked
	data      *batches       // the rows of every step (data.go)
	n         int            // N: the ranks of the job, every process's (the world the model is sharded over)
	nLocal    int            // this process's ranks, global base .. base+nLocal−1 (Options.Procs; else all N)
	base      int
	stage     int
	precision gpu.DType
	// scaler is fp16's loss scaler (nil without fp16); skipped counts the
	// steps it skipped (fp16.go): the optimizer's step count is step −
	// skipped.
	scaler  *lossscale.Scaler
	skipped int64
	// fp16Run: what the steps since New or LoadCheckpoint did (FP16NoUpdate).
	fp16Run fp16Run
	offload bool // optimizer on the host (offload_optimizer.device cpu or nvme): its state is in tiers
	// gradTiered: the device holds the reduced gradient shard only until
	// its copy to the tier store completes (optimizer state on NVMe,
	// ZeRO-Infinity); else it keeps it from New to Close.
	gradTiered bool
	paramTier  shard.Tier // offload_param's tier (HBM: none)
	tiers      *tiers     // the tier store, planners and upload staging of the host optimizer; nil without it
	seq        int
	act        model.ActivationOptions // how each rank's model keeps its activations (ActivationOptionsFromConfig)
	micro      int                     // B: rows per micro-batch
	accum      int                     // A: micro-batches per rank and step
	chunks     []chunkPlan
	ranks      []*rank
	opt        *cpuadam.Optimizer
	estimate   estimate.ModelState // bf16 mixed-precision formula (estimate.Memory)
	expected   int64               // model-state bytes per device this layout allocates
	hostWant   int64               // model state on the host, all ranks, by the estimate (host optimizer)
	notes      []string

	step      int64
	closed    bool
	lastCount []gpu.LinkCounters
	busyAt    []time.Duration // per rank, its compute stream's busy time at the last Step's end (gpu.BusyStream)
	// driverAt1 is every device's driver counters when the first step
	// completed (nil before): the allocations after it are the summary's
	// DeviceAllocsAfterStep1.
	driverAt1 []gpu.DriverCounters
	// registration is the outcome of registering each pinned pool with
	// the devices (Options.HostRegistrar), in the order notePinned met
	// them.
	registration []report.HostRegistration

	overlap   string              // strata.overlap: OverlapExact, OverlapSerial or OverlapDPU
	upd       updater             // the optimizer's strategy (update.go), chosen in New
	masters   masterFormat        // the host optimizer's master format (master.go), chosen in New
	moments   cpuadam.Moments     // the host optimizer's format of m and v, chosen in New
	grads     gradPath            // the stage's gradient rule (stages.go), chosen in New
	fwdOrder  []int               // the chunks in the order the forward first reads them (the host optimizer's order)
	gradOrder []int               // the chunks in the order the backward makes their gradients ready (a delayed update's order)
	t0        time.Time           // the engine's clock (the ranks' busy logs: timeline.NewRecorder)
	hostOpt   report.HostOptStats // the host optimizer's figures of every run taken so far
	// normRanks is how many ranks' sums of squares make the norm: rank
	// 0's alone at stage 0 (each holds the whole reduced gradient), else
	// every rank's shard.
	normRanks int
	// gradFault, set by tests, makes rank r's reduced gradient of chunk c
	// NaN when it returns true.
	gradFault func(r, c int) bool
	// zeroLR, set by tests before the first step, gives chunk c's updates
	// learning rate 0 and weight decay 0 where zeroLR[c] (the reference
	// run of frozen chunks: they train but never change).
	zeroLR []bool
}

// New builds an engine for cfg on devices with one Comm per device (comms[i]
// is rank i on devices[i]): it lays the model out in chunks, shards them for
// the configured stage, allocates the model state (tagged gpu.ModelState),
// each rank's activations, and initialises the parameters from
// strata.seed, or from opts.Init. The config must be resolved for
// len(devices) devices (config.SetDevices) and carry a model shape, unless
// opts.Model brings the model (newModel says what strata.model may be then).
func New(cfg *config.Config, devices []gpu.Device, comms []gpu.Comm, opts Options) (*Engine, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p, err := precisionOf(cfg, opts)
	if err != nil {
		return nil, err
	}
	opts.Precision = p
	opts = opts.withDefaults()
	cfg = resolveMaster(inferenceOffload(cfg, opts), opts)
	if err := checkNew(cfg, devices, comms, opts); err != nil {
		return nil, err
	}
	m, layout, order, cfg, err := newModel(cfg, opts)
	if err != nil {
		return nil, err
	}
	if src := opts.Init; src != nil && src.Shape().Canonical() != layout.Shape.Canonical() {
		return nil, fmt.Errorf("engine: the initial weights are of shape %v, the config's strata.model is %v", src.Shape(), layout.Shape)
	}
	if src := opts.InitAdapters; src != nil && (layout.LoRA == nil || src.Shape().Canonical() != layout.Shape.Canonical()) {
		return nil, fmt.Errorf("engine: initial adapters for shape %v, the run is %v with LoRA %v", src.Shape(), layout.Shape, layout.LoRA)
	}
	seq, data, err := newBatches(cfg, m, opts)
	if err != nil {
		return nil, err
	}
	z := cfg.ZeRO
	e := &Engine{
		cfg: cfg, opts: opts, model: m, layout: layout, order: order, data: data, n: cfg.Strata.Devices, nLocal: len(devices), stage: z.Stage,
		precision: opts.Precision, offload: z.OffloadOptimizer.Device != config.DeviceNone,
		seq: seq, micro: cfg.TrainMicroBatchSizePerGPU, accum: cfg.GradientAccumulationSteps,
		overlap: cfg.Strata.Overlap, grads: chooseGradPath(z.Stage), t0: time.Now(),
	}
	if p := opts.Procs; p != nil {
		e.base = e.nLocal * p.Proc()
	}
	if e.scaler, err = newScaler(cfg, e.precision); err != nil {
		e.closeData()
		return nil, err
	}
	e.act = activationsOf(m, cfg, opts)
	mo, err := e.layOut()
	if err != nil {
		e.closeData()
		return nil, err
	}
	e.fwdOrder = forwardOrder(order, len(e.chunks))
	e.gradOrder = gradientOrder(order, len(e.chunks))
	if err := e.preflight(mo); err != nil {
		e.closeData()
		return nil, err
	}
	if err := e.allocate(devices, comms, mo); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.initParams(); err != nil {
		e.Close()
		return nil, err
	}
	e.tiers.markStepEnd()
	e.notePinned()
	e.noteBwd()
	e.lastCount = e.counters()
	return e, nil
}

// checkNew checks New's arguments and the config.
func checkNew(cfg *config.Config, devices []gpu.Device, comms []gpu.Comm, opts Options) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	l, n, base := len(devices), len(devices), 0
	if p := opts.Procs; p != nil {
		n, base = l*p.Procs(), l*p.Proc()
	}
	switch {
	case l == 0:
		return errors.New("engine: no devices")
	case len(comms) != l:
		return fmt.Errorf("engine: %d devices but %d comms", l, len(comms))
	case cfg.Strata.Devices != n && opts.Procs != nil:
		return fmt.Errorf("engine: the config is resolved for %d devices, the job has %d (%d processes × %d; use config.SetDevices)", cfg.Strata.Devices, n, opts.Procs.Procs(), l)
	case cfg.Strata.Devices != n:
		return fmt.Errorf("engine: the config is resolved for %d devices, got %d (use config.SetDevices)", cfg.Strata.Devices, n)
	}
	for i, c := range comms {
		if c.Rank() != base+i || c.Size() != n {
			return fmt.Errorf("engine: comm %d is rank %d of %d, want rank %d of %d", i, c.Rank(), c.Size(), base+i, n)
		}
	}
	if p := opts.Procs; p != nil {
		if err := checkProcs(p, cfg.JSON(), l); err != nil {
			return err
		}
	}
	if err := checkOffload(cfg, opts); err != nil {
		return err
	}
	if z := cfg.ZeRO; cfg.Strata.Overlap == OverlapDPU && z.OffloadOptimizer.Device == config.DeviceNone {
		return fmt.Errorf("%w: strata.overlap \"dpu\" (delayed parameter update) with the optimizer on the device: it needs offload_optimizer cpu or nvme; use \"exact\"", ErrNotBuilt)
	}
	if cfg.Strata.Overlap == OverlapDPU && opts.Precision == gpu.F32 {
		// fp32 keeps no master apart from the params, which lag the
		// update under dpu: a checkpoint could not hold the pending one.
		return fmt.Errorf("%w: strata.overlap \"dpu\" in fp32 (the params are the master weights, and under dpu they lag the update); use bf16 or \"exact\"", ErrNotBuilt)
	}
	return nil
}

// readBatches reads every rank's micro-batches of step before any rank
// starts, so that a read error (an I/O error, a data file that shrank)
// ends the step before anything ran, on every rank alike, and the step
// can be retried. Data read in windows (all but model.Tokens, checked
// whole by New) has each batch checked against the vocabulary.
func (e *Engine) readBatches(step int64) error {
	for _, r := range e.ranks {
		r.batches = r.batches[:0]
		for k := range e.accum {
			b, err := e.rows(step, r.idx, k)
			if err == nil && !e.data.checked {
				err = e.checkBatch(b)
			}
			if err != nil {
				return fmt.Errorf("engine: step %d: rank %d micro-batch %d: %w", step, r.idx, k, err)
			}
			r.batches = append(r.batches, b)
		}
	}
	return nil
}

// closeData closes the data file New opened, if any.
func (e *Engine) closeData() error { return e.data.close() }

// layOut takes the memory options from the config, the estimate, and lays
// the chunks out as it does (ShardElems, persistent chunks).
func (e *Engine) layOut() (estimate.Options, error) {
	mo, err := estimate.OptionsFromConfig(e.cfg, e.layout)
	if err != nil {
		return mo, err
	}
	// This process's ranks share its part of the node's host budget.
	mo.LocalDevices, mo.HostBudgetBytes = e.nLocal, e.hostBudget()
	if hb := e.cfg.Strata.HostBudgetBytes; hb > 0 && e.opts.NodeProcs > 1 {
		e.notes = append(e.notes, fmt.Sprintf("strata.host_budget %s is this node's: %s for each of its %d processes", units.FormatBytes(hb), units.FormatBytes(e.hostBudget()), e.opts.NodeProcs))
	}
	mo.ActivationHostBytes = estimate.InputHostBytes(e.layout.Shape, e.micro, e.seq, e.act) // the engine's precision
	if e.opts.Inference {
		mo.Inference, mo.Frozen = true, make([]bool, len(e.layout.Chunks))
		for c := range mo.Frozen {
			mo.Frozen[c] = true
		}
	}
	e.paramTier = mo.ParamTier
	e.gradTiered = mo.OptimizerTier == shard.NVMe
	e.normRanks = e.n
	if e.stage == 0 {
		e.normRanks = 1
	}
	if e.estimate, err = estimate.Memory(mo); err != nil {
		return mo, err
	}
	for c, ch := range e.layout.Chunks {
		p := chunkPlan{len: ch.Len, shard: int(e.estimate.ShardElems[c]), frozen: mo.IsFrozen(c)}
		p.persistent = mo.Persistent(c) // not a base stored coded (strata.lora.base_dtype)
		p.tiered = e.paramTier != shard.HBM && !p.persistent
		p.staged = !p.frozen && (!p.tiered || e.overlap == OverlapDPU)
		p.path = choosePath(e, p)
		// A rank's optimizer state: stage 0 the whole padded chunk (every
		// rank updates it), else the rank's shard.
		p.opt.elems, p.opt.stride = p.shard, p.shard
		if e.stage == 0 {
			p.opt.elems, p.opt.stride = e.n*p.shard, 0
		}
		e.chunks = append(e.chunks, p)
	}
	if e.estimate.FrozenParams > 0 {
		what := "strata.freeze: " + estimate.DescribeChunks(e.layout, mo.Frozen)
		if o := e.layout.LoRA; o != nil {
			what = fmt.Sprintf("strata.lora (r %d, alpha %g, %s): the base", o.R, o.Alpha, strings.Join(o.Targets, ", "))
		}
		e.notes = append(e.notes, fmt.Sprintf("%s frozen (%d of %d params): no gradient reduction, no optimizer state, no update, no weight-gradient GEMMs",
			what, e.estimate.FrozenParams, e.estimate.Params))
	}
	if dt := mo.FrozenParamDType; dt != 0 && e.paramTier != shard.HBM {
		where := "in host RAM"
		if e.paramTier == shard.NVMe {
			where = "on NVMe"
		}
		var coded int64
		for c := range e.chunks {
			if e.paramCode(c) != 0 {
				coded += int64(dt.Bytes(e.chunks[c].shard))
			}
		}
		e.notes = append(e.notes, fmt.Sprintf("strata.lora.base_dtype %s: the frozen base's param shards are stored in %s %s (%s per rank), decoded to bf16 on the devices as each arrives",
			e.cfg.Strata.LoRA.BaseDType, dt, where, units.FormatBytes(coded)))
	}
	if n := mo.ParamOffloadNote(); n != "" {
		e.notes = append(e.notes, n)
	}
	e.expected = e.expectedDeviceBytes()
	if e.offload {
		ho := mo
		ho.HostGradDType = e.precision // the gradient shard is copied to the host as the device holds it
		he, err := estimate.Memory(ho)
		if err != nil {
			return mo, err
		}
		e.hostWant = he.NodeHostBytes()
	}
	if z := e.cfg.ZeRO; e.stage == 2 && z.ReduceBucketSize != config.DefaultReduceBucketSize {
		e.notes = append(e.notes, fmt.Sprintf("zero_optimization.reduce_bucket_size %d: gradients are reduced one chunk at a time (each chunk is a bucket)", z.ReduceBucketSize))
	}
	return mo, nil
}

// allocate allocates every rank's device model state, activations and
// workspace rings (after checking that each device has room for them),
// and starts the host optimizer and its tier store, whose HBM slots take
// what is left.
func (e *Engine) allocate(devices []gpu.Device, comms []gpu.Comm, mo estimate.Options) error {
	e.masters, e.moments = chooseMaster(e), chooseMoments(e)
	for i := range e.nLocal {
		rk, err := newRank(e, e.base+i, i, devices[i], comms[i])
		if err != nil {
			return err
		}
		e.ranks = append(e.ranks, rk)
	}
	need := e.workspaceNeedBytes()
	for _, r := range e.ranks {
		if ms := r.dev.MemStats(); ms.BudgetBytes-ms.InUseBytes < need {
			return fmt.Errorf("engine: %s: %s left after model state and activations (%s), the step needs up to %s of workspace (gathered chunks, gradient buckets): raise strata.hbm_bytes or use more devices or a higher stage",
				r.dev.Name(), units.FormatBytes(ms.BudgetBytes-ms.InUseBytes), ms, units.FormatBytes(need))
		}
		if err := r.newRings(); err != nil {
			return fmt.Errorf("engine: rank %d: workspace: %w", r.idx, err)
		}
		if err := r.reserveCommScratch(); err != nil {
			return fmt.Errorf("engine: rank %d: collective scratch: %w", r.idx, err)
		}
	}
	if e.offload {
		var err error
		if e.opt, err = cpuadam.New(cpuadam.Options{Threads: e.opts.OptimizerThreads}); err != nil {
			return fmt.Errorf("engine: host optimizer: %w", err)
		}
	}
	if e.offload || e.act.Offload {
		var err error
		if e.tiers, err = newTiers(e, mo); err != nil {
			return err
		}
	}
	e.upd = chooseUpdater(e)
	return nil
}

// notePinned says whether the pinned host memory is locked or runs
// unlocked, and why (with an NVMe swap, how it sits in pages too), and
// registers it with the devices (Options.HostRegistrar).
func (e *Engine) notePinned() {
	if e.tiers == nil {
		return
	}
	for _, p := range []struct {
		pool *pinned.Pool
		name string
	}{{e.tiers.pool, "tier host copies"}, {e.tiers.uploadPool, "param upload staging and grad norms"}} {
		if p.pool == nil {
			continue
		}
		budget := p.pool.Options().BudgetBytes
		// Huge pages (and max_segments) matter for O_DIRECT to an
		// nvme_path in use; without one only an unlocked pool is news.
		switch res := p.pool.Residency(); {
		case e.tiers.swap != nil:
			e.notes = append(e.notes, fmt.Sprintf("pinned host memory %s: %s", units.FormatBytes(budget), res))
		case !res.Locked:
			e.notes = append(e.notes, fmt.Sprintf("pinned host memory %s: %s", units.FormatBytes(budget), res.LockNote))
		}
		reg := report.HostRegistration{Pool: p.name, Bytes: p.pool.Stats().BudgetBytes, Outcome: report.RegistrationNone}
		if r := e.opts.HostRegistrar; r != nil {
			// Best effort: unregistered, the copies still work (staged
			// by the driver through its own page-locked buffers).
			if err := p.pool.AddRegistrar(r); err != nil {
				reg.Outcome, reg.Error = report.RegistrationFailed, err.Error()
				e.notes = append(e.notes, fmt.Sprintf("pinned host memory %s not registered with the devices, host<->device copies are pageable: %v",
					units.FormatBytes(budget), err))
			} else {
				reg.Outcome, reg.RegisteredBytes = report.RegistrationOK, reg.Bytes
			}
		}
		e.registration = append(e.registration, reg)
	}
}

// expectedDeviceBytes is the model state this layout allocates on each
// device: the estimate's figure in bf16 mode; in fp32 mode the same
// elements with 4-byte params and grads and no separate master.
func (e *Engine) expectedDeviceBytes() int64 {
	if e.precision.Half() {
		return e.estimate.DeviceBytes()
	}
	est := e.estimate
	var b int64
	for st := range shard.StateCount {
		v := est.PerRank[st][shard.HBM]
		switch shard.State(st) {
		case shard.Param, shard.Grad:
			v *= 2 // bf16 → fp32
		case shard.Master:
			v = 0 // the params are the master weights
		}
		b += v
	}
	return b
}

// Notes are what the engine wants the user to know once: config knobs it
// reads differently from DeepSpeed.
func (e *Engine) Notes() []string { return append([]string(nil), e.notes...) }

// HostOptimizer says whether the optimizer runs on the host (offload_optimizer cpu or nvme).
func (e *Engine) HostOptimizer() bool { return e.offload }

// Layout returns the parameter layout.
func (e *Engine) Layout() *model.Layout { return e.layout }

// Config returns the config the engine runs.
func (e *Engine) Config() *config.Config { return e.cfg }

// Sampler returns the sampler of random windows over a raw corpus (its
// windows depend only on seed, step and row); nil when the data is a
// Dataset of packed rows.
func (e *Engine) Sampler() *model.Sampler { return e.data.sampler }

// Dataset returns the packed rows the engine trains on; nil for a raw
// corpus (Sampler).
func (e *Engine) Dataset() Dataset { return e.data.dataset }

// TokensPerStep is the tokens of one global batch: N·A·B·seq.
func (e *Engine) TokensPerStep() int { return e.n * e.accum * e.micro * e.seq }

// LR is the learning rate of step (1 for the first), as the config's
// scheduler gives it (config.LR numbers updates from 0).
func (e *Engine) LR(step int64) float64 { return e.cfg.LR(int(step - 1)) }

// Step runs one optimizer step on the step's global batch: every rank
// accumulates its A micro-batches, gradients are reduced (AllReduce,
// ReduceScatter per chunk), the global norm is taken, and Adam updates
// each rank's shard on the device or the host. A non-finite loss or
// gradient returns an error wrapping model.ErrNonFinite and leaves the
// parameters unchanged.
func (e *Engine) Step() (report.StepStats, error) {
	if e.closed {
		panic("engine: Step after Close")
	}
	if e.opts.Inference {
		return report.StepStats{}, errors.New("engine: Step of an inference engine (Options.Inference): it evaluates, it does not train")
	}
	start := time.Now()
	step := e.step + 1
	st := report.StepStats{Step: step, LR: e.LR(e.updates() + 1), ClipCoef: 1, Tokens: e.TokensPerStep(), LossScale: e.LossScale()}

	if err := e.readBatches(step); err != nil {
		return st, err
	}
	snap, err := e.tiers.beginStep()
	if err != nil {
		return st, fmt.Errorf("engine: step %d: %w", step, err)
	}
	if err := e.parallel(func(r *rank) error { return e.upd.beforePass(r, step) }); err != nil {
		e.abortNext()
		return st, fmt.Errorf("engine: step %d optimizer: %w", step, err)
	}
	if err := e.parallel(func(r *rank) error { return r.backward(step) }); err != nil {
		e.abortNext()
		return st, fmt.Errorf("engine: step %d: %w", step, err)
	}
	now := e.counters()
	for i, c := range now {
		st.Moved.HostToDevice += c.HostToDevice - e.lastCount[i].HostToDevice
		st.Moved.DeviceToHost += c.DeviceToHost - e.lastCount[i].DeviceToHost
		st.Moved.DeviceToDevice += c.DeviceToDevice - e.lastCount[i].DeviceToDevice
		st.Moved.Collective += c.Collective - e.lastCount[i].Collective
	}
	e.lastCount = now

	// Every rank's losses and sums of squares, this process's and (with
	// Options.Procs) the others'.
	losses, router, norms, err := e.stepValues()
	if err != nil {
		return st, fmt.Errorf("engine: step %d: %w", step, err)
	}
	// Loss: the micro-batches in rank order, as model.Trainer sums them.
	var lossSum, routerSum float64
	for i, l := range losses {
		lossSum += l
		if router != nil {
			routerSum += router[i]
		}
	}
	st.Loss = lossSum / float64(e.n*e.accum)
	st.RouterLoss = routerSum / float64(e.n*e.accum)
	// Norm: chunk by chunk, the ranks' shard sums in rank order (stage 0:
	// rank 0's sum over the whole chunk, as the single-device loop).
	var sq float64
	for c, p := range e.chunks {
		if p.frozen {
			continue // no gradient: the norm is the trainable chunks'
		}
		for r := range e.normRanks {
			sq += norms[r*len(e.chunks)+c]
		}
	}
	st.GradNorm = math.Sqrt(sq) / st.LossScale // the gradient of the unscaled loss (fp16.go)
	if math.IsNaN(st.Loss) || math.IsInf(st.Loss, 0) || math.IsNaN(st.GradNorm) || math.IsInf(st.GradNorm, 0) {
		e.abortNext() // undo the updates of the backward
		if e.scaler != nil {
			e.takeHostOpt(&st) // the update before it, completed in its pass
			st.Tier, st.Duration = e.tiers.stepStats(snap), time.Since(start)
			return e.skip(st) // fp16: an overflow skips the step
		}
		return st, fmt.Errorf("engine: %w: step %d loss %v grad norm %v; parameters not updated", model.ErrNonFinite, step, st.Loss, st.GradNorm)
	}
	if max := e.cfg.GradientClipping; max > 0 && st.GradNorm > max {
		st.ClipCoef = max / (st.GradNorm + 1e-6) // torch.nn.utils.clip_grad_norm_
	}
	ap := e.nextAdam(st.ClipCoef)
	optStart := time.Now()
	err = e.parallel(func(r *rank) error { return e.upd.update(r, ap) })
	e.takeHostOpt(&st)
	if err != nil {
		return st, fmt.Errorf("engine: step %d optimizer: %w", step, err)
	}
	st.OptimizerTime = time.Since(optStart)
	st.Tier = e.tiers.stepStats(snap)
	if e.scaler != nil {
		e.scaler.Update(false) // no overflow: cannot fail
	}
	e.step = step
	e.countFP16(st)
	if e.driverAt1 == nil {
		e.driverAt1 = e.driverCounters()
	}
	st.Duration = time.Since(start)
	st.ComputeBusy = e.computeBusy()
	if s := st.Duration.Seconds(); s > 0 {
		st.TokensPer = float64(st.Tokens) / s
	}
	return st, nil
}

// computeBusy is the longest, over the ranks, of the time each compute
// stream ran work since the last call (waits excluded): 0 when the
// backend's streams do not count it (gpu.BusyStream).
func (e *Engine) computeBusy() time.Duration {
	if len(e.busyAt) != len(e.ranks) {
		e.busyAt = make([]time.Duration, len(e.ranks))
	}
	var most time.Duration
	for i, r := range e.ranks {
		bs, ok := r.s.(gpu.BusyStream)
		if !ok {
			return 0
		}
		b := bs.Busy()
		most = max(most, b-e.busyAt[i])
		e.busyAt[i] = b
	}
	return most
}

// stepValues returns every rank's micro-batch losses (accum per rank) and
// every rank's sum of squares of each chunk's reduced gradient (one per
// chunk; frozen chunks 0), in global rank order: this process's ranks',
// and with Options.Procs the other processes'.
func (e *Engine) stepValues() (losses, router, norms []float64, err error) {
	nc := len(e.chunks)
	losses, norms = make([]float64, e.n*e.accum), make([]float64, e.n*nc)
	if e.layout.Shape.MoE() {
		router = make([]float64, e.n*e.accum)
	}
	for _, r := range e.ranks {
		copy(losses[r.idx*e.accum:], r.losses)
		if router != nil {
			copy(router[r.idx*e.accum:], r.routerLosses)
		}
		if r.idx >= e.normRanks {
			continue
		}
		for c, p := range e.chunks {
			if !p.frozen {
				norms[r.idx*nc+c] = r.normSq(c)
			}
		}
	}
	if err := e.shareF64(losses, e.accum); err != nil {
		return nil, nil, nil, err
	}
	if router != nil {
		if err := e.shareF64(router, e.accum); err != nil {
			return nil, nil, nil, err
		}
	}
	if err := e.shareF64(norms, nc); err != nil {
		return nil, nil, nil, err
	}
	return losses, router, norms, nil
}

// takeHostOpt moves the host optimizer's figures of the runs completed
// since the last step into st and the run's totals.
func (e *Engine) takeHostOpt(st *report.StepStats) {
	for _, r := range e.ranks {
		st.HostOpt.Add(r.hostFig)
		r.hostFig = report.HostOptStats{}
	}
	e.hostOpt.Add(st.HostOpt)
}

// chunkAdam is ap for chunk c: ap itself, or for a chunk the tests give
// learning rate 0 (zeroLR) ap with LR and WeightDecay 0.
func (e *Engine) chunkAdam(c int, ap gpu.AdamParams) gpu.AdamParams {
	if c < len(e.zeroLR) && e.zeroLR[c] {
		ap.LR, ap.WeightDecay = 0, 0
	}
	return ap
}

// adamParams is Adam's parameters of step with the clipping factor coef.
func (e *Engine) adamParams(step int64, coef float64) gpu.AdamParams {
	p := e.cfg.Optimizer.Params
	ap := gpu.AdamParams{LR: e.LR(step), Beta1: p.Betas[0], Beta2: p.Betas[1], Eps: p.Eps, WeightDecay: p.WeightDecay,
		Step: step, GradScale: coef, Mode: gpu.AdamW}
	if !e.cfg.Optimizer.DecoupledWeightDecay() {
		ap.Mode = gpu.AdamL2
	}
	return ap
}

// abortNext drops what the updater began before a failed step's pass
// (the updates of the backward are undone).
func (e *Engine) abortNext() {
	for _, r := range e.ranks {
		e.upd.abort(r)
	}
}

// Run runs steps optimizer steps, calling fn (when not nil) after each; an
// error from fn stops the run and is returned as is. ctx is checked
// between steps: once it is done, Run returns before the next step with
// ctx.Err() wrapped, naming that step (a step under way is not cut
// short: the engine stays at a whole step, ready to save or go on).
func (e *Engine) Run(ctx context.Context, steps int, fn func(report.StepStats) error) error {
	for range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("engine: run stopped before step %d: %w", e.step+1, err)
		}
		st, err := e.Step()
		if err != nil {
			return err
		}
		if fn != nil {
			if err := fn(st); err != nil {
				return err
			}
		}
	}
	return nil
}

// StepCount is the number of optimizer steps taken.
func (e *Engine) StepCount() int64 { return e.step }

// parallel runs f on every rank, each on its own goroutine, and returns the
// first error in rank order.
func (e *Engine) parallel(f func(*rank) error) error {
	errs := make([]error, len(e.ranks))
	var wg sync.WaitGroup
	for i, r := range e.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(r)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", e.ranks[i].idx, err)
		}
	}
	return nil
}

func (e *Engine) driverCounters() []gpu.DriverCounters {
	out := make([]gpu.DriverCounters, len(e.ranks))
	for i, r := range e.ranks {
		out[i] = r.dev.DriverCounters()
	}
	return out
}

func (e *Engine) counters() []gpu.LinkCounters {
	out := make([]gpu.LinkCounters, len(e.ranks))
	for i, r := range e.ranks {
		out[i] = r.dev.Counters()
	}
	return out
}

// Params synchronizes every device and returns the model's parameters as
// the devices hold them (bf16 widened to float32 in bf16 mode), one
// []float32 per chunk of Layout().Chunks, assembled from the ranks' shards.
func (e *Engine) Params() ([][]float32, error) {
	return e.collect(shard.Param, e.precision)
}

// Master synchronizes and returns the fp32 weights the optimizer updates
// (the parameters themselves in fp32 mode), assembled from the shards.
func (e *Engine) Master() ([][]float32, error) {
	if e.precision == gpu.F32 {
		return e.collect(shard.Param, gpu.F32) // the params are the master weights
	}
	return e.collect(shard.Master, gpu.F32)
}

// collect reads state s of every chunk, each rank's shard from where it
// lives (fillChunk, as a checkpoint reads it), widened to float32.
func (e *Engine) collect(s shard.State, dt gpu.DType) ([][]float32, error) {
	resume, err := e.quiesce()
	defer resume()
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make([][]float32, len(e.chunks))
	for c, p := range e.chunks {
		per := p.shard * dt.Size()
		whole := make([]byte, e.n*per)
		if err := e.fillChunk(c, s, whole, per); err != nil {
			return nil, fmt.Errorf("engine: chunk %d: %w", c, err)
		}
		out[c] = decode(whole, dt)[:p.len]
	}
	return out, nil
}

// Close synchronizes the devices and frees everything the engine holds;
// safe to call more than once.
func (e *Engine) Close() error {
	if e.closed {
		return nil
	}
	// Finish the pending host update; its error is a lease's, which the
	// Step that leased returned already.
	e.settle()
	e.closed = true
	var first error
	for _, r := range e.ranks {
		if err := r.close(); err != nil && first == nil {
			first = err
		}
	}
	if err := e.tiers.close(); err != nil && first == nil {
		first = err
	}
	e.ranks = nil
	if e.opt != nil {
		e.opt.Close()
	}
	if err := e.closeData(); err != nil && first == nil {
		first = err
	}
	return first
}
