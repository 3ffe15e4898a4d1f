package engine

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
)

// gradPath is the ZeRO stage's rule for a chunk's gradient, chosen once in
// New (chooseGradPath): where the model writes it, when and how it is
// reduced, and which part of it the optimizer reads. The hooks and the
// step test no stage.
type gradPath interface {
	// zero clears what the micro-batches accumulate into, before a
	// step's first.
	zero(r *rank)
	// buffer is where the model writes chunk c's gradient (n elements)
	// of the micro-batch.
	buffer(h *hooks, s gpu.Stream, c, n int) (gpu.Buffer, error)
	// reduces says whether GradReady reduces after a micro-batch (last:
	// the step's last).
	reduces(last bool) bool
	// collective names the reduction across n devices on the timeline
	// ("": none runs).
	collective(n int) string
	// reduce enqueues chunk c's reduction on cs. After a failure the
	// collectives still run, on the gradient in place or a scratch.
	reduce(h *hooks, c int)
	// shard is the reduced gradient of chunk c the optimizer reads.
	shard(st *devState, c int) gpu.Buffer
}

// chooseGradPath is the stage's gradPath.
func chooseGradPath(stage int) gradPath {
	switch stage {
	case 0:
		return allReduceGrad{}
	case 1:
		return reduceScatterGrad{}
	default:
		return bucketGrad{}
	}
}

// fullGrad is stages 0-1's: the micro-batches accumulate into the chunk's
// full gradient buffer, reduced in place after the last.
type fullGrad struct{}

func (fullGrad) zero(r *rank) {
	for c, p := range r.e.chunks {
		if !p.frozen {
			r.ops.Fill(r.s, r.st.grad[c], 0)
		}
	}
}

func (fullGrad) buffer(h *hooks, _ gpu.Stream, c, n int) (gpu.Buffer, error) {
	if h.err != nil {
		return nil, h.err
	}
	return h.r.st.grad[c].Slice(0, n), nil
}

func (fullGrad) reduces(last bool) bool { return last }

// allReduceGrad is stage 0's: AllReduce of the whole gradient, which
// every rank's optimizer reads.
type allReduceGrad struct{ fullGrad }

func (allReduceGrad) collective(n int) string { return overN(n, "allreduce") }

// overN is name when a collective runs over n devices (more than one).
func overN(n int, name string) string {
	if n > 1 {
		return name
	}
	return ""
}

func (allReduceGrad) reduce(h *hooks, c int) {
	if r := h.r; r.e.n > 1 {
		r.comm.AllReduce(r.cs, r.st.grad[c], gpu.Sum)
		r.reductions[c]++
	}
}

func (allReduceGrad) shard(st *devState, c int) gpu.Buffer { return st.grad[c] }

// reduceScatterGrad is stage 1's: ReduceScatter into the rank's slice of
// the full buffer, in place.
type reduceScatterGrad struct{ fullGrad }

func (reduceScatterGrad) collective(n int) string { return overN(n, "reducescatter") }

func (g reduceScatterGrad) reduce(h *hooks, c int) {
	if r := h.r; r.e.n > 1 {
		r.comm.ReduceScatter(r.cs, r.st.grad[c], g.shard(r.st, c), gpu.Sum)
		r.reductions[c]++
	}
}

func (reduceScatterGrad) shard(st *devState, c int) gpu.Buffer {
	s := st.e.chunks[c].shard
	return st.grad[c].Slice(st.r*s, s)
}

// bucketGrad is stages 2-3's: every micro-batch's gradient goes to a
// bucket (a slot of the bucket ring), ReduceScattered into the rank's
// shard (the first one writes it, later ones add to it), and the bucket is
// given back once that completes.
type bucketGrad struct{}

func (bucketGrad) zero(*rank) {}

func (bucketGrad) buffer(h *hooks, s gpu.Stream, c, n int) (gpu.Buffer, error) {
	return h.bucket(s, c, n)
}

func (bucketGrad) reduces(bool) bool { return true }

func (bucketGrad) collective(int) string { return "reducescatter" }

func (bucketGrad) reduce(h *hooks, c int) {
	b := h.buckets[c]
	if b == nil {
		panic(fmt.Sprintf("engine: GradReady of chunk %d without Grad", c))
	}
	delete(h.buckets, c)
	h.reduceBucket(c, b)
}

func (bucketGrad) shard(st *devState, c int) gpu.Buffer { return st.grad[c] }

// reduceBucket enqueues the ReduceScatter of bucket b (chunk c, stages
// 2-3) into the rank's gradient shard, or, after a failure, on the scratch.
func (h *hooks) reduceBucket(c int, b *bucket) {
	r := h.r
	e, st := r.e, r.st
	if h.err == nil && e.gradTiered && h.micro == 0 {
		if err := r.allocGrad(c); err != nil {
			h.fail(err)
		}
	}
	if h.err == nil && h.micro > 0 {
		slot, tmp, after, err := r.rings.reduce.take(e.chunks[c].shard)
		if err != nil {
			h.fail(fmt.Errorf("chunk %d grad reduce shard: %w", c, err))
		} else {
			if after != nil {
				r.cs.Wait(after)
			}
			b.tmp, b.tmpSlot = tmp, slot
			b.bytes += tmp.Bytes()
			r.ws.bucketBytes += tmp.Bytes()
			r.ws.bucketPeakBytes = max(r.ws.bucketPeakBytes, r.ws.bucketBytes)
		}
	}
	h.pending = append(h.pending, b)
	r.reductions[c]++
	if h.err != nil {
		h.dropBucket(b) // no longer in buckets: fail did not free it
		slice, full := h.scratchPair(e.chunks[c].shard)
		r.comm.ReduceScatter(r.cs, full, slice, gpu.Sum)
		return
	}
	if h.micro == 0 {
		r.comm.ReduceScatter(r.cs, b.full, st.gradShard(c), gpu.Sum)
	} else {
		r.comm.ReduceScatter(r.cs, b.full, b.tmp, gpu.Sum)
		r.ops.Axpy(r.cs, 1, b.tmp, st.gradShard(c))
	}
	b.done = r.dev.NewEvent()
	r.cs.Record(b.done)
}
