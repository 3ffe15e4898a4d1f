package engine

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
	"github.com/strata-ai/strata/timeline"
)

// hooks are a rank's model.Params (and, with cpu_checkpointing, its
// model.InputStore: inputs.go): the single place where a chunk is
// gathered before its use and released after it (stage 3), and where a
// chunk's gradient is handed out and reduced when it is ready (all
// stages). The model calls them in Model.AccessOrder, from the rank's
// goroutine; every decision that issues a collective depends only on that
// order, never on timing, so all ranks issue the same collectives.
//
// Memory. Gathered chunks, gradient buckets, reduce shards and the
// gradient shards bound for the tier store come from the rank's rings
// (workspace.go), taken at New: a hook takes a slot and gives it back with
// the event of its last use, and the slot's next holder waits for it on
// its own stream. No hook allocates or frees device memory.
//
// Errors. A hook that fails (a tier fetch or write that failed; a ring
// that must grow past what New took and finds no device memory) returns
// the error, and the model stops the pass. The peers go on with the pass
// and would wait forever in a collective the failed rank never issues, so
// the failed rank keeps issuing the same collectives to the end of the
// step: at the failure it waits for its streams, gives back its gathered
// chunks and buckets, and from then on every hook only keeps the
// bookkeeping that decides the collectives (which chunks are live, which
// buckets wait) and issues each collective on a scratch buffer of the
// right size (a slot of a ring the failure just emptied; scratchPair) —
// stages 0-1 reduce the rank's own gradient buffers in place, which the
// next step zeroes first — and
// drain makes the calls the model no longer makes, in
// Model.AccessOrder, for the rest of the micro-batch, and the rank drains
// its later micro-batches the same way. The rank then returns the error;
// the step ends before the optimizer, so nothing is updated, and every
// rank's state is ready for the next step.
type hooks struct {
	r     *rank
	order []model.Access // this micro-batch's calls: full, or fwd for Eval
	full  []model.Access // a training micro-batch's calls (Model.AccessOrder)
	fwd   []model.Access // a forward-only micro-batch's calls (Eval): full's forward part
	pos   int            // index of the next call in order
	micro int            // micro-batch index within the step
	last  bool           // the step's last micro-batch

	// stage 3: gathered chunks, at most Options.MaxLiveChunks, and the
	// last uses of those released, oldest first, not yet waited for
	// (throttle)
	live   map[int]*gathered
	relSeq int
	relQ   []gpu.Event

	// stages 2-3: full gradient buckets being accumulated, and those whose
	// reduction is enqueued (their slots go back, with the reduction as
	// their last use, when the next bucket needs room)
	buckets map[int]*bucket
	pending []*bucket

	err     error      // the step's first failure: the hooks only drain (see above)
	scratch gpu.Buffer // the failed step's collectives' buffer; nil until needed

	// cpu_checkpointing (inputs.go): the restored block inputs in use, by
	// block, leased from the tier store until ReleaseInput, and the copies
	// of the saved ones to host memory not yet waited for.
	inputs map[int]*tier.Lease
	saved  map[int]gpu.Event

	// a mixture of experts (moe.go): each chunk's (layer, expert), and
	// per layer the experts this micro-batch acquires once its forward
	// has routed them (routed), and the calls of the experts it skips
	// whose tier-store skip is made already (passed, by index in order)
	experts []expertRef
	acquire [][]bool
	routed  []bool
	passed  map[int]bool
}

// gathered is a chunk gathered on the device, in a slot of the rank's
// gathered ring; after a failure its buffer and events are nil (the entry
// only keeps the bookkeeping).
type gathered struct {
	buf      gpu.Buffer // N·S elements of the slot
	slot     int
	ready    gpu.Event // the AllGather into buf (on cs)
	released bool
	relEv    gpu.Event // the last use, on s
	relSeq   int
}

// bucket is a full gradient buffer, in a slot of the rank's bucket ring;
// after a failure its buffers and event are nil.
type bucket struct {
	c        int
	full     gpu.Buffer // N·S elements of the slot
	tmp      gpu.Buffer // the reduced shard of a micro-batch after the first (A > 1), in a reduce ring slot; nil else
	fullSlot int
	tmpSlot  int
	done     gpu.Event // the reduction (on cs)
	bytes    int64
}

