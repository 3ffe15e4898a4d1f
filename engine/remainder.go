package engine

import (
	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// A "bf16+remainder" master (DESIGN's model state): a cpuadam.Remainder in
// the tier store completed by masterParams; checkpoints hold fp32 masters.

// remainder says whether the host optimizer keeps the masters so.
func (e *Engine) remainder() bool {
	return e.offload && e.estimate.Options.StateDType(shard.Master) == dtype.Rem16
}

// masterParams are the params of chunk c that a remainder master
// completes: the upload staging, or nil for the tier store's param copy
// (and without a remainder master).
func (r *rank) masterParams(c int) []byte {
	if r.e.remainder() && r.e.uploads(c) {
		return r.e.tiers.uploadBytes(r.loc, c)
	}
	return nil
}

// joinMasters writes the rank's fp32 masters of chunk c into dst.
func (r *rank) joinMasters(c int, dst []byte) error {
	n, store := r.e.optElems(c), r.e.tiers.store
	rem := make([]byte, dtype.Rem16.Bytes(n))
	if err := store.ReadNewest(tkey(c, r.loc, shard.Master), rem); err != nil {
		return err
	}
	p := r.masterParams(c)
	if p == nil {
		p = make([]byte, 2*n)
		if err := store.ReadNewest(tkey(c, r.loc, shard.Param), p); err != nil {
			return err
		}
	}
	cpuadam.RemainderView(n, rem).Join(f32s(dst), u16s(p))
	return nil
}

// splitMasters stores the rank's masters of chunk c as their remainder
// and their params, each in its home (New's initialisation, a restore).
func (r *rank) splitMasters(c int, masters []float32) error {
	p, rem := encode(masters, gpu.BF16), make([]byte, dtype.Rem16.Bytes(len(masters)))
	cpuadam.RemainderView(len(masters), rem).Split(masters, u16s(p))
	if err := r.e.tiers.store.WriteHome(tkey(c, r.loc, shard.Master), rem); err != nil {
		return err
	}
	if dst := r.masterParams(c); dst != nil {
		copy(dst, p)
		return nil
	}
	return r.e.tiers.store.WriteHome(tkey(c, r.loc, shard.Param), p)
}
