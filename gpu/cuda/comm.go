package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
)

// Collectives: rounds, ordered by events and by flags in mapped host
// memory, executed by one of two transports: the rank-order path
// (comm_rank.go: peer copies and a rank-order reduction kernel,
// deterministic, the default) or NCCL (comm_nccl.go, Options.NCCL).
//
// Every rank's call, when enqueued, records an "arrived" event on the
// rank's stream and makes the stream wait until the rank's flag reaches the
// call's sequence number (cuStreamWaitValue32; a spin kernel where the
// driver lacks stream memory operations). The host side joins the call to
// its round; the rank that completes a round checks that the calls agree
// and then drives the collective on the group's own streams, one per rank,
// each of which first waits for the arrivals it needs; then it sets every
// rank's flag on the group's stream of that rank, which releases the
// rank's stream once the collective's work there is done. Calls that
// disagree release the streams without touching any buffer and make each
// rank's next Synchronize return the error.
//
// Link counters count what a ring algorithm would send from each rank, as
// gpu/cpu does.

// call is one rank's checked call; rankCall is what the backend attaches
// to it in the round.
type call = gpu.Call[*Buffer]

type rankCall struct {
	s       *Stream // the rank's stream
	arrived uintptr // CUevent recorded on s at enqueue (0 if that failed)
}

type round = gpu.Round[*Buffer, rankCall]

type group struct {
	b      *Backend
	size   int
	rounds *gpu.Rounds[*Buffer, rankCall]
	nccl   *ncclComms // nil: the rank-order path
	// acrossProcesses: the NCCL communicator is a job's of several
	// processes (Options.Net); a Barrier would wait for this process's
	// ranks only, and is refused.
	acrossProcesses bool

	flagsHost unsafe.Pointer // n uint32 in mapped, pinned host memory
	flagsDev  uint64
	cs        []*Stream // the group's stream on each rank's device
	// Two events per rank, in its context, for the rank-order path's
	// barriers between phases: midEv after a rank's reads (or its part of
	// an AllReduce), doneEv when it no longer reads any peer's memory.
	midEv, doneEv []uintptr
	scratchMu     sync.Mutex
	scratch       []scratchBuf // the rank-order path's scratch, per rank (comm_rank.go)
}

func newGroup(b *Backend) (*group, error) {
	n := len(b.devs)
	g := &group{b: b, size: n, rounds: gpu.NewRounds[*Buffer, rankCall]("gpu/cuda", n), scratch: make([]scratchBuf, n)}
	g0 := b.devs[0].g
	drv := g0.l.drv
	err := g0.do(func() error {
		if err := drv.check(drv.cuMemHostAlloc(&g.flagsHost, uint64(4*n), cuMemHostAllocPortable|cuMemHostAllocDeviceMap), "cuMemHostAlloc collective flags"); err != nil {
			return err
		}
		clear(unsafe.Slice((*uint32)(g.flagsHost), n))
		return drv.check(drv.cuMemHostGetDevicePointer(&g.flagsDev, g.flagsHost, 0), "cuMemHostGetDevicePointer")
	})
	if err != nil {
		return nil, fmt.Errorf("gpu/cuda: collectives: %w", err)
	}
	for _, d := range b.devs {
		s, err := b.newStream(d)
		if err != nil {
			g.close()
			return nil, err
		}
		g.cs = append(g.cs, s)
		var mid, done uintptr
		err = d.g.do(func() error {
			if err := drv.check(drv.cuEventCreate(&mid, cuEventDisableTiming), "cuEventCreate"); err != nil {
				return err
			}
			return drv.check(drv.cuEventCreate(&done, cuEventDisableTiming), "cuEventCreate")
		})
		if mid != 0 {
			g.midEv = append(g.midEv, mid)
		}
		if done != 0 {
			g.doneEv = append(g.doneEv, done)
		}
		if err != nil {
			g.close()
			return nil, fmt.Errorf("gpu/cuda: collectives: %w", err)
		}
	}
	return g, nil
}

// close destroys the NCCL communicators and the events and frees the
// flags. The streams are the backend's (destroyed before, synchronized).
func (g *group) close() error {
	drv := g.b.l.drv
	var errs []error
	if g.nccl != nil {
		errs = append(errs, g.nccl.destroy(g.b))
		g.nccl = nil
	}
	for _, evs := range [][]uintptr{g.midEv, g.doneEv} {
		for r, ev := range evs {
			g.b.devs[r].g.do(func() error { drv.cuEventDestroy(ev); return nil })
		}
	}
	g.midEv, g.doneEv = nil, nil
	if g.flagsHost != nil {
		p := g.flagsHost
		g.flagsHost = nil
		errs = append(errs, g.b.devs[0].g.do(func() error { return drv.check(drv.cuMemFreeHost(p), "cuMemFreeHost") }))
	}
	return errors.Join(errs...)
}

// comm is one rank of a communicator over the devices of one backend,
// behind the front end's checks (gpu.CheckedComm).
type comm struct {
	g    *group
	rank int
	dev  *Device
}