func newHooks(r *rank) *hooks {
	full := r.e.order
	n := 0
	for n < len(full) && full[n].Pass == shard.Forward {
		n++
	}
	h := &hooks{r: r, order: full, full: full, fwd: full[:n], live: map[int]*gathered{}, buckets: map[int]*bucket{},
		inputs: map[int]*tier.Lease{}, saved: map[int]gpu.Event{}}
	h.initExperts()
	return h
}

// begin starts micro-batch k of a step.
func (h *hooks) begin(k int, last bool) {
	h.order, h.micro, h.last, h.pos = h.full, k, last, 0
	h.newRoutes()
}

// beginEval starts a forward-only micro-batch (Eval): the forward's calls.
func (h *hooks) beginEval() {
	h.order, h.micro, h.last, h.pos = h.fwd, 0, false, 0
	h.newRoutes()
}

// next checks that a is the call Model.AccessOrder lists next and moves on.
func (h *hooks) next(a model.Access) {
	if h.pos >= len(h.order) || h.order[h.pos] != a {
		panic(fmt.Sprintf("%v: call %d is %v", errAccessOrder, h.pos, a))
	}
	h.pos++
}

// end checks that the micro-batch made every call; after the last one it
// leaves nothing to do but wait.
func (h *hooks) end() {
	if h.pos != len(h.order) {
		panic(fmt.Sprintf("%v: %d of %d calls", errAccessOrder, h.pos, len(h.order)))
	}
	if len(h.buckets) != 0 {
		panic(fmt.Sprintf("engine: %d gradient buckets never got GradReady", len(h.buckets)))
	}
}

// drain makes the rest of the micro-batch's calls after a failure, as the
// model would have made them, so that the rank issues every collective its
// peers issue; nothing when the micro-batch made every call.
func (h *hooks) drain(s gpu.Stream) {
	if h.pos < len(h.order) && h.err == nil {
		panic(fmt.Sprintf("engine: drain of a micro-batch that did not fail, at call %d of %d", h.pos, len(h.order)))
	}
	for h.pos < len(h.order) {
		a := h.order[h.pos]
		switch a.Kind {
		case model.AccessAcquire:
			if h.drainSkips(s, a) {
				continue
			}
			h.Acquire(s, a.Chunk, a.Pass)
		case model.AccessRelease:
			h.Release(s, a.Chunk, a.Pass)
		case model.AccessGrad:
			h.Grad(s, a.Chunk)
		case model.AccessGradReady:
			h.GradReady(s, a.Chunk)
		case model.AccessSaveInput:
			h.SaveInput(s, a.Chunk-1, nil)
		case model.AccessRestoreInput:
			h.RestoreInput(s, a.Chunk-1)
		case model.AccessReleaseInput:
			h.ReleaseInput(s, a.Chunk-1)
		}
	}
}

// fail records the step's first failure: it waits for the rank's streams
// (every collective on them is one the peers issue too, so they complete)
// and gives back the gathered chunks and buckets, keeping their entries.
func (h *hooks) fail(err error) {
	if h.err != nil {
		panic(fmt.Sprintf("engine: rank %d: a hook failed after the step failed: %v", h.r.idx, err))
	}
	h.err = err
	r := h.r
	for _, s := range r.streams() {
		s.Synchronize() // its error, if any, is a consequence: the step returns err
	}
	r.tr.Drop()
	for _, g := range h.live {
		h.dropGathered(g)
	}
	for _, b := range h.buckets {
		h.dropBucket(b)
	}
	for _, b := range h.pending {
		h.dropBucket(b)
	}
	r.settleRings()
	h.dropInputs()
}

// takeErr returns the step's failure and clears it for the next step.
func (h *hooks) takeErr() error {
	err := h.err
	h.err = nil
	return err
}

// scratchPair is a failed step's buffers for a collective over a chunk of
// shardElems elements per rank: N·shardElems elements of one scratch buffer
// and the rank's slice of them (in place, as NCCL allows). The scratch is a
// slot the failure has just given back: at stage 3 of the gathered ring
// (the largest chunk), at stage 2 of the bucket ring (the largest
// trainable chunk, all a reduction needs). The failed step gathers and
// buckets nothing else.
func (h *hooks) scratchPair(shardElems int) (slice, full gpu.Buffer) {
	r := h.r
	if h.scratch == nil {
		h.scratch = r.rings.scratch.slot(0)
	}
	return h.scratch.Slice(r.idx*shardElems, shardElems), h.scratch.Slice(0, r.e.n*shardElems)
}

