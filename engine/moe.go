package engine

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// A mixture of experts' training step moves only the experts its tokens
// reach (model.ExpertRouter, which the hooks implement).
//
//   - The model's access order lists every expert of a sparse layer; once
//     the layer's router has run, RouteExperts gets the experts the
//     micro-batch reached. With more than one rank, and the experts'
//     params gathered (stage 3), the ranks take the union of their sets
//     (an AllReduce of one flag per expert on the communication stream,
//     among the gathers), so that every rank gathers the same chunks.
//   - For each expert left out, the model calls SkipExpert in place of its
//     calls: no gather, no tier-store read; its pending update is flushed
//     as its Acquire would (the update pipeline moves at those points);
//     in the backward a trainable expert gets the zero gradient of an
//     expert no token reached (its bucket, zeroed, reduced as any), so
//     its optimizer step is the same as with every expert acquired
//     (DeepSpeed's zero gradient: docs/DESIGN.md); a frozen one gets
//     nothing.
//   - The tier planner keeps every expert's param access in its trace,
//     marked conditional: it moves an expert's shard only once the step
//     confirms it (RouteExperts confirms the forward's and the backward's
//     accesses of those acquired), and each skipped one is a Skip in its
//     place, not a divergence. The skips are made in access order even
//     when a prefetch gathers the next acquired expert early (passOver),
//     so that the trace is the same sequence every step.
//   - The backward acquires the experts its forward acquired.
type expertRef struct{ layer, e int } // layer -1: not an expert

// everyExpert makes RouteExperts acquire every expert, as the access order
// lists them: the baseline tests measure what skipping saves against.
var everyExpert = false

// initExperts maps the layout's expert chunks to their layer and index.
func (h *hooks) initExperts() {
	lo := h.r.e.layout
	h.experts = make([]expertRef, len(lo.Chunks))
	for c := range h.experts {
		h.experts[c] = expertRef{-1, -1}
		if lo.IsExpert(c) {
			l := lo.ChunkLayer(c)
			h.experts[c] = expertRef{l, c - lo.ExpertChunk(l, 0)}
		}
	}
	if sh := lo.Shape; sh.MoE() {
		h.acquire = make([][]bool, sh.Layers)
		h.routed = make([]bool, sh.Layers)
		h.passed = map[int]bool{}
	}
}

// newRoutes forgets the previous micro-batch's routes.
func (h *hooks) newRoutes() {
	clear(h.routed)
	clear(h.passed)
}

// RouteExperts implements model.ExpertRouter: the experts of block l the
// micro-batch acquires are those its tokens reached, on every rank (the
// union), and the tier planner is told of those it will read.
func (h *hooks) RouteExperts(s gpu.Stream, l int, reached []bool) ([]bool, error) {
	r := h.r
	if h.routed[l] {
		panic(fmt.Sprintf("engine: block %d's experts routed twice in a micro-batch", l))
	}
	if h.acquire[l] == nil {
		h.acquire[l] = make([]bool, len(reached))
	}
	acq := h.acquire[l]
	copy(acq, reached)
	if everyExpert {
		for e := range acq {
			acq[e] = true
		}
	}
	h.routed[l] = true
	first := r.e.layout.ExpertChunk(l, 0)
	if r.routeBuf != nil && !r.st.paramIsFull(first) {
		h.unionRoutes(acq)
	}
	if _, tiered := r.e.chunks[first].path.(tieredPath); tiered && h.err == nil {
		for e, ok := range acq {
			if !ok {
				continue
			}
			c := first + e
			r.runner().Confirm(h.paramAccess(c, shard.Forward))
			if len(h.order) == len(h.full) { // training: the backward reads it too
				r.runner().Confirm(h.paramAccess(c, shard.Backward))
			}
		}
	}
	h.prefetchNext()
	return acq, h.err
}

