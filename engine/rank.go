package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/engine/report"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/timeline"
)

// rank is one device's share of the run: its streams, its model
// (activations), its model state and its Params hooks. All of a rank's
// methods run on one goroutine at a time.
//
// Streams: s runs the model and the device optimizer; cs runs every
// collective, so that collectives are issued to the Comm in one program
// order on every rank; up and down copy between host and device (the new
// params of the host optimizer up, the reduced gradients and the norms
// down), so that no copy queues behind a collective's wait and no
// collective behind a copy. Events order them: a gather before the layer
// that reads it, a reduction after the layer that wrote the gradient, a
// gradient's download after its reduction, an upload before the gather
// that reads it, the next step's reads of a chunk after its update
// (paramReady, per chunk, so the next forward waits for one chunk's
// update, not for the whole optimizer), and a workspace slot's next
// holder after its last holder's last use (workspace.go).
type rank struct {
	e        *Engine
	idx      int // the global rank: its shard, its rows of the batch
	loc      int // its index in this process (Options.Procs): the tier store's rank, the staging's
	dev      gpu.Device
	ops      gpu.Ops
	comm     gpu.Comm
	s, cs    gpu.Stream
	up, down gpu.Stream
	model    Instance // the model's passes and activations on this device
	st       *devState
	h        *hooks
	rings    rings // the workspace, taken at New (workspace.go)
	// remScratch is where a remainder master's checkpoint save and
	// restore join and split a chunk (remainder.go): one buffer for every
	// chunk, taken at the first use at the largest chunk's size (remBuf,
	// remScratchBytes), so that a streamed checkpoint allocates it once.
	remScratch []byte

	norms     gpu.Buffer // F64, one per chunk: the sum of squares of this rank's reduced gradient
	normsHost []byte
	losses    []float64
	// routerLosses are the micro-batches' load-balancing losses, when the
	// model is a mixture of experts (routerLosser).
	routerLosses []float64
	batches      []model.Batch // this step's micro-batches (Engine.readBatches)
	paramReady   []gpu.Event   // per chunk: the last write of its parameters
	leased       []*pinned.Buffer
	ws           workspaceStats
	liveGrads    []liveGrad
	tr           *timeline.Recorder  // the timeline (Options.Trace) and the host optimizer's overlap log; nil: neither
	run          *pendingUpdate      // the pending host update (exact overlap); nil: none
	hostFig      report.HostOptStats // the host optimizer's figures taken in this step (takeHostOpt)
	next         *pendingUpdate      // the update of the step running, chunks handed during its backward (overlap_bwd.go); nil: none
	undo         [][]byte            // per chunk: master, m and v before the update of the backward
	bwdChunks    int                 // chunks updated during a backward so far
	// The speculation of the update during the backward (backwardUpdate):
	// clipped says the last step was clipped, so this one does not begin
	// its update in the backward; bwdSteps counts the steps that began it
	// there, bwdRedos those of them clipped, undone and updated again.
	clipped            bool
	bwdSteps, bwdRedos int64
	// frozenGrad is the gradient buffer every frozen chunk's Grad returns
	// (freeze.go): the largest frozen chunk, written only by the norms'
	// gain gradients (model.FrozenParams) and never read; nil with
	// nothing frozen.
	frozenGrad gpu.Buffer
	// routeBuf and routeHost carry a sparse layer's routed experts (one
	// F32 flag each) through the ranks' AllReduce (moe.go); nil on one
	// rank or without experts.
	routeBuf  gpu.Buffer
	routeHost []byte
	// reductions counts, per chunk, the gradient collectives (AllReduce,
	// ReduceScatter) the rank has issued for it.
	reductions []int64
	// gradSlot is, per chunk, the gradient ring's slot of its shard while
	// it is on the device (gradTiered engines).
	gradSlot []int
}

// liveGrad is a reduced gradient shard on the device, in slot of the
// rank's gradient ring, whose copy to the tier store (ev, on down; nil:
// none) may still run (gradTiered engines).
type liveGrad struct {
	buf  gpu.Buffer
	ev   gpu.Event
	slot int
}