// Frozen implements model.FrozenParams: the backward of a frozen chunk
// (strata.freeze, LoRA's base) skips its weight gradients.
func (h *hooks) Frozen(c int) bool { return h.r.e.isFrozen(c) }

// Acquire implements model.Params.
func (h *hooks) Acquire(s gpu.Stream, c int, pass shard.Phase) (gpu.Buffer, error) {
	r := h.r
	h.next(model.Access{Kind: model.AccessAcquire, Chunk: c, Pass: pass})
	n := r.e.chunks[c].len
	if r.st.paramIsFull(c) {
		r.flushChunk(c) // the previous step's update of c, also after a failure
		if h.err != nil {
			return nil, h.err
		}
		s.Wait(r.paramReady[c])
		h.traceBegin(s)
		return r.st.paramFull(c).Slice(0, n), nil
	}
	h.throttle()
	g := h.live[c]
	if g == nil {
		g = h.gather(c, pass)
	}
	g.released = false
	if h.err == nil {
		s.Wait(g.ready)
		h.traceBegin(s)
	}
	// Prefetch the next chunk this micro-batch acquires, unless its
	// pending update (exact overlap) is still in cpuadam: waiting for it
	// here would hold back this chunk's compute. Either way the gather is
	// issued before any other collective (in a forward only gathers
	// follow), so every rank issues the same sequence. With offloaded
	// param shards and saved inputs in the tier store (cpu_checkpointing)
	// the gather's access must keep its place among the saved inputs'
	// accesses, step after step, or the planner's trace diverges: it is
	// always issued here, waiting for the update if need be.
	h.prefetchNext()
	if h.err != nil {
		return nil, h.err
	}
	return g.buf.Slice(0, n), nil
}

// prefetchNext gathers the next chunk the micro-batch acquires (see
// Acquire), after the tier-store skips of the experts it skips before it
// (passOver).
func (h *hooks) prefetchNext() {
	r := h.r
	if next, i, ok := h.nextAcquire(); ok && !r.st.paramIsFull(next.Chunk) && h.live[next.Chunk] == nil && (r.updateReady(next.Chunk) || h.fixedOrder()) {
		h.passOver(i)
		h.gather(next.Chunk, next.Pass)
	}
}

// throttle keeps the rank at most MaxLiveChunks gathered chunks ahead of
// the device, as PyTorch FSDP's limit_all_gathers: before acquiring a
// chunk it waits until the compute of the one acquired MaxLiveChunks
// before has completed (the device still has the chunk in between to
// run, so it does not go idle). Further ahead, the rank would lease the
// next param shards in HBM long before the device reads them, holding the
// room the planner stages the following ones into: the accesses would
// wait for room (misses) while the device was busy.
func (h *hooks) throttle() {
	for len(h.relQ) >= h.r.e.opts.MaxLiveChunks {
		h.relQ[0].Synchronize()
		h.relQ[0] = nil
		h.relQ = h.relQ[1:]
	}
}

// fixedOrder says whether the gathers' tier accesses must come in the same
// order every step: param shards and saved inputs both in the tier store.
func (h *hooks) fixedOrder() bool { return h.r.e.act.Offload && h.r.e.paramTier != shard.HBM }

// nextAcquire is the next Acquire of the micro-batch after the current
// call, and its index in order: the experts the micro-batch skips passed
// over; none when the next is an expert not routed yet (the router
// decides whether it comes).
func (h *hooks) nextAcquire() (model.Access, int, bool) {
	for i := h.pos; i < len(h.order); i++ {
		a := h.order[i]
		if a.Kind != model.AccessAcquire {
			continue
		}
		if x := h.experts[a.Chunk]; x.layer >= 0 {
			if !h.routed[x.layer] {
				return model.Access{}, 0, false
			}
			if !h.acquire[x.layer][x.e] {
				continue
			}
		}
		return a, i, true
	}
	return model.Access{}, 0, false
}

