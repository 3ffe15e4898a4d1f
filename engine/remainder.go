package engine

import (
	"slices"

	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// remMaster is a "bf16+remainder" master (DESIGN's model state): a
// cpuadam.Remainder in the tier store completed by the params (params:
// the upload staging, or the tier store's param copy); checkpoints hold
// fp32 masters.
type remMaster struct{}

// params are the params of chunk c that its master completes: the upload
// staging, or nil for the tier store's param copy.
func (remMaster) params(r *rank, c int) []byte {
	if r.e.uploads(c) {
		return r.e.tiers.uploadBytes(r.loc, c)
	}
	return nil
}

// paramKind: the old params in the tier store are the masters' high
// halves, so cpuadam's access to them is an update.
func (m remMaster) paramKind(r *rank, c int) shard.Kind {
	if m.params(r, c) == nil { // in the tier store
		return shard.Update
	}
	return shard.Write
}

// undoBytes: the remainder and the bf16 params in the staging.
func (remMaster) undoBytes(n int) int64 { return dtype.Rem16.Bytes(n) + int64(2*n) }

// bind sets s's remainder, completed by the params in out; when out is
// not the master's params (dpu's warm-up: the update writes the tier
// store's copy), they are copied in first and get the new params after.
func (m remMaster) bind(r *rank, c int, s *cpuadam.Shard, ls hostLeases, out []byte) (keep []byte) {
	n := r.e.optElems(c)
	s.Rem = cpuadam.RemainderView(n, ls.master.Bytes()) // completed by the params in out
	if p := m.params(r, c); p != nil && ls.param != nil {
		keep = p
		copy(out, keep)
	}
	return keep
}

// remScratchBytes is the most a rank's remainder scratch grows to
// (rank.remScratch): the largest chunk's remainder and bf16 params; 0 for
// an fp32 master.
func remScratchBytes(e *Engine) int64 {
	if _, ok := e.masters.(remMaster); !ok {
		return 0
	}
	n := 0
	for c := range e.chunks {
		n = max(n, e.optElems(c))
	}
	return dtype.Rem16.Bytes(n) + int64(2*n)
}

// remBuf is the rank's remainder scratch, taken at the first use at its
// largest (one allocation, not one per larger chunk).
func (r *rank) remBuf() *[]byte {
	if r.remScratch == nil {
		r.remScratch = make([]byte, 0, remScratchBytes(r.e))
	}
	return &r.remScratch
}

// save writes the rank's fp32 masters of chunk c into dst (the remainder,
// and the params when the tier store holds them, read into the rank's
// scratch).
func (m remMaster) save(r *rank, c int, dst []byte) error {
	n, store := r.e.optElems(c), r.e.tiers.store
	nrem := int(dtype.Rem16.Bytes(n))
	buf := r.remBuf()
	*buf = (*buf)[:nrem+2*n]
	rem := (*buf)[:nrem]
	if err := store.ReadNewest(tkey(c, r.loc, shard.Master), rem); err != nil {
		return err
	}
	p := m.params(r, c)
	if p == nil {
		p = (*buf)[nrem:]
		if err := store.ReadNewest(tkey(c, r.loc, shard.Param), p); err != nil {
			return err
		}
	}
	cpuadam.RemainderView(n, rem).Join(f32s(dst), u16s(p))
	return nil
}

// restore stores the fp32 masters in src as their remainder and params.
func (m remMaster) restore(r *rank, c int, src []byte) error {
	return m.init(r, c, f32s(src), r.remBuf()) // init only reads the masters
}

// init stores the rank's masters of chunk c as their remainder and their
// params, each in its home (New's initialisation, a restore). The two are
// encoded into *buf (grown when short), which the store has copied when
// init returns: New's initialisation passes one buffer for every chunk,
// so that it makes no garbage per chunk (3 GB at gpt2-774m before).
func (m remMaster) init(r *rank, c int, masters []float32, buf *[]byte) error {
	n, nrem := 2*len(masters), int(dtype.Rem16.Bytes(len(masters)))
	*buf = slices.Grow((*buf)[:0], n+nrem)[:n+nrem]
	p, rem := encodeInto((*buf)[:n:n], masters, gpu.BF16), (*buf)[n:]
	cpuadam.RemainderView(len(masters), rem).Split(masters, u16s(p))
	if err := r.e.tiers.store.WriteHome(tkey(c, r.loc, shard.Master), rem); err != nil {
		return err
	}
	if dst := m.params(r, c); dst != nil {
		copy(dst, p)
		return nil
	}
	return r.e.tiers.store.WriteHome(tkey(c, r.loc, shard.Param), p)
}