// allocGrad takes chunk c's gradient shard for its reduction from the
// rank's gradient ring (gradTiered engines: the tier store holds it between
// steps), and makes cs, where the reduction writes it, wait for the slot's
// last use. With one micro-batch per step the ring has two slots: the
// oldest live shard gives its slot back first, with its copy as its last
// use.
func (r *rank) allocGrad(c int) error {
	if r.e.accum == 1 {
		for len(r.liveGrads) >= 2 {
			r.retireGrad(0)
		}
	}
	slot, buf, after, err := r.rings.grads.take(r.e.chunks[c].shard)
	if err != nil {
		return fmt.Errorf("chunk %d grad shard: %w", c, err)
	}
	if after != nil {
		r.cs.Wait(after)
	}
	r.ws.bucketBytes += buf.Bytes()
	r.ws.bucketPeakBytes = max(r.ws.bucketPeakBytes, r.ws.bucketBytes)
	r.st.grad[c] = buf
	r.gradSlot[c] = slot
	return nil
}

// retireGrad gives the i-th live gradient shard's slot back, its copy to
// the tier store as its last use.
func (r *rank) retireGrad(i int) {
	g := r.liveGrads[i]
	r.ws.bucketBytes -= g.buf.Bytes()
	r.rings.grads.put(g.slot, g.ev)
	r.liveGrads = append(r.liveGrads[:i], r.liveGrads[i+1:]...)
}

// freeGrads gives back every live gradient shard (the streams have
// completed).
func (r *rank) freeGrads() {
	for len(r.liveGrads) > 0 {
		r.retireGrad(0)
	}
	r.settleRings()
}

// runner is the rank's handle on the tier runtime (host optimizer only).
func (r *rank) runner() *tierRunner { return r.e.tiers.runners[r.loc] }

// workspaceStats count the engine's own transient device memory.
type workspaceStats struct {
	gatheredBytes, gatheredPeakBytes int64 // stage 3: gathered chunks in flight
	bucketBytes, bucketPeakBytes     int64 // stages 2-3: full gradient buckets and reduce shards in flight
}

func newRank(e *Engine, idx, loc int, dev gpu.Device, comm gpu.Comm) (*rank, error) {
	r := &rank{e: e, idx: idx, loc: loc, dev: dev, ops: dev.Ops(), comm: comm, s: dev.NewStream(), cs: dev.NewStream(), up: dev.NewStream(), down: dev.NewStream()}
	var err error
	if r.st, err = newDevState(e, idx, dev); err != nil {
		return nil, fmt.Errorf("engine: rank %d: %w", idx, err)
	}
	if r.model, err = e.model.New(dev, e.micro, e.seq); err != nil {
		r.st.free()
		return nil, fmt.Errorf("engine: rank %d: %w", idx, err)
	}
	if r.norms, err = dev.Alloc(len(e.chunks), gpu.F64, gpu.Tag{Kind: gpu.Workspace, Purpose: "grad norms"}); err != nil {
		r.model.Free()
		r.st.free()
		return nil, fmt.Errorf("engine: rank %d: grad norms: %w", idx, err)
	}
	if n := e.frozenGradElems(); n > 0 {
		if r.frozenGrad, err = dev.Alloc(n, e.precision, gpu.Tag{Kind: gpu.Workspace, Purpose: "frozen grad scratch"}); err != nil {
			r.dev.Free(r.norms)
			r.model.Free()
			r.st.free()
			return nil, fmt.Errorf("engine: rank %d: gradient scratch of the frozen chunks: %w", idx, err)
		}
	}
	if sh := e.layout.Shape; e.n > 1 && sh.MoE() { // the ranks' union of their routed experts (moe.go)
		if r.routeBuf, err = dev.Alloc(sh.Experts, gpu.F32, gpu.Tag{Kind: gpu.Workspace, Purpose: "expert routes"}); err != nil {
			r.freeScratch()
			r.dev.Free(r.norms)
			r.model.Free()
			r.st.free()
			return nil, fmt.Errorf("engine: rank %d: the experts' routes: %w", idx, err)
		}
		r.routeHost = make([]byte, 4*sh.Experts)
	}
	r.reductions = make([]int64, len(e.chunks))
	r.gradSlot = make([]int, len(e.chunks))
	r.normsHost = make([]byte, 8*len(e.chunks))
	r.paramReady = make([]gpu.Event, len(e.chunks))
	for c := range r.paramReady {
		r.paramReady[c] = dev.NewEvent()
	}
	r.h = newHooks(r)
	if e.opts.Trace != nil || e.offload {
		if r.tr, err = timeline.NewRecorder(e.opts.Trace, e, idx, dev, e.t0); err != nil {
			r.freeScratch()
			r.dev.Free(r.norms)
			r.model.Free()
			r.st.free()
			return nil, err
		}
	}
	return r, nil
}

// initBufs are a rank's host buffers for initParams: the encoded values
// its uploads read (kept until the chunk's uploads are waited for) and
// those the tier store copies, reused chunk after chunk, so that
// initialising makes no garbage per chunk.
type initBufs struct{ param, master, tier []byte }