// gather enqueues the AllGather of chunk c's shards into a slot of the
// gathered ring on the communication stream, after making room (the slot's
// last reads, on s, come first). A failure (here or before) gathers on the
// scratch buffer instead.
func (h *hooks) gather(c int, pass shard.Phase) *gathered {
	r := h.r
	r.flushChunk(c) // the previous step's update of c, also after a failure
	for len(h.live) >= r.e.opts.MaxLiveChunks {
		if !h.evictOldest() {
			break
		}
	}
	p := r.e.chunks[c]
	g := &gathered{}
	var after gpu.Event
	if h.err == nil {
		slot, buf, ev, err := r.rings.gathered.take(r.e.n * p.shard)
		if err != nil {
			h.fail(fmt.Errorf("gather chunk %d param (%s): %w", c, pass, err))
		} else {
			g.buf, g.slot, after = buf, slot, ev
			r.ws.gatheredBytes += buf.Bytes()
			r.ws.gatheredPeakBytes = max(r.ws.gatheredPeakBytes, r.ws.gatheredBytes)
		}
	}
	var src gpu.Buffer
	var lease *tier.Lease
	if h.err == nil {
		if after != nil {
			r.cs.Wait(after)
		}
		r.cs.Wait(r.paramReady[c])
		var err error
		if src, lease, err = p.path.source(r, c, pass); err != nil {
			h.fail(err)
			h.dropGathered(g) // not live yet: fail did not free it
		}
	}
	h.live[c] = g
	if h.err != nil {
		slice, full := h.scratchPair(p.shard)
		r.comm.AllGather(r.cs, slice, full)
		return g
	}
	from := r.tr.Mark(r.cs)
	r.comm.AllGather(r.cs, src, g.buf)
	g.ready = r.dev.NewEvent()
	r.cs.Record(g.ready)
	r.tr.Comm(from, g.ready, timeline.Label{Op: "allgather", Chunk: r.e.layout.Chunks[c].Name, Note: pass.String(), Pass: pass.String(), Index: c})
	if lease != nil {
		r.runner().Done(lease, g.ready)
	}
	return g
}

// evictOldest gives back the slot of the gathered chunk released longest
// ago, with its last use (the next gather into it waits for it on cs);
// false when every live chunk is in use.
func (h *hooks) evictOldest() bool {
	victim := -1
	for c, g := range h.live {
		if g.released && (victim < 0 || g.relSeq < h.live[victim].relSeq) {
			victim = c
		}
	}
	if victim < 0 {
		return false
	}
	h.freeGathered(victim)
	return true
}

func (h *hooks) freeGathered(c int) {
	h.dropGathered(h.live[c])
	delete(h.live, c)
}

// dropGathered gives g's slot back, with its last use (the release on s,
// or the gather when it was never acquired), and keeps the entry.
func (h *hooks) dropGathered(g *gathered) {
	if g.buf != nil {
		h.r.ws.gatheredBytes -= g.buf.Bytes()
		last := g.relEv
		if last == nil {
			last = g.ready
		}
		h.r.rings.gathered.put(g.slot, last)
	}
	g.buf, g.ready, g.relEv = nil, nil, nil
}

// traceBegin opens the compute span of the chunk just acquired on s.
func (h *hooks) traceBegin(s gpu.Stream) {
	h.r.tr.Begin(s)
}

// Release implements model.Params.
func (h *hooks) Release(s gpu.Stream, c int, pass shard.Phase) {
	h.next(model.Access{Kind: model.AccessRelease, Chunk: c, Pass: pass})
	h.r.tr.End(s, timeline.Label{Op: pass.String(), Chunk: h.r.e.layout.Chunks[c].Name, Pass: pass.String(), Index: c, Micro: h.micro, HasMicro: true})
	g := h.live[c]
	if g == nil {
		return // resident: nothing to give back
	}
	g.released = true
	if h.err == nil {
		g.relEv = h.r.dev.NewEvent()
		s.Record(g.relEv)
		h.relQ = append(h.relQ, g.relEv)
	}
	h.relSeq++
	g.relSeq = h.relSeq
}

