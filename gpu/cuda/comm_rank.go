package cuda

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
)

// The rank-order path: the deterministic collectives. Each rank reads what
// it needs of its peers with peer copies (cuMemcpyAsync over unified
// addressing; with peer access enabled, peer.go, they go over NVLink or
// PCIe directly, else through host memory), in rotated order (readOrder:
// rank r reads r+1 first), into its place by rank; reductions add the
// places in rank order 0..N-1 in fp32 (float64 for F64), divide by N for
// Avg and round once (reduce_ranks), so the results are bit-identical on
// every rank and run to run, whatever the order of the reads.
//
//   - AllGather: each rank copies every peer's send into its recv. Where a
//     rank's send overlaps its recv other than in place (send = its own
//     slot of recv), every rank stages its inputs through scratch and
//     writes its recv after every rank's reads.
//   - Broadcast: each rank copies the root's buffer.
//   - ReduceScatter: each rank reads its segment of every rank's send
//     into scratch, then reduces into its recv (after every rank's reads
//     where a recv overlaps its send other than in place).
//   - AllReduce, in two phases: rank r reads slice r (sliceOf) of every
//     rank's buffer into scratch and reduces it into slice r of its own;
//     after every rank's phase one, each copies the other ranks' reduced
//     slices. Every element is reduced once, in rank order, as a
//     one-phase AllReduce would; the scratch is n slices (about the buffer,
//     not n times it) and each rank sends 2(n−1)/n of it, a ring's figure.
//
// Barriers between phases are events (midEv, doneEv): a rank writes what
// another rank reads only after that rank's reads, and no rank is
// released (its flag set) before every rank has stopped reading peers'
// memory, so outputs may alias inputs.

// scratchBuf is one rank's scratch: stream-ordered pool memory on the
// group's stream of the rank, charged to the rank's device budget as
// workspace ("collective scratch") for as long as it is held, grown to the
// largest collective's need and kept until the backend closes, so that
// after the first step no collective allocates.
type scratchBuf struct {
	ptr   uint64
	bytes int64
	acct  *gpu.Allocation
}

// scratchPurpose is the scratch's purpose in the device's accounting.
const scratchPurpose = "collective scratch"

// scratch returns at least bytes of rank r's scratch, growing it on cs
// (stream-ordered: the old memory is freed after the work queued before,
// and no call waits for the device). Called with r's context current. A
// request past the device budget is a *gpu.OutOfMemoryError.
func (g *group) scratchFor(r int, cs *Stream, bytes int64) (uint64, error) {
	sb := &g.scratch[r]
	if bytes == 0 || bytes <= sb.bytes {
		return sb.ptr, nil
	}
	drv := g.b.l.drv
	front := cs.dev.front
	if sb.acct != nil {
		if err := drv.check(drv.cuMemFreeAsync(sb.ptr, cs.h), "cuMemFreeAsync collective scratch"); err != nil {
			return 0, err
		}
		front.Release(sb.acct)
		*sb = scratchBuf{}
	}
	acct, err := front.Alloc(int((bytes+7)/8), gpu.F64, gpu.Tag{Kind: gpu.Workspace, Purpose: scratchPurpose})
	if err != nil {
		return 0, err
	}
	var p uint64
	res := drv.cuMemAllocAsync(&p, uint64(acct.SizeBytes), cs.h)
	if res != cudaSuccess {
		front.Refund(acct)
		if res == cudaOutOfMemory {
			return 0, front.OutOfMemory(acct)
		}
		return 0, drv.check(res, "cuMemAllocAsync %d bytes of collective scratch", acct.SizeBytes)
	}
	*sb = scratchBuf{ptr: p, bytes: acct.SizeBytes, acct: acct}
	return p, nil
}

// freeScratch frees every rank's scratch on its stream (before the
// backend destroys the streams) and releases its charge.
func (g *group) freeScratch() error {
	drv := g.b.l.drv
	var first error
	for r := range g.scratch {
		sb := g.scratch[r]
		if sb.acct == nil {
			continue
		}
		err := g.on(r, func(cs *Stream) error {
			return drv.check(drv.cuMemFreeAsync(sb.ptr, cs.h), "cuMemFreeAsync collective scratch")
		})
		if err != nil && first == nil {
			first = err
		}
		g.cs[r].dev.front.Release(sb.acct)
		g.scratch[r] = scratchBuf{}
	}
	return first
}