// load enqueues the upload of chunk c's initial values (padded to N·S) into
// this rank's device params and optimizer state; initTiers writes those the
// tier store holds.
func (r *rank) load(c int, padded []float32, b *initBufs) {
	e, st := r.e, r.st
	s := e.chunks[c].shard
	switch {
	case st.paramIsFull(c):
		b.param = encodeInto(b.param, padded, e.precision)
		r.dev.CopyHostToDevice(r.s, st.param[c], 0, b.param)
	case st.param[c] != nil:
		b.param = encodeInto(b.param, padded[r.idx*s:(r.idx+1)*s], e.precision)
		r.dev.CopyHostToDevice(r.s, st.param[c], 0, b.param)
	}
	if st.master[c] != nil {
		off, n := e.optOffset(c, r.idx), e.optElems(c)
		b.master = encodeInto(b.master, padded[off:off+n], gpu.F32)
		r.dev.CopyHostToDevice(r.s, st.master[c], 0, b.master)
	}
}

// initParams initialises every chunk on every rank, one chunk at a time:
// from Options.Init when set (an imported model; LoRA's adapter chunks
// from Options.InitAdapters, else from Model.InitChunk: no base model has
// them), else Model.InitChunk with strata.seed. Each chunk's uploads are waited for before the next
// chunk is read into the same buffers, so host memory holds one padded
// chunk and each rank's encoded shards of it, whatever the model's size,
// and the weights go to every rank's shards wherever they live: device
// buffers, the tier store's host copies, NVMe.
func (e *Engine) initParams() error {
	most := 0
	for _, p := range e.chunks {
		most = max(most, e.n*p.shard)
	}
	// Two buffers: chunk c+1's values are drawn (or read) by a goroutine
	// while the ranks store chunk c's (quantizing, writing to the tiers).
	// Each chunk's values depend only on (seed, c), so the order is free.
	bufs2 := [2][]float32{make([]float32, most), make([]float32, most)}
	fill := func(c int, buf []float32) error {
		p := e.chunks[c]
		padded := buf[:e.n*p.shard]
		vals := padded[:e.layout.Chunks[c].Len]
		src := e.opts.Init
		if e.layout.IsAdapter(c) {
			src = e.opts.InitAdapters
		}
		if src != nil {
			if err := src.ReadChunk(c, vals); err != nil {
				return fmt.Errorf("engine: initial weights of chunk %d (%s): %w", c, e.layout.Chunks[c].Name, err)
			}
		} else {
			e.model.InitChunk(e.cfg.Strata.Seed, c, vals)
		}
		clear(padded[len(vals):])
		return nil
	}
	bufs := make([]initBufs, len(e.ranks))
	next := make(chan error, 1)
	if len(e.chunks) > 0 {
		go func() { next <- fill(0, bufs2[0]) }()
	}
	for c, p := range e.chunks {
		if err := <-next; err != nil {
			return err // nothing was started for c+1
		}
		padded := bufs2[c%2][:e.n*p.shard]
		if c+1 < len(e.chunks) {
			go func() { next <- fill(c+1, bufs2[(c+1)%2]) }()
		}
		for i, r := range e.ranks {
			r.load(c, padded, &bufs[i])
			if err := r.initTiers(c, padded, &bufs[i]); err != nil {
				if c+1 < len(e.chunks) {
					<-next
				}
				return err
			}
		}
		if err := e.parallel(func(r *rank) error { return r.sync() }); err != nil {
			if c+1 < len(e.chunks) {
				<-next // the next chunk's fill ends before its buffer is dropped
			}
			return err
		}
	}
	return nil
}

// initTiers writes chunk c's initial param shard (offload_param) and
// master weights to their homes in the tier store (m, v and the gradient
// start as the zeros of Register); a remainder master's params go where
// cpuadam reads them (remainder.go).
func (r *rank) initTiers(c int, padded []float32, b *initBufs) error {
	e := r.e
	if !e.offload {
		return nil // no model state in the tier store
	}
	if e.paramTiered(c) {
		s := e.chunks[c].shard
		vals := padded[r.idx*s : (r.idx+1)*s]
		if dt := e.paramCode(c); dt != 0 { // quantized once, here, from the initial fp32 values
			b.tier = quantize(dt, vals)
		} else {
			b.tier = encodeInto(b.tier, vals, e.precision)
		}
		if err := e.tiers.initShard(tkey(c, r.loc, shard.Param), b.tier); err != nil {
			return err
		}
	}
	off, n := e.optOffset(c, r.idx), e.optElems(c)
	masters := e.masters
	if e.isFrozen(c) {
		masters = fp32Master{} // no update: a frozen chunk's master stays fp32
	}
	return masters.init(r, c, padded[off:off+n], &b.tier) // the store's errors name the shard
}

