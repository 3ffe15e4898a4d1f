package engine

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/shard"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/tier"
)

// hooks are a rank's model.Params: the single place where a chunk is
// gathered before its use and released after it (stage 3), and where a
// chunk's gradient is handed out and reduced when it is ready (all
// stages). The model calls them in model.AccessOrder, from the rank's
// goroutine; every decision that issues a collective depends only on that
// order, never on timing, so all ranks issue the same collectives.
type hooks struct {
	r        *rank
	acquires []model.Access // the Acquire calls of one micro-batch, in order
	cursor   int            // index of the next Acquire in acquires
	micro    int            // micro-batch index within the step
	last     bool           // the step's last micro-batch

	// stage 3: gathered chunks, at most Options.MaxLiveChunks
	live   map[int]*gathered
	relSeq int

	// stages 2-3: full gradient buffers being accumulated, and those whose
	// reduction is enqueued (freed once it completes)
	buckets map[int]*bucket
	pending []*bucket
}

type gathered struct {
	buf      gpu.Buffer // N·S elements, Workspace
	ready    gpu.Event  // the AllGather into buf (on cs)
	released bool
	relEv    gpu.Event // the last use, on s
	relSeq   int
}

type bucket struct {
	c     int
	full  gpu.Buffer // N·S elements, Workspace
	tmp   gpu.Buffer // the reduced shard of a micro-batch after the first (A > 1); nil else
	done  gpu.Event  // the reduction (on cs)
	bytes int64
}

func newHooks(r *rank) *hooks {
	h := &hooks{r: r, live: map[int]*gathered{}, buckets: map[int]*bucket{}}
	for _, a := range model.AccessOrder(r.e.shape.Layers) {
		if a.Kind == model.AccessAcquire {
			h.acquires = append(h.acquires, a)
		}
	}
	return h
}

// begin starts micro-batch k of a step.
func (h *hooks) begin(k int, last bool) {
	h.micro, h.last, h.cursor = k, last, 0
}

// end checks that the micro-batch made every Acquire; after the last one it
// leaves nothing to do but wait.
func (h *hooks) end() {
	if h.cursor != len(h.acquires) {
		panic(fmt.Sprintf("%v: %d of %d acquires", errAccessOrder, h.cursor, len(h.acquires)))
	}
	if len(h.buckets) != 0 {
		panic(fmt.Sprintf("engine: %d gradient buckets never got GradReady", len(h.buckets)))
	}
}

// Acquire implements model.Params.
func (h *hooks) Acquire(s gpu.Stream, c int, pass model.Pass) gpu.Buffer {
	r := h.r
	if h.cursor >= len(h.acquires) || h.acquires[h.cursor] != (model.Access{Kind: model.AccessAcquire, Chunk: c, Pass: pass}) {
		panic(fmt.Sprintf("%v: acquire %d of chunk %d (%s)", errAccessOrder, h.cursor, c, pass))
	}
	h.cursor++
	n := r.e.chunks[c].len
	if r.st.paramIsFull(c) {
		s.Wait(r.paramReady[c])
		h.traceBegin(s)
		return r.st.paramFull(c).Slice(0, n)
	}
	g := h.live[c]
	if g == nil {
		g = h.gather(c, pass)
	}
	g.released = false
	s.Wait(g.ready)
	h.traceBegin(s)
	// Prefetch the next chunk this micro-batch acquires.
	if h.cursor < len(h.acquires) {
		if next := h.acquires[h.cursor]; !r.st.paramIsFull(next.Chunk) && h.live[next.Chunk] == nil {
			h.gather(next.Chunk, next.Pass)
		}
	}
	return g.buf.Slice(0, n)
}

