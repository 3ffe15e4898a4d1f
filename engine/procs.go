package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Procs is the processes of a job whose ranks are split among them, as
// the engine uses them (package dist implements it on MPI): process q of
// Procs() holds the global ranks q·L .. q·L+L−1, L = len(devices) in every
// process. The devices' collectives cross processes in their backend
// (gpu/cpu's Options.Net); the engine itself exchanges the few host values
// that ranks of one process read from each other: the micro-batches'
// losses and the gradient's sums of squares (so that every process clips
// and skips alike), evaluation losses, and the shards of the weights it
// hands out (whole chunks: Params, Master, MasterChunks). A checkpoint is
// written by every process, each its ranks' files (checkpoint.SaveJob).
// Each call is a collective of every process, made in the same order by
// all.
type Procs interface {
	Procs() int
	Proc() int
	// Allgather: recv (Procs × len(send)) holds every process's send in
	// process order.
	Allgather(send, recv []byte) error
	// Bcast: buf takes process root's bytes.
	Bcast(buf []byte, root int) error
}

// hostBudget is this process's share of strata.host_budget: the node's
// budget over its processes (Options.NodeProcs); 0 without a budget.
func (e *Engine) hostBudget() int64 {
	return e.cfg.Strata.HostBudgetBytes / int64(max(1, e.opts.NodeProcs))
}

// shareBytes fills whole (N blocks of per bytes, block g global rank g's)
// from every process: this process's ranks' blocks are filled already.
func (e *Engine) shareBytes(whole []byte, per int) error {
	p := e.opts.Procs
	if p == nil {
		return nil
	}
	lo, hi := e.base*per, (e.base+e.nLocal)*per
	mine := bytes.Clone(whole[lo:hi]) // MPI forbids a send inside the receive buffer
	if err := p.Allgather(mine, whole[:p.Procs()*len(mine)]); err != nil {
		return fmt.Errorf("engine: exchange between processes: %w", err)
	}
	return nil
}

// shareF64 is shareBytes of float64 values, per values per rank (the
// processes' byte order is one: MPI moves the bytes as they are).
func (e *Engine) shareF64(vals []float64, per int) error {
	if e.opts.Procs == nil || len(vals) == 0 {
		return nil
	}
	return e.shareBytes(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(vals))), 8*len(vals)), 8*per)
}

// checkProcs refuses a job whose processes were given different configs
// or device counts: each sends the SHA-256 of its resolved config and its
// device count, and every process compares them with process 0's.
func checkProcs(p Procs, cfgJSON []byte, local int) error {
	sum := sha256.Sum256(cfgJSON)
	mine := binary.LittleEndian.AppendUint64(sum[:], uint64(local))
	all := make([]byte, p.Procs()*len(mine))
	if err := p.Allgather(mine, all); err != nil {
		return fmt.Errorf("engine: comparing the processes' configs: %w", err)
	}
	w := len(mine)
	for q := 1; q < p.Procs(); q++ {
		got := all[q*w : (q+1)*w]
		if n, n0 := binary.LittleEndian.Uint64(got[32:]), binary.LittleEndian.Uint64(all[32:w]); n != n0 {
			return fmt.Errorf("engine: process %d drives %d device(s), process 0 %d: give every process the same --devices", q, n, n0)
		}
		if !bytes.Equal(got[:32], all[:32]) {
			return fmt.Errorf("engine: process %d's resolved config differs from process 0's (SHA-256 %x, process 0 %x): give every process the same config and flags", q, got[:8], all[:8])
		}
	}
	return nil
}