// sync waits for the rank's streams, returns their first error and ends
// the leases of the pinned buffers they used.
func (r *rank) sync() error {
	var err error
	for _, s := range r.streams() {
		if err2 := s.Synchronize(); err == nil {
			err = err2
		}
	}
	for _, b := range r.leased {
		b.Release()
	}
	r.leased = r.leased[:0]
	return err
}

// streams are the rank's streams: compute, collectives, uploads, downloads.
func (r *rank) streams() []gpu.Stream { return []gpu.Stream{r.s, r.cs, r.up, r.down} }

// after makes stream to wait for the work enqueued on from so far.
func (r *rank) after(to, from gpu.Stream) {
	ev := r.dev.NewEvent()
	from.Record(ev)
	to.Wait(ev)
}

func (r *rank) lease(b *pinned.Buffer) {
	b.Lease()
	r.leased = append(r.leased, b)
}

// backward runs the rank's A micro-batches of step (forward, backward,
// loss), the gradient reductions (enqueued by the hooks as each chunk's
// gradient is final) and the norms of the reduced gradient, and waits for
// all of it. A hook's failure stops the rank's pass, but not its
// collectives: the hooks drain the rest of the step's (see hooks), and the
// failure is returned at the end, before any update.
func (r *rank) backward(step int64) error {
	e := r.e
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	r.losses, r.routerLosses = r.losses[:0], r.routerLosses[:0]
	r.tr.StepBegin(step)
	e.grads.zero(r)
	scale := float32(e.LossScale() / float64(e.n*e.accum)) // fp16: the loss scaled (fp16.go)
	for k := range e.accum {
		r.h.begin(k, k == e.accum-1)
		if r.h.err == nil {
			b := r.batches[k]
			if err := r.model.Forward(r.s, r.h, b); err == nil {
				err = r.model.Backward(r.s, r.h, scale)
				keep(r.loss(err != nil)) // also after a failed backward: no loss stays pending
			}
		}
		r.h.drain(r.s)
		r.h.end()
	}
	// The previous step's host update is flushed by now (every chunk is
	// acquired in forward); a failed pass flushes the rest here, in the
	// same order on every rank.
	keep(r.finishRun())
	r.after(r.down, r.cs) // the norms are summed on cs
	if t := e.tiers; t != nil {
		r.lease(t.norms[r.loc]) // pinned (host optimizer): registered with the devices
	}
	r.dev.CopyDeviceToHost(r.down, r.normsHost, r.norms, 0)
	keep(r.sync())
	r.hostFig.Add(r.takeHostOpt())
	r.h.freeAll()
	r.freeGrads()
	// A move that failed during the pass (one the rank did not wait for)
	// fails the step here, before any rank updates.
	keep(e.tiers.settle(r.loc))
	if err := r.h.takeErr(); err != nil {
		return err // the cause; what followed from it is secondary
	}
	return first
}

// loss reads the loss of the micro-batch just run into r.losses; after a
// failed pass (failed) it only takes it off the model (the step's error is
// the hook's).
func (r *rank) loss(failed bool) error {
	ls, err := r.model.Losses(r.s)
	if failed {
		return nil
	}
	if err != nil {
		return err
	}
	if len(ls) != 1 {
		return fmt.Errorf("engine: rank %d: the model gave %d losses for one micro-batch (Instance.Losses returns one per Forward)", r.idx, len(ls))
	}
	if rl, ok := r.model.(routerLosser); ok { // the step's loss is the objective: the router's in it
		aux := rl.RouterLoss()
		r.routerLosses = append(r.routerLosses, aux)
		ls[0] = r.e.layout.Shape.Objective(ls[0], aux)
	}
	r.losses = append(r.losses, ls[0])
	return nil
}

// routerLosser is the optional interface of an Instance that is a mixture
// of experts: the load-balancing loss of the micro-batch whose loss
// Losses just read (model.Model.RouterLoss).
type routerLosser interface{ RouterLoss() float64 }

