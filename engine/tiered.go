package engine

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// tiers is where the host optimizer's model state lives (ZeRO-Offload and
// ZeRO-Infinity alike), and the saved block inputs of cpu_checkpointing:
// one tier.Store for all ranks, the moves of one prefetch.Planner per rank
// (each rank's trace repeats exactly), the NVMe swap, the pinned pool of
// the store's host copies, and the pinned staging of the parameter uploads
// (the optimizer's output on its way up: not model state, outside the
// store and strata.host_budget, Summary.HostStagingBytes). Which states it
// holds and where each is homed, per offload setting: docs/DESIGN.md ("By
// offload setting", "Budgets per tier").
type tiers struct {
	e                  *Engine
	paramTier, optTier shard.Tier
	// window is how many chunks' state a rank leases ahead of cpuadam:
	// every chunk when nothing leaves host RAM, else one less than the
	// host budget's staging room holds (estimate.HostStagingBytes), the
	// chunk left being the planner's read-ahead.
	window  int
	static  bool // no model state ever leaves its home (isStatic)
	pool    *pinned.Pool
	nvmeEng *nvme.Engine
	swap    *nvme.Swap
	store   *tier.Store
	runners []*tierRunner
	specs   map[shard.Key]tier.Spec
	popts   prefetch.Options
	t0      time.Time

	uploadPool   *pinned.Pool       // the uploads' and the norms' pinned memory
	upload       [][]*pinned.Buffer // [rank][chunk]; nil where the store holds the param
	norms        []*pinned.Buffer   // [rank]: the gradient norms' download (rank.normsHost)
	stagingBytes int64              // the uploads' bytes, all ranks

	hbmBudget, hostBudget int64                                    // the store's: per device, all ranks
	planHostBudget        int64                                    // each rank's planner's share of the host budget
	homes                 [shard.StateCount][shard.TierCount]int64 // bytes, all ranks, by state and home tier
	nvmePaths             []string
	swapBytes             int64
	peakHBM, peakHost     int64    // run-wide peaks (the store's are reset every step)
	peakHBMByDevice       []int64  // run-wide, per device
	last                  tierSnap // at the end of the last step (or New)

	bw prefetch.BandwidthMeter // the link bandwidths measured so far

	// nvmeRead and nvmeWritten [chunk][state] are the bytes the runners'
	// moves from and to NVMe put on links, all ranks (both hops of a
	// two-hop move): what a frozen chunk's optimizer state never costs
	// (freeze_test.go). The moves of New and of a restore go around the
	// runners and are not counted.
	nvmeRead, nvmeWritten [][shard.StateCount]atomic.Int64
}

// paramTiered says whether chunk c's param shard lives in the tier store
// (offload_param, which needs the host optimizer: checkOffload).
func (e *Engine) paramTiered(c int) bool { return e.chunks[c].tiered }

// paramCode is the coded dtype chunk c's param shards are stored in in the
// tier store (strata.lora.base_dtype "nf4" or "int8": a frozen base chunk
// streamed from host RAM or NVMe, decoded to bf16 on the device;
// tier.Spec.Stored), 0 when they are bf16.
func (e *Engine) paramCode(c int) dtype.DType {
	o := e.cfg.Strata.LoRA
	if o == nil || !e.chunks[c].frozen || !e.chunks[c].tiered {
		return 0
	}
	return estimate.BaseDType(o.BaseDType)
}

// quantize codes src in format dt (its dtype.Codecs codec: internal/nf4,
// internal/absmax8), the host's side of gpu.Ops.Dequantize.
func quantize(dt dtype.DType, src []float32) []byte {
	c := dtype.MustCodec(dt)
	q := make([]byte, c.Bytes(len(src)))
	c.Quantize(q, src)
	return q
}

// dequantize decodes q (format dt) into dst, as the device does before
// rounding to bf16.
func dequantize(dt dtype.DType, dst []float32, q []byte) {
	dtype.MustCodec(dt).Dequantize(dst, q)
}

