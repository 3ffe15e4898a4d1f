package engine

import (
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
	"github.com/strata-ai/strata/timeline"
)

// paramPath is how a chunk's params reach the passes that read them,
// chosen once per chunk in New (choosePath): the update publishes a new
// param shard through it, and a gather reads the shard through it.
type paramPath interface {
	// publishDevice makes the shard the device optimizer has just written
	// on the compute stream readable, and records paramReady[c] after it.
	publishDevice(r *rank, c int)
	// publishHost does the same for a shard cpuadam wrote into its upload
	// staging (updated false: the staging holds no new params, the old
	// ones stay; the collectives go on).
	publishHost(r *rank, c int, updated bool)
	// source is the param shard a gather of chunk c in pass reads, and the
	// lease to end once the gather has read it (nil: none).
	source(r *rank, c int, pass shard.Phase) (gpu.Buffer, *tier.Lease, error)
}

// choosePath is chunk c's param path: in the tier store (offload_param,
// not persistent), gathered on the device after each update (stages 1-2
// and stage 3's persistent chunks, on more than one device), or resident:
// the device's shard is what the passes read or gather.
func choosePath(e *Engine, p chunkPlan) paramPath {
	switch full := e.stage < 3 || p.persistent; {
	case p.tiered:
		return tieredPath{}
	case full && e.stage >= 1 && e.n > 1:
		return gatheredPath{}
	default:
		return residentPath{}
	}
}

// residentPath: the rank's param shard on the device is what the passes
// read (stage 0, one device) or gather (stage 3).
type residentPath struct{}

func (residentPath) publishDevice(r *rank, c int) { r.s.Record(r.paramReady[c]) }

func (residentPath) publishHost(r *rank, c int, updated bool) { r.upload(c, updated) }

func (residentPath) source(r *rank, c int, _ shard.Phase) (gpu.Buffer, *tier.Lease, error) {
	return r.st.param[c], nil, nil
}

// gatheredPath: the device keeps the whole chunk, and the updated shards
// are gathered into it after each update (cs).
type gatheredPath struct{ residentPath }

func (gatheredPath) publishDevice(r *rank, c int) {
	ev := r.dev.NewEvent()
	r.s.Record(ev)
	r.cs.Wait(ev)
	r.gatherUpdated(c)
}

func (gatheredPath) publishHost(r *rank, c int, updated bool) {
	r.upload(c, updated)
	r.cs.Wait(r.paramReady[c])
	r.gatherUpdated(c)
}

// gatherUpdated enqueues the AllGather of chunk c's updated shards into
// the whole chunk on cs and records paramReady[c] after it.
func (r *rank) gatherUpdated(c int) {
	from := r.tr.Mark(r.cs)
	r.comm.AllGather(r.cs, r.st.paramShard(c), r.st.paramFull(c))
	r.cs.Record(r.paramReady[c])
	r.tr.Comm(from, r.tr.Mark(r.cs), timeline.Label{Op: "allgather", Chunk: r.e.layout.Chunks[c].Name, Note: "update", Index: c})
}

// tieredPath: the param shard is a tier-store state (offload_param):
// cpuadam writes the new one into its host copy (or, delayed, storeDelayed
// copies it there), and a gather reads the copy the planner staged in HBM.
type tieredPath struct{}

func (tieredPath) publishDevice(r *rank, c int) { r.s.Record(r.paramReady[c]) }

func (tieredPath) publishHost(*rank, int, bool) {} // in its host copy: the planner moves it

func (tieredPath) source(r *rank, c int, pass shard.Phase) (gpu.Buffer, *tier.Lease, error) {
	// The tier store stages the rank's shard in HBM (the planner has
	// fetched it ahead); it stays leased until the gather has read it.
	l, err := r.runner().Use(r.h.paramAccess(c, pass))
	if err != nil {
		return nil, nil, err
	}
	return l.Buffer(), l, nil
}