// Grad implements model.Params: where chunk c's gradient of the
// micro-batch goes is the stage's (gradPath.buffer).
func (h *hooks) Grad(s gpu.Stream, c int) (gpu.Buffer, error) {
	r := h.r
	h.next(model.Access{Kind: model.AccessGrad, Chunk: c, Pass: shard.Backward})
	n := r.e.chunks[c].len
	if r.e.chunks[c].frozen {
		// The model's gradient GEMMs write the scratch, which nothing
		// reads (freeze.go); no bucket, no reduction.
		if h.err != nil {
			return nil, h.err
		}
		return r.frozenGrad.Slice(0, n), nil
	}
	return r.e.grads.buffer(h, s, c, n)
}

// bucket is bucketGrad's buffer: a slot of the bucket ring, zeroed on s
// (the model adds into it) once its last use is done.
func (h *hooks) bucket(s gpu.Stream, c, n int) (gpu.Buffer, error) {
	r := h.r
	if h.buckets[c] != nil {
		panic(fmt.Sprintf("engine: Grad of chunk %d twice in a micro-batch", c))
	}
	// At most one bucket waits for its reduction while the next fills.
	for len(h.pending) > 1 {
		h.retireBucket()
	}
	p := r.e.chunks[c]
	b := &bucket{c: c}
	h.buckets[c] = b
	if h.err == nil {
		slot, full, after, err := r.rings.buckets.take(r.e.n * p.shard)
		if err != nil {
			h.fail(fmt.Errorf("chunk %d grad bucket: %w", c, err))
			return nil, h.err
		}
		if after != nil {
			s.Wait(after)
		}
		r.ops.Fill(s, full, 0) // padding included: the reduction reads it
		b.full, b.fullSlot, b.tmpSlot, b.bytes = full, slot, -1, full.Bytes()
		r.ws.bucketBytes += b.bytes
		r.ws.bucketPeakBytes = max(r.ws.bucketPeakBytes, r.ws.bucketBytes)
		return full.Slice(0, n), nil
	}
	return nil, h.err
}

// retireBucket gives back the slots of the oldest pending bucket, its
// reduction as their last use.
func (h *hooks) retireBucket() {
	b := h.pending[0]
	h.pending = h.pending[1:]
	h.dropBucket(b)
}

// dropBucket gives b's slots back, with its reduction as their last use
// (nil when it was never reduced: its writes are done, the rank's streams
// were synchronized).
func (h *hooks) dropBucket(b *bucket) {
	if b.full != nil {
		h.r.rings.buckets.put(b.fullSlot, b.done)
	}
	if b.tmp != nil {
		h.r.rings.reduce.put(b.tmpSlot, b.done)
	}
	h.r.ws.bucketBytes -= b.bytes
	b.full, b.tmp, b.done, b.bytes = nil, nil, nil, 0
}

// GradReady implements model.Params: chunk c's gradient of this
// micro-batch is enqueued on s; the stage reduces it (gradPath.reduce).
func (h *hooks) GradReady(s gpu.Stream, c int) error {
	r := h.r
	e := r.e
	h.next(model.Access{Kind: model.AccessGradReady, Chunk: c, Pass: shard.Backward})
	if !e.grads.reduces(h.last) || e.chunks[c].frozen {
		return h.err // frozen: no reduction, no norm, no host copy
	}
	op := e.grads.collective(e.n)
	var from gpu.Event
	if h.err == nil {
		ev := r.dev.NewEvent()
		s.Record(ev)
		r.cs.Wait(ev)
		if op != "" {
			from = r.tr.Mark(r.cs)
		}
	}
	e.grads.reduce(h, c)
	if from != nil && h.err == nil {
		r.tr.Comm(from, r.tr.Mark(r.cs), timeline.Label{Op: op, Chunk: e.layout.Chunks[c].Name, Index: c, Micro: h.micro, HasMicro: true})
	}
	if h.last {
		if err := r.reduced(c, h.err != nil); err != nil {
			h.fail(err)
		}
	}
	return h.err
}

// freeAll gives back every gathered chunk and gradient bucket and forgets
// the scratch; the streams must have completed (the caller synchronized
// them).
func (h *hooks) freeAll() {
	for c := range h.live {
		h.freeGathered(c)
	}
	for len(h.pending) > 0 {
		h.retireBucket()
	}
	for c, b := range h.buckets {
		h.dropBucket(b)
		delete(h.buckets, c)
	}
	h.scratch = nil
	clear(h.relQ)
	h.relQ = h.relQ[:0]
	h.r.settleRings()
	h.dropInputs()
}