func tkey(c, r int, s shard.State) shard.Key {
	return shard.Key{Chunk: shard.ChunkID(c), Rank: int32(r), State: s}
}

// inferenceOffload is cfg for an inference engine whose params are
// offloaded without offload_optimizer: an inference engine writes no
// params and has no optimizer state, so it needs no optimizer offload; its
// (never allocated) optimizer state is placed where the params are, so the
// tier store that homes them is built as a training engine's. Any other
// cfg is returned as it is.
func inferenceOffload(cfg *config.Config, opts Options) *config.Config {
	z := cfg.ZeRO
	if !opts.Inference || z.OffloadParam.Device == config.DeviceNone || z.OffloadOptimizer.Device != config.DeviceNone {
		return cfg
	}
	c := *cfg
	c.ZeRO.OffloadOptimizer.Device, c.ZeRO.OffloadOptimizer.NVMePath = z.OffloadParam.Device, z.OffloadParam.NVMePath
	return &c
}

// resolveMaster is cfg with the master the engine keeps: as written, else
// config.MasterFormat's choice for a training engine in bf16 (the
// remainder with the optimizer on NVMe), else fp32 (an inference engine,
// which keeps no masters, or Options.Precision not bf16), written into a
// copy only where it is not MasterFormat's (the config a checkpoint
// records stays as the run's).
func resolveMaster(cfg *config.Config, opts Options) *config.Config {
	if cfg.Strata.OptimizerState.Master != "" || !cfg.RemainderMaster() || !opts.Inference && opts.Precision == gpu.BF16 {
		return cfg
	}
	c := *cfg
	c.Strata.OptimizerState.Master = config.MasterFP32
	return &c
}

// checkOffload says whether the engine can run cfg's offload settings.
func checkOffload(cfg *config.Config, opts Options) error {
	z := cfg.ZeRO
	p, o := z.OffloadParam.Device, z.OffloadOptimizer.Device
	switch {
	case o == config.DeviceNVMe && z.Stage != 3:
		return fmt.Errorf("engine: offload_optimizer \"nvme\" needs stage 3 (ZeRO-Infinity, as in DeepSpeed), but stage is %d", z.Stage)
	case p != config.DeviceNone && z.Stage != 3:
		return fmt.Errorf("engine: offload_param %q needs stage 3, but stage is %d", p, z.Stage)
	case p != config.DeviceNone && o == config.DeviceNone:
		return fmt.Errorf("engine: offload_param %q needs offload_optimizer \"cpu\" or \"nvme\" (the new params are written by the host optimizer)", p)
	case (p != config.DeviceNone || o == config.DeviceNVMe) && !opts.Precision.Half():
		return fmt.Errorf("engine: offload_param and NVMe offload need bf16 or fp16 mixed precision, not %s", opts.Precision)
	case o == config.DeviceCPU && z.Stage == 0:
		return errors.New("engine: offload_optimizer \"cpu\" needs stage 1, 2 or 3 (as in DeepSpeed)")
	case cfg.RemainderMaster() && o == config.DeviceNone:
		return fmt.Errorf("engine: strata.optimizer_state.master %q needs the optimizer offloaded (the remainder is cpuadam's)", config.MasterBF16Remainder)
	case cfg.RemainderMaster() && opts.Precision != gpu.BF16:
		return fmt.Errorf("engine: strata.optimizer_state.master %q needs bf16 params (the master's high half is the bf16 param), not %s", config.MasterBF16Remainder, opts.Precision)
	}
	return nil
}