// gather enqueues the AllGather of chunk c's shards into a new workspace
// buffer on the communication stream, after making room.
func (h *hooks) gather(c int, pass model.Pass) *gathered {
	r := h.r
	for len(h.live) >= r.e.opts.MaxLiveChunks {
		if !h.evictOldest() {
			break
		}
	}
	p := r.e.chunks[c]
	buf, err := r.dev.Alloc(r.e.n*p.shard, r.e.precision, gpu.Tag{Kind: gpu.Workspace, Purpose: "gathered chunk"})
	if err != nil {
		panic(fmt.Sprintf("engine: rank %d: gather of chunk %d: %v", r.idx, c, err))
	}
	r.ws.gatheredBytes += buf.Bytes()
	r.ws.gatheredPeakBytes = max(r.ws.gatheredPeakBytes, r.ws.gatheredBytes)
	r.cs.Wait(r.paramReady[c])
	src := r.st.param[c]
	var lease *tier.Lease
	if r.e.paramTiered(c) {
		// The tier store stages the rank's shard in HBM (the planner has
		// fetched it ahead); it stays leased until the gather has read it.
		ph := prefetch.Forward
		if pass == model.PassBackward {
			ph = prefetch.Backward
		}
		var err error
		lease, err = r.driver().Use(prefetch.Access{Key: tkey(c, r.idx, shard.Param), Phase: ph, Tier: shard.HBM, Kind: prefetch.Read})
		if err != nil {
			// Every rank must issue the same collectives: gather from a
			// buffer of the right size; the step fails with err.
			r.fail(err)
			src = r.scratchShard(p.shard)
		} else {
			src = lease.Buffer()
		}
	}
	var from gpu.Event
	if r.tr != nil {
		from = r.tr.mark(r.cs)
	}
	r.comm.AllGather(r.cs, src, buf)
	g := &gathered{buf: buf, ready: r.dev.NewEvent()}
	r.cs.Record(g.ready)
	if r.tr != nil {
		r.tr.comm.span(from, g.ready, TraceComm, fmt.Sprintf("allgather %s (%s)", r.e.layout.Chunks[c].Name, pass), map[string]any{"chunk": c, "pass": pass.String()})
	}
	if lease != nil {
		r.driver().Done(lease, g.ready)
	}
	h.live[c] = g
	return g
}

// evictOldest frees the gathered chunk released longest ago, after its
// last use has run; false when every live chunk is in use.
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
	g := h.live[victim]
	g.relEv.Synchronize()
	h.freeGathered(victim)
	return true
}

func (h *hooks) freeGathered(c int) {
	g := h.live[c]
	h.r.ws.gatheredBytes -= g.buf.Bytes()
	h.r.dev.Free(g.buf)
	delete(h.live, c)
}

// traceBegin opens the compute span of the chunk just acquired on s.
func (h *hooks) traceBegin(s gpu.Stream) {
	if rt := h.r.tr; rt != nil {
		rt.computeC = rt.mark(s)
	}
}

// Release implements model.Params.
func (h *hooks) Release(s gpu.Stream, c int, pass model.Pass) {
	if rt := h.r.tr; rt != nil && rt.computeC != nil {
		dir := "fwd"
		if pass == model.PassBackward {
			dir = "bwd"
		}
		name := dir + " " + h.r.e.layout.Chunks[c].Name
		rt.compute.span(rt.computeC, rt.mark(s), TraceCompute, name, map[string]any{"chunk": c, "pass": pass.String(), "micro": h.micro})
		rt.computeC = nil
	}
	g := h.live[c]
	if g == nil {
		return // resident: nothing to give back
	}
	g.released = true
	g.relEv = h.r.dev.NewEvent()
	s.Record(g.relEv)
	h.relSeq++
	g.relSeq = h.relSeq
}

// Grad implements model.Params.
func (h *hooks) Grad(_ gpu.Stream, c int) gpu.Buffer {
	r := h.r
	n := r.e.chunks[c].len
	if r.e.stage < 2 {
		return r.st.gradFull(c).Slice(0, n)
	}
	if b := h.buckets[c]; b != nil {
		return b.full.Slice(0, n)
	}
	// At most one bucket waits for its reduction while the next fills.
	for len(h.pending) > 1 {
		h.freeBucket()
	}
	p := r.e.chunks[c]
	full, err := r.dev.Alloc(r.e.n*p.shard, r.e.precision, gpu.Tag{Kind: gpu.Workspace, Purpose: "grad bucket"})
	if err != nil {
		panic(fmt.Sprintf("engine: rank %d: gradient bucket of chunk %d: %v", r.idx, c, err))
	}
	b := &bucket{c: c, full: full, bytes: full.Bytes()}
	r.ws.bucketBytes += b.bytes
	r.ws.bucketPeakBytes = max(r.ws.bucketPeakBytes, r.ws.bucketBytes)
	h.buckets[c] = b
	return full.Slice(0, n)
}

