package engine

import (
	"fmt"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// cpu_checkpointing: the hooks are the model's InputStore. A checkpointed
// block's input is a state of the tier store (shard.Activation, keyed by
// the block's chunk and the rank; home pinned host memory): after the
// block's forward the rank copies it from the model's ring buffer into its
// host home (a Write access in the host tier), and its backward reads it in
// HBM (a Read access there), which the planner has fetched ahead as it
// fetches params, from the trace of the step before. The HBM copies are the
// store's, within the store's HBM budget (room for two inputs beyond the
// params: the one in use and the next arriving), in its HBM slots taken at
// New (tier.Store.ReserveHBM, tagged gpu.Activation, "tier hbm inputs": as
// many as that budget can hold, since the planner may evict param copies
// for more inputs), so that no step allocates them; the next forward's
// write makes them stale and the planner drops them.

// akey is rank r's saved input of block l.
func akey(l, r int) shard.Key {
	return shard.Key{Chunk: shard.ChunkID(model.BlockChunk(l)), Rank: int32(r), State: shard.Activation}
}

// SaveInput implements model.InputStore: block l's input x goes to its
// host home on the communication stream, after the model's work on s; the
// event it returns marks the end of the copy.
func (h *hooks) SaveInput(s gpu.Stream, l int, x gpu.Buffer) (gpu.Event, error) {
	r := h.r
	h.next(model.Access{Kind: model.AccessSaveInput, Chunk: model.BlockChunk(l), Pass: shard.Forward})
	if h.err != nil {
		return nil, h.err
	}
	lease, err := r.runner().Use(shard.Access{Key: akey(l, r.loc), Phase: shard.Forward, Tier: shard.Host, Kind: shard.Write})
	if err != nil {
		h.fail(fmt.Errorf("save block %d input: %w", l, err))
		return nil, h.err
	}
	ev := r.dev.NewEvent()
	s.Record(ev)
	r.down.Wait(ev)
	r.dev.CopyDeviceToHost(r.down, lease.Bytes(), x, 0)
	done := r.dev.NewEvent()
	r.down.Record(done)
	r.runner().Done(lease, done)
	h.saved[l] = done
	return done, nil
}

// RestoreInput implements model.InputStore: block l's input, in HBM,
// leased until ReleaseInput.
func (h *hooks) RestoreInput(s gpu.Stream, l int) (gpu.Buffer, error) {
	r := h.r
	h.next(model.Access{Kind: model.AccessRestoreInput, Chunk: model.BlockChunk(l), Pass: shard.Backward})
	if h.err != nil {
		return nil, h.err
	}
	// The host copy is the newest version once the forward's copy has run
	// and its lease is released (Use releases the leases whose events are
	// done): until then the planner still holds the previous step's HBM
	// copy valid. The copy ran during the forward; this wait is for form.
	if ev := h.saved[l]; ev != nil {
		ev.Synchronize()
		delete(h.saved, l)
	}
	lease, err := r.runner().Use(shard.Access{Key: akey(l, r.loc), Phase: shard.Backward, Tier: shard.HBM, Kind: shard.Read})
	if err != nil {
		h.fail(fmt.Errorf("restore block %d input: %w", l, err))
		return nil, h.err
	}
	h.inputs[l] = lease
	return lease.Buffer(), nil
}

// ReleaseInput implements model.InputStore: the lease of block l's input
// ends when the work enqueued on s so far has run.
func (h *hooks) ReleaseInput(s gpu.Stream, l int) {
	r := h.r
	h.next(model.Access{Kind: model.AccessReleaseInput, Chunk: model.BlockChunk(l), Pass: shard.Backward})
	lease := h.inputs[l]
	if lease == nil {
		return // after a failure: fail gave it back
	}
	delete(h.inputs, l)
	ev := r.dev.NewEvent()
	s.Record(ev)
	r.runner().Done(lease, ev)
}

// dropInputs gives back the restored inputs a failed pass still holds (its
// streams have completed).
func (h *hooks) dropInputs() {
	for l, lease := range h.inputs {
		h.r.runner().Done(lease, nil)
		delete(h.inputs, l)
	}
}

// inputSpecs are the tier store's specs of the saved inputs of every rank
// (cpu_checkpointing): one per offloaded block and rank, B·T·C of the
// activation dtype, homed in host memory.
func (e *Engine) inputSpecs() map[shard.Key]tier.Spec {
	out := map[shard.Key]tier.Spec{}
	if !e.act.Offload {
		return out
	}
	elems := e.micro * e.seq * e.layout.Shape.Dim
	for r := range e.nLocal {
		for l := range e.layout.Shape.Layers {
			if e.act.Offload && e.act.Checkpointed(l, e.layout.Shape.Layers) {
				out[akey(l, r)] = tier.Spec{Elems: elems, DType: e.act.DType, Home: shard.Host}
			}
		}
	}
	return out
}

// inputHBMBytes is the room the tier store's HBM budget keeps for
// restored inputs: two (the one in use and the next arriving), as the
// planner charges them (rounded up to IOAlignBytes); 0 without
// cpu_checkpointing.
func (e *Engine) inputHBMBytes() int64 {
	if !e.act.Offload {
		return 0
	}
	return 2 * ioBytes(model.InputBytes(e.layout.Shape, e.micro, e.seq, e.act))
}

// ioBytes is b rounded up to estimate.IOAlignBytes.
func ioBytes(b int64) int64 { return estimate.IOBytes(b) }
