package engine

import (
	"fmt"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// The pinned upload staging of the host optimizer: the new params of the
// trainable chunks whose param the device holds, on their way from cpuadam to the
// device (see tiers and the package doc); under dpu also those whose
// param the tier store holds, until the pass that reads the old ones ends.

// openStaging takes the pinned upload buffer of every (chunk, rank) whose
// param the device holds, and each rank's buffer of the gradient norms it
// downloads every step, from a pool of their own.
func (t *tiers) openStaging() error {
	e := t.e
	sz := int64(e.precision.Size())
	normBytes := int64(8 * len(e.chunks))
	total := e.stagingPoolBytes()
	var err error
	if t.uploadPool, err = pinned.New(pinned.Options{BudgetBytes: total, Lock: e.opts.PinnedLock}); err != nil {
		return fmt.Errorf("engine: pinned upload staging: %w", err)
	}
	t.upload = make([][]*pinned.Buffer, e.nLocal)
	t.norms = make([]*pinned.Buffer, e.nLocal)
	for r := range e.nLocal {
		b, err := t.uploadPool.Get(normBytes, fmt.Sprintf("rank %d grad norms", r))
		if err != nil {
			return fmt.Errorf("engine: gradient norms of rank %d: %w", r, err)
		}
		t.norms[r] = b
		e.ranks[r].normsHost = b.Bytes()[:normBytes:normBytes]
		t.upload[r] = make([]*pinned.Buffer, len(e.chunks))
		for c := range e.chunks {
			if !e.uploads(c) {
				continue
			}
			nb := int64(e.optElems(c)) * sz
			b, err := t.uploadPool.Get(nb, fmt.Sprintf("rank %d param upload", r))
			if err != nil {
				return fmt.Errorf("engine: param upload of chunk %d: %w", c, err)
			}
			t.upload[r][c] = b
			t.stagingBytes += nb
		}
	}
	return nil
}

// uploads says whether the host optimizer writes chunk c's new params
// into a staging buffer: a chunk that trains and whose param the device
// holds (uploaded from there), or, under dpu, whose param the tier store
// holds (copied into it at the end of the pass that still read the old
// ones: storeDelayed).
func (e *Engine) uploads(c int) bool { return e.chunks[c].staged }

// uploadBytes is the pinned upload staging of chunk c on rank r.
func (t *tiers) uploadBytes(r, c int) []byte {
	nb := t.e.optElems(c) * t.e.precision.Size()
	return t.upload[r][c].Bytes()[:nb:nb]
}

// isStatic says that no model state ever leaves its home: every home is in
// host RAM and nothing is staged in HBM (ZeRO-Offload without
// offload_param), so the planners never move model state and a restore may
// overwrite the homes at any point between steps. The saved block inputs
// of cpu_checkpointing do not count: their host homes never move either
// (their HBM copies come and go in the HBM budget), and a restore does not
// touch them.
func (t *tiers) isStatic() bool {
	for k, sp := range t.specs {
		if k.State != shard.Activation && sp.Home != shard.Host {
			return false
		}
	}
	return t.paramTier == shard.HBM
}

// moved says whether a rank's planner may have moved model state (a step
// ran on a store that is not static): a restore would then overwrite what
// the planners no longer know. False without a store.
func (t *tiers) moved() (rank int, accesses int64, ok bool) {
	if t == nil || t.static {
		return 0, 0, false
	}
	for _, d := range t.runners {
		if ps, _ := d.stats(); ps.Accesses > 0 {
			return d.rank, ps.Accesses, true
		}
	}
	return 0, 0, false
}

// stagingPoolBytes is the budget of the upload staging pool (openStaging):
// every rank's gradient norms and the upload buffers of its chunks (taken
// once, from one mapping: nothing lost to fragmentation).
func (e *Engine) stagingPoolBytes() int64 {
	sz := int64(e.precision.Size())
	perRank := units.AlignUp(int64(8*len(e.chunks)), 4096)
	for c := range e.chunks {
		if e.uploads(c) {
			perRank += units.AlignUp(int64(e.optElems(c))*sz, 4096)
		}
	}
	return int64(e.nLocal) * perRank
}