// flag returns the device address of rank r's flag.
func (g *group) flag(r int) uint64 { return g.flagsDev + uint64(4*r) }

// Issue enqueues the rank's part of round seq on s.
func (c *comm) Issue(s *Stream, seq uint64, cl call) {
	rc := rankCall{s: s}
	drv := c.dev.g.l.drv
	gc := c.dev.g
	// The rank's arrival: the round's transfers wait for this event.
	s.run(func() error {
		var ev uintptr
		if err := drv.check(drv.cuEventCreate(&ev, cuEventDisableTiming), "cuEventCreate"); err != nil {
			return err
		}
		if err := drv.check(drv.cuEventRecord(ev, s.h), "cuEventRecord"); err != nil {
			drv.cuEventDestroy(ev)
			return err
		}
		rc.arrived = ev
		return nil
	})
	// Then the rank's stream waits for its flag, which the round's
	// release sets. The rank that completes the round enqueues that wait
	// after the release (execute), so its stream waits on device work
	// alone; with one rank that is every call. A rank that arrives earlier
	// waits on a release the host enqueues later: while it does, a driver
	// call that waits for the whole GPU to go idle (cuMemFree) would wait
	// forever on the driver thread the release needs (gpu/cuda/README.md).
	waitFlag := func() {
		s.run(func() error {
			if drv.hasStreamMemOps {
				return drv.check(drv.cuStreamWaitValue32(s.h, c.g.flag(c.rank), uint32(seq), cuStreamWaitValueGEQ), "cuStreamWaitValue32")
			}
			return gc.launch(s.h, "wait_flag", 1, 1, 0, devPtr(c.g.flag(c.rank)), uint32(seq))
		})
	}
	rd := c.g.rounds.Join(seq, c.rank, cl, rc)
	if rd == nil {
		waitFlag()
		return
	}
	c.g.execute(rd)
	waitFlag()
}

// execute drives a complete round on the group's streams. Rounds are
// executed one at a time: the rank that completes round k joins round k+1
// only after executing k, and round k+1 completes only when every rank
// has joined it.
func (g *group) execute(rd *round) {
	n := g.size
	drv := g.b.l.drv
	err := rd.Err
	if err == nil && g.acrossProcesses && rd.Calls[0].Kind == gpu.CollBarrier {
		err = fmt.Errorf("gpu/cuda: collective %d: a barrier across processes is not built (NCCL has none); the engine issues none", rd.Seq)
	}
	if err == nil {
		if g.nccl != nil {
			err = g.ncclTransfer(rd)
		} else {
			err = g.rankOrderTransfer(rd)
		}
	}
	if err != nil {
		for _, rc := range rd.Ranks {
			rc.s.fail(err)
		}
	}
	// Release every rank, also after an error, so that no stream hangs.
	var errs []error
	for r := range n {
		cs := g.cs[r]
		errs = append(errs, cs.dev.g.do(func() error {
			if rc := rd.Ranks[r]; rc.arrived != 0 {
				drv.cuEventDestroy(rc.arrived) // released once the waits that use it are done
			}
			if drv.hasStreamMemOps {
				return drv.check(drv.cuStreamWriteValue32(cs.h, g.flag(r), uint32(rd.Seq), 0), "cuStreamWriteValue32")
			}
			return cs.dev.g.launch(cs.h, "write_flag", 1, 1, 0, devPtr(g.flag(r)), uint32(rd.Seq))
		}))
	}
	if e := errors.Join(errs...); e != nil {
		for _, rc := range rd.Ranks {
			rc.s.fail(fmt.Errorf("gpu/cuda: collective %d: release: %w", rd.Seq, e))
		}
	}
}

// on runs f for rank r with its device's context current.
func (g *group) on(r int, f func(cs *Stream) error) error {
	cs := g.cs[r]
	return cs.dev.g.do(func() error { return f(cs) })
}

// waitEvents makes cs wait for the events evs(q) of the ranks q in qs
// (0: none).
func (g *group) waitEvents(cs *Stream, qs []int, evs func(q int) uintptr) error {
	drv := g.b.l.drv
	for _, q := range qs {
		if ev := evs(q); ev != 0 {
			if err := drv.check(drv.cuStreamWaitEvent(cs.h, ev, 0), "cuStreamWaitEvent"); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyAsync enqueues a device-to-device copy on cs (nothing when empty or
// in place).
func (g *group) copyAsync(cs *Stream, dst, src uint64, bytes int64) error {
	if bytes == 0 || dst == src {
		return nil
	}
	drv := g.b.l.drv
	return drv.check(drv.cuMemcpyAsync(dst, src, uint64(bytes), cs.h), "cuMemcpyAsync %d bytes", bytes)
}

// bufExtent is the device addresses a buffer covers.
func bufExtent(b *Buffer) extent { return extent{b.Ptr(), uint64(b.Bytes())} }

// countLinks adds each rank's ring figure to its collective counter.
func (g *group) countLinks(rd *round) {
	for r, cl := range rd.Calls {
		rd.Ranks[r].s.dev.front.Links.Collective.Add(gpu.RingBytes(cl, r, g.size))
	}
}