// unionRoutes makes acq the union of every rank's (Sum of one F32 flag per
// expert, on cs after the gathers issued before it). After a failure the
// rank still joins it, with what it was given (nothing, from drain), and
// takes the peers' answer, so that its gathers on the scratch match
// theirs.
func (h *hooks) unionRoutes(acq []bool) {
	r := h.r
	for e, ok := range acq {
		v := float32(0)
		if ok {
			v = 1
		}
		binary.LittleEndian.PutUint32(r.routeHost[4*e:], math.Float32bits(v))
	}
	r.dev.CopyHostToDevice(r.cs, r.routeBuf, 0, r.routeHost)
	r.comm.AllReduce(r.cs, r.routeBuf, gpu.Sum)
	r.dev.CopyDeviceToHost(r.cs, r.routeHost, r.routeBuf, 0)
	if err := r.cs.Synchronize(); err != nil {
		if h.err == nil {
			h.fail(fmt.Errorf("the ranks' routed experts: %w", err))
		}
		for e := range acq {
			acq[e] = true // the union is unknown: the order's every call (the device has failed, the step with it)
		}
		return
	}
	for e := range acq {
		acq[e] = math.Float32frombits(binary.LittleEndian.Uint32(r.routeHost[4*e:])) > 0
	}
}

// SkipExpert implements model.ExpertRouter: chunk c, an expert
// RouteExperts left out, in place of its calls in pass.
func (h *hooks) SkipExpert(s gpu.Stream, c int, pass shard.Phase) error {
	i := h.pos
	h.next(model.Access{Kind: model.AccessAcquire, Chunk: c, Pass: pass})
	x := h.experts[c]
	if x.layer < 0 || !h.routed[x.layer] || h.acquire[x.layer][x.e] {
		panic(fmt.Sprintf("engine: SkipExpert of chunk %d, which RouteExperts did not leave out", c))
	}
	if h.passed[i] {
		delete(h.passed, i)
	} else {
		h.skipTier(c, pass)
	}
	if pass == shard.Backward {
		h.Grad(s, c) // zero (nothing adds into it), or a frozen chunk's scratch; a failure is h.err
	}
	h.next(model.Access{Kind: model.AccessRelease, Chunk: c, Pass: pass})
	if pass == shard.Backward {
		h.GradReady(s, c)
	}
	return h.err
}

// skipTier is what a skipped expert's Acquire leaves of its Acquire: the
// flush of its pending update, and its place in the tier planner's trace.
func (h *hooks) skipTier(c int, pass shard.Phase) {
	r := h.r
	r.flushChunk(c)
	if _, tiered := r.e.chunks[c].path.(tieredPath); !tiered || h.err != nil {
		return
	}
	if err := r.runner().Skip(h.paramAccess(c, pass)); err != nil {
		h.fail(fmt.Errorf("skip chunk %d param (%s): %w", c, pass, err))
	}
}

// passOver makes the tier-store skips of the experts skipped between the
// current call and the call at index end of order, ahead of a gather that
// reads past them.
func (h *hooks) passOver(end int) {
	for i := h.pos; i < end; i++ {
		a := h.order[i]
		if a.Kind != model.AccessAcquire || h.passed[i] {
			continue
		}
		if x := h.experts[a.Chunk]; x.layer >= 0 && h.routed[x.layer] && !h.acquire[x.layer][x.e] {
			h.skipTier(a.Chunk, a.Pass)
			h.passed[i] = true
		}
	}
}

// drainSkips makes, after a failure, an expert's calls as the model would:
// at the first expert of a sparse layer's forward, the route (the union
// the peers join, with nothing reached here), then the skip of each one
// left out. It says whether it made a's calls.
func (h *hooks) drainSkips(s gpu.Stream, a model.Access) bool {
	x := h.experts[a.Chunk]
	if x.layer < 0 {
		return false
	}
	if !h.routed[x.layer] {
		h.RouteExperts(s, x.layer, make([]bool, h.r.e.layout.Shape.Experts))
	}
	if h.acquire[x.layer][x.e] {
		return false
	}
	h.SkipExpert(s, a.Chunk, a.Pass)
	return true
}

// paramAccess is the tier-store access of chunk c's param shard that a
// gather in pass reads: conditional for an expert.
func (h *hooks) paramAccess(c int, pass shard.Phase) shard.Access {
	r := h.r
	return shard.Access{Key: tkey(c, r.loc, shard.Param), Phase: pass, Tier: shard.HBM, Kind: shard.Read, Conditional: h.experts[c].layer >= 0}
}