// rankOrderTransfer enqueues a round on the group's streams.
func (g *group) rankOrderTransfer(rd *round) error {
	n := g.size
	c0 := rd.Calls[0]
	all := readOrder(0, n) // every rank, for the barriers
	arrivals := func(q int) uintptr { return rd.Ranks[q].arrived }
	// staged: some rank's send and recv overlap other than in place, so
	// outputs wait for every rank's reads (AllGather stages its inputs
	// through scratch, ReduceScatter reduces in phase two).
	staged := false
	for r, cl := range rd.Calls {
		switch cl.Kind {
		case gpu.CollAllGather:
			staged = staged || !inPlaceOrApart(bufExtent(cl.Recv), bufExtent(cl.Send), r)
		case gpu.CollReduceScatter:
			staged = staged || !inPlaceOrApart(bufExtent(cl.Send), bufExtent(cl.Recv), r)
		}
	}
	// Scratch first, so that a round whose scratch does not fit fails
	// before it touches any buffer.
	for r := range n {
		err := g.on(r, func(cs *Stream) error {
			_, err := g.scratchFor(r, cs, rankOrderScratchBytes(rd.Calls[r], r, n, staged))
			return err
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	// Phase one: wait for every arrival, read (and, for ReduceScatter and
	// AllReduce's first phase, reduce), record midEv.
	for r := range n {
		err := g.on(r, func(cs *Stream) error {
			if err := g.waitEvents(cs, all, arrivals); err != nil {
				return err
			}
			if err := g.phaseOne(rd, r, cs, staged); err != nil {
				return err
			}
			return g.record(g.midEv[r], cs)
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	// Phase two, after every rank's phase one: staged AllGather's writes,
	// AllReduce's gather of the reduced slices. Then doneEv, and every
	// rank waits for every doneEv before its release.
	for r := range n {
		err := g.on(r, func(cs *Stream) error {
			if err := g.waitEvents(cs, all, func(q int) uintptr { return g.midEv[q] }); err != nil {
				return err
			}
			if err := g.phaseTwo(rd, r, cs, staged); err != nil {
				return err
			}
			return g.record(g.doneEv[r], cs)
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	for r := range n {
		err := g.on(r, func(cs *Stream) error {
			return g.waitEvents(cs, all, func(q int) uintptr { return g.doneEv[q] })
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	g.countLinks(rd)
	return nil
}

func (g *group) record(ev uintptr, cs *Stream) error {
	drv := g.b.l.drv
	return drv.check(drv.cuEventRecord(ev, cs.h), "cuEventRecord")
}

// phaseOne is rank r's reads of the round, on cs.
func (g *group) phaseOne(rd *round, r int, cs *Stream, staged bool) error {
	n := g.size
	cl := rd.Calls[r]
	tmp := g.scratch[r].ptr // as large as the round needs (rankOrderTransfer)
	switch cl.Kind {
	case gpu.CollAllGather:
		seg := cl.Send.Bytes()
		for _, q := range readOrder(r, n) {
			dst := cl.Recv.Ptr() + uint64(int64(q)*seg)
			if staged {
				dst = tmp + uint64(int64(q)*seg)
			}
			if err := g.copyAsync(cs, dst, rd.Calls[q].Send.Ptr(), seg); err != nil {
				return err
			}
		}
	case gpu.CollBroadcast:
		return g.copyAsync(cs, cl.Recv.Ptr(), rd.Calls[cl.Root].Send.Ptr(), cl.Recv.Bytes())
	case gpu.CollReduceScatter:
		seg := cl.Recv.Bytes()
		for _, q := range readOrder(r, n) {
			if err := g.copyAsync(cs, tmp+uint64(int64(q)*seg), rd.Calls[q].Send.Ptr()+uint64(int64(r)*seg), seg); err != nil {
				return err
			}
		}
		if !staged {
			return g.reduce(cs, cl, tmp, cl.Recv.Ptr(), int64(cl.Recv.Len()))
		}
	case gpu.CollAllReduce:
		sl := sliceOf(cl.Send.Len(), n, r)
		if sl.n == 0 {
			return nil
		}
		es := int64(cl.Send.DType().Size())
		seg, off := int64(sl.n)*es, uint64(int64(sl.off)*es)
		for _, q := range readOrder(r, n) {
			if err := g.copyAsync(cs, tmp+uint64(int64(q)*seg), rd.Calls[q].Send.Ptr()+off, seg); err != nil {
				return err
			}
		}
		return g.reduce(cs, cl, tmp, cl.Recv.Ptr()+off, int64(sl.n))
	}
	return nil
}

// phaseTwo is rank r's writes that must follow every rank's phase one.
func (g *group) phaseTwo(rd *round, r int, cs *Stream, staged bool) error {
	n := g.size
	cl := rd.Calls[r]
	switch {
	case cl.Kind == gpu.CollAllGather && staged:
		return g.copyAsync(cs, cl.Recv.Ptr(), g.scratch[r].ptr, cl.Recv.Bytes())
	case cl.Kind == gpu.CollReduceScatter && staged:
		return g.reduce(cs, cl, g.scratch[r].ptr, cl.Recv.Ptr(), int64(cl.Recv.Len()))
	case cl.Kind == gpu.CollAllReduce:
		es := int64(cl.Send.DType().Size())
		for _, q := range readOrder(r, n) {
			if q == r {
				continue
			}
			sl := sliceOf(cl.Send.Len(), n, q)
			off := uint64(int64(sl.off) * es)
			if err := g.copyAsync(cs, cl.Recv.Ptr()+off, rd.Calls[q].Send.Ptr()+off, int64(sl.n)*es); err != nil {
				return err
			}
		}
	}
	return nil
}

// reduce enqueues reduce_ranks: out[i] = tmp[0][i] + ... + tmp[n-1][i]
// over m elements of cl's dtype, in rank order.
func (g *group) reduce(cs *Stream, cl call, tmp, out uint64, m int64) error {
	avg := int32(0)
	if cl.Op == gpu.Avg {
		avg = 1
	}
	return cs.dev.g.launch(cs.h, "reduce_ranks", cs.dev.g.gridFor(m, 256), 256, 0, devPtr(tmp), dt(cl.Recv), m, int32(g.size), devPtr(out), avg)
}