// newTiers lays out the homes, sizes the budgets (tier.PlanBudgets), opens
// the pinned pool, the swap and the store, registers every shard state and
// starts a planner per rank. The ranks exist (device model state and
// activations are allocated), so the HBM left for param copies is known.
func newTiers(e *Engine, mo estimate.Options) (*tiers, error) {
	t, sizes, err := planTiers(e, mo)
	if err != nil {
		return nil, err
	}
	sizes.HBMFreeBytes = e.hbmFreeBytes()
	b, err := tier.PlanBudgets(sizes)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	t.hbmBudget, t.hostBudget, t.planHostBudget = b.HBMBytes, b.HostBytes, b.PlanHostBytes
	if err := t.open(b.PoolBytes); err != nil {
		t.close()
		return nil, err
	}
	if t.hbmBudget > 0 {
		// The HBM of the param copies and of the restored inputs, taken
		// now: the step moves them in and out of these slots without
		// allocating.
		if err := t.store.ReserveHBM(shard.Param, shard.Activation); err != nil {
			t.close()
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	if err := t.openStaging(); err != nil {
		t.close()
		return nil, err
	}
	if err := t.startPlanners(); err != nil {
		t.close()
		return nil, err
	}
	t.window = estimate.TierReadAhead
	switch {
	case t.swap == nil:
		t.window = len(e.chunks)
	case t.optTier == shard.NVMe:
		t.window = estimate.TierReadAhead - 1
	}
	return t, nil
}

// planTiers lays the store out (layOut: every state's spec and home) and
// returns the sizes its budgets rest on, all but HBMFreeBytes (known once
// the devices hold their model state): nothing is allocated.
func planTiers(e *Engine, mo estimate.Options) (*tiers, tier.Sizes, error) {
	t := &tiers{e: e, paramTier: mo.ParamTier, optTier: mo.OptimizerTier, specs: map[shard.Key]tier.Spec{}, t0: time.Now(),
		nvmeRead: make([][shard.StateCount]atomic.Int64, len(e.chunks)), nvmeWritten: make([][shard.StateCount]atomic.Int64, len(e.chunks))}
	est, err := estimate.Memory(mo)
	if err != nil {
		return nil, tier.Sizes{}, err
	}
	sizes := t.layOut(est)
	sizes.HBMBytes = e.opts.TierHBMBytes
	sizes.StagingBytes = est.HostStagingPerRank // the same arithmetic strata estimate prints
	sizes.SpareBytes = estimate.TierSpareBytes(est.ShardElems)
	sizes.HostBudgetBytes = e.hostBudget()
	t.static = t.isStatic()
	sizes.Static = t.static
	sizes.ActivationHBMBytes = e.inputHBMBytes()
	return t, sizes, nil
}

// hbmFreeBytes is the least device memory any rank has left after its
// model state, activations and workspace rings (all taken by now).
func (e *Engine) hbmFreeBytes() int64 {
	free := int64(-1)
	for _, r := range e.ranks {
		ms := r.dev.MemStats()
		if f := ms.BudgetBytes - ms.InUseBytes; free < 0 || f < free {
			free = f
		}
	}
	return free
}

// layOut registers nothing yet: it decides every state's spec and home
// (t.specs, t.homes) and returns the sizes the budgets rest on. Params:
// offload_param's tier. Optimizer state: host, or NVMe with host_budget
// keeping master, then m, then v in RAM (coldest last); the gradient shard
// host, or NVMe where the budget is full (est.HostKept: the estimate's
// split). Shards count as the planner counts them: rounded up to
// IOAlignBytes (the store's host and NVMe charge, the largest of its
// charges).
func (t *tiers) layOut(est estimate.ModelState) tier.Sizes {
	e := t.e
	s := tier.Sizes{Ranks: e.nLocal, OptimizerOnHost: t.optTier == shard.Host, Inference: e.opts.Inference}
	for c, p := range e.chunks {
		if e.paramTiered(c) {
			s.ParamBytes += ioBytes(int64(p.shard) * 2)
			s.MaxParamBytes = max(s.MaxParamBytes, ioBytes(int64(p.shard)*2))
			s.SlotShards = append(s.SlotShards, tier.SlotClass{Elems: p.shard, DType: e.precision})
		}
	}
	put := func(k shard.Key, elems int, dt dtype.DType, home shard.Tier) {
		t.specs[k] = tier.Spec{Elems: elems, DType: dt, Home: home}
	}
	for k, sp := range e.inputSpecs() {
		t.specs[k] = sp // cpu_checkpointing: the saved block inputs (inputs.go)
		if k.Rank == 0 {
			s.SlotShards = append(s.SlotShards, tier.SlotClass{Elems: sp.Elems, DType: sp.DType})
		}
	}
	for r := range e.nLocal {
		if !e.offload {
			break // no host optimizer: the store holds the saved inputs only
		}
		for c, p := range e.chunks {
			if e.paramTiered(c) {
				put(tkey(c, r, shard.Param), p.shard, e.precision, t.paramTier)
				if dt := e.paramCode(c); dt != 0 {
					sp := t.specs[tkey(c, r, shard.Param)]
					sp.Stored = dt
					t.specs[tkey(c, r, shard.Param)] = sp
				}
			}
			if p.frozen {
				continue // no gradient, no optimizer state (freeze.go)
			}
			home := shard.Host
			if kept := est.HostKept[shard.Grad]; kept != nil && !kept[c] {
				home = shard.NVMe
			}
			put(tkey(c, r, shard.Grad), e.optElems(c), e.precision, home)
			for _, st := range []shard.State{shard.Master, shard.AdamM, shard.AdamV} {
				home := t.optTier
				if home == shard.NVMe && est.HostKept[st] != nil && est.HostKept[st][c] {
					home = shard.Host
				}
				put(tkey(c, r, st), e.optElems(c), est.Options.StateDType(st), home)
			}
		}
	}
	hostRank := make([]int64, e.nLocal)
	for k, sp := range t.specs {
		t.homes[k.State][sp.Home] += sp.StoredBytes()
		if sp.Home == shard.Host {
			hostRank[k.Rank] += ioBytes(sp.StoredBytes())
		}
	}
	s.HomeBytes = slices.Max(hostRank) // the ranks' are equal
	return s
}

// open makes the pinned pool (poolBytes), the swap and the store, and
// registers every state.
func (t *tiers) open(poolBytes int64) error {
	e := t.e
	var err error
	if t.pool, err = pinned.New(pinned.Options{BudgetBytes: poolBytes, Lock: e.opts.PinnedLock}); err != nil {
		var he *pinned.HostError
		if errors.As(err, &he) && e.cfg.Strata.HostBudgetBytes == 0 {
			return fmt.Errorf("engine: tier host memory: %w; or set strata.host_budget below it with the state on NVMe (offload_optimizer / offload_param nvme)", err)
		}
		return fmt.Errorf("engine: tier host memory: %w", err)
	}
	if err := t.openSwap(); err != nil {
		return err
	}
	so := tier.Options{Host: t.pool, HostBudgetBytes: t.hostBudget, Swap: t.swap, HBMBudgetBytes: max(t.hbmBudget, 1)}
	if t.nvmeEng != nil {
		so.FixedIO = t.nvmeEng // the pool's arenas and the swap files, as io_uring fixed buffers and files
	}
	for _, r := range e.ranks {
		so.Devices = append(so.Devices, r.dev)
	}
	if t.store, err = tier.New(so); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if note := t.store.Registration().Note; note != "" {
		e.notes = append(e.notes, "NVMe swap I/O: "+note)
	}
	for _, k := range sortedKeys(t.specs) {
		if err := t.store.Register(k, t.specs[k]); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
	}
	return nil
}

// startPlanners starts a planner and its runner per rank, with the store's
// budgets: each rank's planner gets its share of the host budget.
func (t *tiers) startPlanners() error {
	e := t.e
	t.popts = prefetch.Options{BandwidthBytesPerSec: e.opts.LinkBandwidth, Slack: e.opts.PrefetchSlack, WriteBehindDepth: tierWriteBehindDepth}
	t.bw.Base = e.opts.LinkBandwidth
	t.popts.BudgetBytes[shard.HBM] = max(t.hbmBudget, 1)
	t.popts.BudgetBytes[shard.Host] = t.planHostBudget
	for r := range e.nLocal {
		res, err := t.residency(r)
		if err != nil {
			return err
		}
		p, err := prefetch.New(res, t.popts)
		if err != nil {
			return fmt.Errorf("engine: rank %d: %w", r, err)
		}
		t.runners = append(t.runners, newRunner(t, r, p))
	}
	return nil
}

// residency is what rank r's planner plans with: each of the rank's states
// at the size the store charges for it (the largest of a copy's charges:
// its padded host buffer; the store would refuse moves the planner thought
// would fit otherwise) and its home.
func (t *tiers) residency(r int) (prefetch.Residency, error) {
	res := prefetch.Residency{}
	for k, sp := range t.specs {
		if int(k.Rank) == r {
			w, err := t.store.Where(k)
			if err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
			res[k] = prefetch.Placement{SizeBytes: slices.Max(w.ChargeBytes[:]), Home: sp.Home}
			if sp.Stored != 0 && sp.Stored != sp.DType { // coded: each tier at its own charge
				pl := res[k]
				pl.TierBytes = w.ChargeBytes
				res[k] = pl
			}
		}
	}
	return res, nil
}

func sortedKeys(m map[shard.Key]tier.Spec) []shard.Key {
	keys := make([]shard.Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b shard.Key) int {
		switch {
		case a.Chunk != b.Chunk:
			return int(a.Chunk - b.Chunk)
		case a.Rank != b.Rank:
			return int(a.Rank - b.Rank)
		}
		return int(a.State) - int(b.State)
	})
	return keys
}

// RemoveSwapFiles removes the names of the swap files of every engine of
// this process not closed yet, and returns them: for a process about to
// exit without Close (a second Ctrl-C). A step in flight can still read
// and write them (their descriptors stay open); the kernel frees their
// space when the process exits.
func RemoveSwapFiles() []string { return nvme.UnlinkLive() }

// openSwap opens the NVMe engine (aio: queue_depth × thread_count requests
// in flight) and a swap file per nvme_path (striped in aio.block_size
// units) sized for every NVMe home.
func (t *tiers) openSwap() error {
	var nv int64
	for st := range shard.StateCount {
		nv += t.homes[st][shard.NVMe]
	}
	if nv == 0 {
		return nil
	}
	if err := t.resolveNVMePaths(); err != nil {
		return err
	}
	var err error
	if t.nvmeEng, err = nvme.Open(nvme.Options{QueueDepth: SwapQueueDepth(t.e.cfg.AIO)}); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	var dev nvme.Device = t.nvmeEng
	if t.e.opts.NVMeDevice != nil {
		dev = t.e.opts.NVMeDevice(dev)
	}
	var stripe int64
	t.swapBytes, stripe = t.swapSize(nv)
	if t.swap, err = nvme.NewSwap(dev, nvme.SwapOptions{Paths: t.nvmePaths, SizeBytes: t.swapBytes, StripeBytes: stripe}); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	for _, f := range t.swap.Stale() {
		t.e.notes = append(t.e.notes, fmt.Sprintf("stale swap file %s: a killed run left it, no live run holds its lock; remove it to reclaim the space (rm %s)", f, f.Path))
	}
	return nil
}

// SwapQueueDepth is the requests a run keeps in flight on its swap: one
// ring serves every move, and the planner keeps several on each NVMe link
// (the optimizer reads master, m and v of the next chunks while it writes
// the last ones': tierWriteBehindDepth), so each gets aio's queue_depth ×
// thread_count requests, as a DeepSpeed aio handle of its own would. With
// the ring at queue_depth alone (8), a gpt-2b step's reads and writes
// shared 8 requests (bench/README-step.md).
//
// It is never below swapMinQueueDepth: the ring is refilled by goroutines
// (each move's, as its requests complete) that share the cores with
// cpuadam and the compute, and one that becomes runnable while those hold
// every P waits for the scheduler's next preemption, milliseconds later.
// The requests in flight are what the drive works on meanwhile. On this
// machine (2 cores), 7 moves of 192 MiB through the swap beside two
// CPU-bound goroutines moved 1.5 GB/s with 32 requests in flight, 3.0
// with 128, 4.5 with 512 and 4.9 with 2048 (4.9-7.3 GB/s alone at every
// depth); the requests are the moves' own buffers, so depth costs no memory.
func SwapQueueDepth(aio config.AIO) int {
	return min(max(max(aio.QueueDepth, 1)*max(aio.ThreadCount, 1)*tierWriteBehindDepth, swapMinQueueDepth), 4096)
}

// swapMinQueueDepth is the least ring depth of a run's swap (see
// SwapQueueDepth).
const swapMinQueueDepth = 512

// swapSize is the swap the run takes for nv bytes of NVMe homes, and its
// stripe unit (aio.block_size): room for every home plus fragmentation:
// extents smaller than two stripe units live in one file, so each file
// gets a few spare units.
func (t *tiers) swapSize(nv int64) (sizeBytes, stripeBytes int64) {
	stripe := t.e.cfg.AIO.BlockSize
	if stripe == 0 {
		stripe = config.DefaultAIOBlockSize
	}
	return nv + nv/16 + int64(len(t.nvmePaths))*4*stripe, stripe
}

// resolveNVMePaths collects the nvme_path directories of offload_param and
// offload_optimizer, each once: spellings of one directory (a trailing
// slash, a relative path, a symlink) are merged into one swap file there,
// with a note when they were spelled differently.
func (t *tiers) resolveNVMePaths() error {
	z := t.e.cfg.ZeRO
	first := map[string]string{}
	for _, ps := range [][]string{z.OffloadParam.NVMePath, z.OffloadOptimizer.NVMePath} {
		for _, p := range ps {
			r, err := nvme.ResolvePath(p)
			if err != nil {
				return fmt.Errorf("engine: %w", err)
			}
			if q, ok := first[r]; ok {
				if q != p {
					t.e.notes = append(t.e.notes, fmt.Sprintf("nvme_path %s and %s are one directory (%s): one swap file there", q, p, r))
				}
				continue
			}
			first[r] = p
			t.nvmePaths = append(t.nvmePaths, r)
		}
	}
	if len(t.nvmePaths) == 0 {
		return errors.New("engine: NVMe offload needs nvme_path")
	}
	return nil
}

// now is the planner's clock.
func (t *tiers) now() time.Duration { return time.Since(t.t0) }

// initShard writes the initial contents of a state to its home. A frozen
// chunk's optimizer state does not exist: its initial master is dropped.
func (t *tiers) initShard(k shard.Key, data []byte) error {
	if k.State != shard.Param && t.e.isFrozen(int(k.Chunk)) {
		return nil
	}
	if err := t.store.WriteHome(k, data); err != nil {
		return fmt.Errorf("engine: init %s: %w", k, err)
	}
	return nil
}

// readShard returns the newest contents of a state (the runners are
// paused, nothing is in flight). A shard valid only on NVMe is fetched into
// host memory for the read and evicted after, so the planner's picture of
// the store stays true.
func (t *tiers) readShard(k shard.Key) ([]byte, error) {
	out := make([]byte, t.specs[k].StoredBytes())
	if err := t.store.ReadNewest(k, out); err != nil {
		return nil, err
	}
	return out, nil
}

// pause stops every planner from issuing moves and waits for those in
// flight; resume undoes it.
func (t *tiers) pause() error {
	var first error
	for _, d := range t.runners {
		if err := d.Pause(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (t *tiers) resume() {
	for _, d := range t.runners {
		d.Resume()
	}
}

func (t *tiers) close() error {
	if t == nil {
		return nil
	}
	var errs []error
	for _, d := range t.runners {
		d.Close()
	}
	if t.store != nil {
		if err := t.store.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if t.swap != nil {
		if err := t.swap.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if t.nvmeEng != nil {
		if err := t.nvmeEng.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if t.pool != nil {
		if err := t.pool.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, bs := range append(t.upload, t.norms) {
		for _, b := range bs {
			if b != nil {
				t.uploadPool.Put(b)
			}
		}
	}
	for i, b := range t.norms {
		if b != nil && i < len(t.e.ranks) {
			t.e.ranks[i].normsHost = make([]byte, len(t.e.ranks[i].normsHost)) // the pool's memory is gone
		}
	}
	t.upload, t.norms = nil, nil
	if t.uploadPool != nil {
		if err := t.uploadPool.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: tiers: %w", err)
	}
	return nil
}

// tierRunner is one rank's handle on the tier runtime: the tier.Runner that
// executes the rank's planner on the store (the rank declares accesses with
// Use and ends them with Done; Settle, BeginStep, Pause, Resume, Close), and
// the planner itself, whose counters and bandwidths only the engine reads
// and sets, through the runner (which serializes planner calls).
type tierRunner struct {
	*tier.Runner
	p    *prefetch.Planner
	rank int
}

// newRunner starts rank r's runner, reporting its moves and stalls to the
// engine's Tracer when there is one.
func newRunner(t *tiers, r int, p *prefetch.Planner) *tierRunner {
	o := tier.RunnerOptions{Rank: int32(r), Clock: t.now}
	rec := t.e.ranks[r].tr // the timeline and the host optimizer's busy log; nil: neither
	o.OnMove = func(sp tier.MoveSpan) {
		switch m := sp.Move; {
		case m.From == shard.NVMe:
			t.nvmeRead[m.Key.Chunk][m.Key.State].Add(sp.Bytes)
		case m.To == shard.NVMe:
			t.nvmeWritten[m.Key.Chunk][m.Key.State].Add(sp.Bytes)
		}
		rec.Move(sp.Move, sp.Start, sp.Duration, sp.Bytes, t.specs[sp.Move.Key].SizeBytes(), sp.Err)
	}
	// The optimizer-state waits count in the overlap figures with or
	// without a timeline (the ranks exist before the tiers).
	o.OnStall = func(a shard.Access, start time.Time, waited time.Duration) {
		rec.Stall(a, start, waited)
	}
	run, err := tier.NewRunner(t.store, p, o)
	if err != nil {
		panic(fmt.Sprintf("engine: rank %d: %v", r, err)) // a fresh store, one runner per rank
	}
	return &tierRunner{Runner: run, p: p, rank: r}
}

// setBandwidth hands the planner new link bandwidths (between steps).
func (d *tierRunner) setBandwidth(bw [shard.LinkCount]float64) {
	var err error
	d.Do(func() { err = d.p.SetBandwidth(bw) })
	if err != nil {
		panic(fmt.Sprintf("engine: measured bandwidths %v: %v", bw, err)) // clamped positive and finite
	}
}

// stats returns the planner's counters and the rank's stall.
func (d *tierRunner) stats() (prefetch.Stats, [shard.TierCount]time.Duration) {
	var ps prefetch.Stats
	d.Do(func() { ps = d.p.Stats() })
	return ps, d.Stall()
}

type tierSnap struct {
	plan  []prefetch.Stats
	stall [][shard.TierCount]time.Duration
	store tier.Stats
}

// The step's calls on the tier store. A nil *tiers (no store: the
// optimizer on the device, no saved inputs offloaded) does nothing, so the
// step does not test for one.

// beginStep starts every runner's step and resets the store's peaks; the
// snapshot it returns is the previous step's end (moves between the steps
// count in this one).
func (t *tiers) beginStep() (tierSnap, error) {
	if t == nil {
		return tierSnap{}, nil
	}
	for i, d := range t.runners {
		if err := d.BeginStep(); err != nil {
			return tierSnap{}, fmt.Errorf("rank %d: %w", i, err)
		}
	}
	t.store.ResetPeaks()
	return t.last, nil
}

// stepStats is the step's figures since snap (nil without a store).
func (t *tiers) stepStats(snap tierSnap) *report.TierStats {
	if t == nil {
		return nil
	}
	ts := t.since(snap)
	return &ts
}

// markStepEnd takes the snapshot the next step's figures start from: what
// moved until now (initialisation, a restore, an evaluation) is not its.
func (t *tiers) markStepEnd() {
	if t != nil {
		t.last = t.snapshot()
	}
}

// settle waits until rank r's runner has issued and seen complete every
// move due, and returns a move's failure the rank did not wait for.
func (t *tiers) settle(r int) error {
	if t == nil {
		return nil
	}
	t.runners[r].Settle()
	return t.runners[r].Err()
}

// cycle pauses every runner (their moves in flight complete) and resumes
// them.
func (t *tiers) cycle() {
	if t != nil {
		t.pause()
		t.resume()
	}
}

func (t *tiers) snapshot() tierSnap {
	var s tierSnap
	for _, d := range t.runners {
		p, st := d.stats()
		s.plan = append(s.plan, p)
		s.stall = append(s.stall, st)
	}
	s.store = t.store.Stats()
	return s
}

// since is the step's figures from the snapshot taken at its start.
func (t *tiers) since(a tierSnap) report.TierStats {
	b := t.snapshot()
	t.last = b
	var ts report.TierStats
	for i := range b.plan {
		p := report.CountsOf(a.plan[i])
		ts.Add(report.CountsOf(b.plan[i]), &p)
		for tr := range ts.Stall {
			ts.Stall[tr] = max(ts.Stall[tr], b.stall[i][tr]-a.stall[i][tr])
		}
	}
	for l := range ts.LinkBytes {
		ts.LinkBytes[l] = b.store.Links[l].Bytes - a.store.Links[l].Bytes
		ts.LinkActive[l] = b.store.Links[l].Active - a.store.Links[l].Active
	}
	if len(t.peakHBMByDevice) < len(b.store.HBM) {
		t.peakHBMByDevice = make([]int64, len(b.store.HBM))
	}
	for i, u := range b.store.HBM {
		ts.PeakBytes[shard.HBM] = max(ts.PeakBytes[shard.HBM], u.PeakBytes)
		ts.BudgetBytes[shard.HBM] = u.BudgetBytes
		t.peakHBMByDevice[i] = max(t.peakHBMByDevice[i], u.PeakBytes)
	}
	ts.PeakBytes[shard.Host], ts.BudgetBytes[shard.Host] = b.store.Host.PeakBytes, b.store.Host.BudgetBytes
	ts.PeakBytes[shard.NVMe], ts.BudgetBytes[shard.NVMe] = b.store.NVMe.PeakBytes, b.store.NVMe.BudgetBytes
	t.peakHBM = max(t.peakHBM, ts.PeakBytes[shard.HBM])
	t.peakHost = max(t.peakHost, ts.PeakBytes[shard.Host])
	t.measureBandwidth(a.store, b.store)
	return ts
}

// measureBandwidth folds the links' traffic between two snapshots of the
// store into the measured bandwidths (prefetch.BandwidthMeter) and hands
// the planners the result.
func (t *tiers) measureBandwidth(a, b tier.Stats) {
	var bytes [shard.LinkCount]int64
	var busy [shard.LinkCount]time.Duration
	for l := range shard.LinkCount {
		bytes[l], busy[l] = b.Links[l].Bytes-a.Links[l].Bytes, b.Links[l].Busy-a.Links[l].Busy
	}
	bw, changed := t.bw.Add(t.popts.BandwidthBytesPerSec, bytes, busy)
	if !changed {
		return
	}
	t.popts.BandwidthBytesPerSec = bw
	for _, d := range t.runners {
		d.setBandwidth(bw)
	}
}

// tierWriteBehindDepth is how many write-behinds (dirty copies copied to
// their home ahead of eviction) the planner keeps in flight per link: the
// optimizer writes every param and, on NVMe, its master/m/v faster than
// one write at a time drains them.
const tierWriteBehindDepth = 4
