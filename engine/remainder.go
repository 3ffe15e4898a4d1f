package engine

import (
	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/shard"
)

// A master of strata.optimizer_state.master "bf16+remainder" is its bf16
// param plus a cpuadam.Remainder (dtype.Rem16) in the tier store. The
// param it completes is the host copy cpuadam writes the new params into:
// the chunk's upload staging when the devices hold the params (or under
// dpu), else the param's tier-store copy (offload_param), which the update
// then leases for Update instead of Write. Each such copy holds the
// masters rounded to bf16 at all times: cpuadam writes it with every
// update, and New's initialisation and a restore write it beside the
// remainder (splitMasters). Checkpoints hold the fp32 masters, joined, so a
// checkpoint is the same whichever master the run kept.

// remainder says whether the host optimizer keeps the masters as their
// bf16 params plus a remainder.
func (e *Engine) remainder() bool {
	return e.offload && e.estimate.Options.StateDType(shard.Master) == dtype.Rem16
}

// masterParams is the host copy of the new params of chunk c that cpuadam
// writes on this rank and a remainder master completes: the upload
// staging, or nil for the param's tier-store copy.
func (r *rank) masterParams(c int) []byte {
	if r.e.uploads(c) {
		return r.e.tiers.uploadBytes(r.loc, c)
	}
	return nil
}

// joinMasters writes the rank's fp32 masters of chunk c into dst (4 bytes
// each), joined from the remainder and the params it completes, as they
// are between steps.
func (r *rank) joinMasters(c int, dst []byte) error {
	e := r.e
	n := e.optElems(c)
	rem := make([]byte, dtype.Rem16.Bytes(n))
	if err := e.tiers.store.ReadNewest(tkey(c, r.loc, shard.Master), rem); err != nil {
		return err
	}
	p := r.masterParams(c)
	if p == nil {
		p = make([]byte, 2*n)
		if err := e.tiers.store.ReadNewest(tkey(c, r.loc, shard.Param), p); err != nil {
			return err
		}
	}
	cpuadam.RemainderView(n, rem).Join(f32s(dst), u16s(p))
	return nil
}

// splitMasters stores masters (the rank's of chunk c) as their remainder
// and their params rounded to bf16, each in its home, as New's
// initialisation and a restore leave the store.
func (r *rank) splitMasters(c int, masters []float32) error {
	e := r.e
	n := len(masters)
	p := encode(masters, gpu.BF16)
	rem := make([]byte, dtype.Rem16.Bytes(n))
	cpuadam.RemainderView(n, rem).Split(masters, u16s(p))
	if err := e.tiers.store.WriteHome(tkey(c, r.loc, shard.Master), rem); err != nil {
		return err
	}
	if dst := r.masterParams(c); dst != nil {
		copy(dst, p)
		return nil
	}
	return e.tiers.store.WriteHome(tkey(c, r.loc, shard.Param), p)
}