// reduced is called on the communication stream's program once chunk c's
// gradient is final on this rank (after the last micro-batch's
// reduction): its sum of squares, then what the updater does with it
// (the host optimizer's copy to the tier store, gradToHost: from there
// the store spills it to NVMe when the host budget is full). After a
// failure (failed) it only gives up the rank's gradient shard.
func (r *rank) reduced(c int, failed bool) error {
	if failed {
		if r.e.gradTiered && r.st.grad[c] != nil {
			r.liveGrads = append(r.liveGrads, liveGrad{buf: r.st.grad[c], slot: r.gradSlot[c]})
			r.st.grad[c] = nil
		}
		return nil
	}
	g := r.st.gradShard(c)
	name := r.e.layout.Chunks[c].Name
	from := r.tr.Mark(r.cs)
	if f := r.e.gradFault; f != nil && f(r.idx, c) {
		r.ops.Fill(r.cs, g, float32(math.NaN())) // tests: a non-finite gradient on one rank
	}
	r.ops.SumSquares(r.cs, g, r.norms, c)
	r.tr.Comm(from, r.tr.Mark(r.cs), timeline.Label{Op: "grad norm", Chunk: name, Index: c})
	return r.e.upd.reduced(r, c, g)
}

// gradToHost copies chunk c's reduced gradient shard g to its host copy in
// the tier store (a Write access in backward) once the pending update has
// read the last one, and returns the copy's event (nil when the access
// failed: the error).
func (r *rank) gradToHost(c int, g gpu.Buffer) (gpu.Event, error) {
	name := r.e.layout.Chunks[c].Name
	var from gpu.Event
	r.waitGrad(c) // the pending update has read the gradient's host copy
	l, err := r.runner().Use(shard.Access{Key: tkey(c, r.loc, shard.Grad), Phase: shard.Backward, Tier: shard.Host, Kind: shard.Write})
	if err == nil {
		r.after(r.down, r.cs) // the reduction
		from = r.tr.Mark(r.down)
		r.dev.CopyDeviceToHost(r.down, l.Bytes(), g, 0)
	}
	ev := r.dev.NewEvent()
	r.down.Record(ev)
	if err == nil {
		r.tr.Copy(from, ev, timeline.Label{Op: "grad to host", Chunk: name, Index: c})
	}
	if l != nil {
		r.runner().Done(l, ev)
	}
	if r.e.gradTiered { // off the device once copied
		r.liveGrads = append(r.liveGrads, liveGrad{buf: g, ev: ev, slot: r.gradSlot[c]})
		r.st.grad[c] = nil
	}
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// normSq is this rank's sum of squares of chunk c's reduced gradient, as
// the last backward left it.
func (r *rank) normSq(c int) float64 { return f64s(r.normsHost)[c] }

// stepHost runs cpuadam on chunk c's shard with master, m, v and the
// reduced gradient leased in host memory from the tier store (the planner
// has read them ahead; it writes them behind), writing the new params into
// their host copy in the store (offload_param) or into the chunk's pinned
// upload staging (tiers.upload), which update copies to the device. The
// serial schedule; updateExact runs the same two halves apart.
func (r *rank) stepHost(c int, cp cpuadam.Params) error {
	ls, err := r.leaseHost(c, true)
	if err == nil {
		err = r.await(&ls)
	}
	if err != nil {
		return err
	}
	r.adamHost(c, cp, ls)
	r.doneLeases(ls)
	return nil
}

func (r *rank) close() error {
	err := r.sync()
	r.tr.Close()
	r.h.freeAll()
	r.freeGrads()
	r.releaseRings()
	r.freeScratch()
	r.model.Free()
	r.dev.Free(r.norms)
	r.st.free()
	return err
}

// upload enqueues chunk c's new param shard's copy from its pinned upload
// staging to the device on up, when updated (else only the event), and
// records paramReady[c] there; a gather of the new slices (cs) waits for
// it.
func (r *rank) upload(c int, updated bool) {
	e := r.e
	from := r.tr.Mark(r.up)
	if updated {
		r.lease(e.tiers.upload[r.loc][c])
		r.dev.CopyHostToDevice(r.up, r.st.paramShard(c), 0, e.tiers.uploadBytes(r.loc, c))
	}
	r.up.Record(r.paramReady[c])
	r.tr.Copy(from, r.tr.Mark(r.up), timeline.Label{Op: "upload", Chunk: e.layout.Chunks[c].Name, Index: c})
}

// freeScratch frees the frozen chunks' gradient scratch and the experts'
// routes buffer (the streams that used them have completed).
func (r *rank) freeScratch() {
	if r.frozenGrad != nil {
		r.dev.Free(r.frozenGrad)
		r.frozenGrad = nil
	}
	if r.routeBuf != nil {
		r.dev.Free(r.routeBuf)
		r.routeBuf = nil
	}
}

// errAccessOrder is the panic of a Params call out of Model.AccessOrder.
var errAccessOrder = errors.New("engine: model called Params out of Model.AccessOrder")