// freeBucket waits for the oldest pending reduction and frees its buffers.
func (h *hooks) freeBucket() {
	b := h.pending[0]
	h.pending = h.pending[1:]
	b.done.Synchronize()
	h.r.dev.Free(b.full)
	if b.tmp != nil {
		h.r.dev.Free(b.tmp)
	}
	h.r.ws.bucketBytes -= b.bytes
}

// GradReady implements model.Params: chunk c's gradient of this
// micro-batch is enqueued on s. Stages 0-1 reduce the accumulated gradient
// after the last micro-batch (AllReduce, or ReduceScatter into the rank's
// slice, in place); stages 2-3 ReduceScatter every micro-batch's gradient
// into the rank's shard (the first one writes it, later ones add to it)
// and free the full buffer once that completes.
func (h *hooks) GradReady(s gpu.Stream, c int) {
	r := h.r
	e, st := r.e, r.st
	if e.stage < 2 && !h.last {
		return
	}
	ev := r.dev.NewEvent()
	s.Record(ev)
	r.cs.Wait(ev)
	var from gpu.Event
	if r.tr != nil && (e.n > 1 || e.stage >= 2) {
		from = r.tr.mark(r.cs)
	}
	switch e.stage {
	case 0:
		if e.n > 1 {
			r.comm.AllReduce(r.cs, st.gradFull(c), gpu.Sum)
		}
	case 1:
		if e.n > 1 {
			r.comm.ReduceScatter(r.cs, st.gradFull(c), st.gradShard(c), gpu.Sum)
		}
	default:
		b := h.buckets[c]
		if b == nil {
			panic(fmt.Sprintf("engine: GradReady of chunk %d without Grad", c))
		}
		delete(h.buckets, c)
		if e.gradTiered && h.micro == 0 {
			r.allocGrad(c)
		}
		if h.micro == 0 {
			r.comm.ReduceScatter(r.cs, b.full, st.gradShard(c), gpu.Sum)
		} else {
			tmp, err := r.dev.Alloc(e.chunks[c].shard, e.precision, gpu.Tag{Kind: gpu.Workspace, Purpose: "reduce shard"})
			if err != nil {
				panic(fmt.Sprintf("engine: rank %d: reduce shard of chunk %d: %v", r.idx, c, err))
			}
			b.tmp = tmp
			b.bytes += tmp.Bytes()
			r.ws.bucketBytes += tmp.Bytes()
			r.ws.bucketPeakBytes = max(r.ws.bucketPeakBytes, r.ws.bucketBytes)
			r.comm.ReduceScatter(r.cs, b.full, tmp, gpu.Sum)
			r.ops.Axpy(r.cs, 1, tmp, st.gradShard(c))
		}
		b.done = r.dev.NewEvent()
		r.cs.Record(b.done)
		h.pending = append(h.pending, b)
	}
	if from != nil {
		op := "reducescatter"
		if e.stage == 0 {
			op = "allreduce"
		}
		r.tr.comm.span(from, r.tr.mark(r.cs), TraceComm, fmt.Sprintf("%s %s", op, e.layout.Chunks[c].Name), map[string]any{"chunk": c, "micro": h.micro})
	}
	if h.last {
		r.reduced(c)
	}
}

// freeAll frees every gathered chunk and gradient bucket; the streams must
// have completed (the caller synchronized them).
func (h *hooks) freeAll() {
	for c := range h.live {
		h.freeGathered(c)
	}
	for len(h.pending) > 0 {
		h.freeBucket()
	}
	for c, b := range h.buckets {
		h.r.dev.Free(b.full)
		h.r.ws.bucketBytes -= b.bytes
		delete(h.buckets, c)
	}
}
