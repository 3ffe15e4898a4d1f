package engine

import (
	"github.com/strata-ai/strata/cpuadam"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// masterFormat is how the host optimizer keeps a chunk's fp32 master
// weights in the tier store (strata.optimizer_state.master), chosen once
// in New (chooseMaster): fp32Master, or remMaster, a bf16+remainder
// master completed by the params (remainder.go). The sites that read,
// update, undo, checkpoint or initialise the masters call it and test no
// configuration themselves.
type masterFormat interface {
	// params are chunk c's params that complete its master: the upload
	// staging; nil for none (fp32) or for the tier store's param copy.
	params(r *rank, c int) []byte
	// paramKind is cpuadam's access to chunk c's param host copy
	// (offload_param): a write, or an update when the old params are the
	// masters' high halves.
	paramKind(r *rank, c int) shard.Kind
	// bind points s's master at the leased master of chunk c; out is where
	// the new params go. It returns the bytes that must get the new params
	// too (nil: none).
	bind(r *rank, c int, s *cpuadam.Shard, ls hostLeases, out []byte) (keep []byte)
	// undoBytes is what an undo copy keeps for the master of a chunk of n
	// elements (overlap_bwd.go): the master as stored, and its params.
	undoBytes(n int) int64
	// save writes the rank's fp32 masters of chunk c into dst (a
	// checkpoint); restore stores them from src, fp32 bytes.
	save(r *rank, c int, dst []byte) error
	restore(r *rank, c int, src []byte) error
	// init stores the initial masters of chunk c (buf: a scratch buffer
	// to reuse).
	init(r *rank, c int, masters []float32, buf *[]byte) error
}

// chooseMaster is the engine's master format: a remainder master with the
// host optimizer and strata.optimizer_state.master "bf16+remainder", else
// fp32 (on the device the masters are the device's: no format).
func chooseMaster(e *Engine) masterFormat {
	if e.offload && e.estimate.Options.StateDType(shard.Master) == dtype.Rem16 {
		return remMaster{}
	}
	return fp32Master{}
}

// chooseMoments is the host optimizer's format of m and v
// (strata.optimizer_state.moments). An engine whose moments cpuadam does
// not store (the device's optimizer) gets the zero value, never used.
func chooseMoments(e *Engine) cpuadam.Moments {
	mo, _ := cpuadam.MomentsOf(e.estimate.Options.StateDType(shard.AdamM))
	return mo
}

// fp32Master keeps the masters as fp32 in the tier store.
type fp32Master struct{}

func (fp32Master) params(*rank, int) []byte        { return nil }
func (fp32Master) paramKind(*rank, int) shard.Kind { return shard.Write }
func (fp32Master) undoBytes(n int) int64           { return dtype.F32.Bytes(n) }

func (fp32Master) bind(_ *rank, _ int, s *cpuadam.Shard, ls hostLeases, _ []byte) []byte {
	s.Param = f32s(ls.master.Bytes())
	return nil
}

func (fp32Master) save(r *rank, c int, dst []byte) error {
	return r.saveTiered(tkey(c, r.loc, shard.Master), dst)
}

func (fp32Master) restore(r *rank, c int, src []byte) error {
	return r.restoreTiered(tkey(c, r.loc, shard.Master), src)
}

func (fp32Master) init(r *rank, c int, masters []float32, buf *[]byte) error {
	*buf = encodeInto(*buf, masters, gpu.F32)
	return r.e.tiers.initShard(tkey(c, r.loc, shard.Master), *buf)
}
