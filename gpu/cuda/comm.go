package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/strata-ai/strata/gpu"
)

// Collectives without NCCL: peer copies and a rank-order reduction kernel,
// ordered by events and by flags in mapped host memory.
//
// Every rank's call, when enqueued, records an "arrived" event on the
// rank's stream and makes the stream wait until the rank's flag reaches the
// call's sequence number (cuStreamWaitValue32; a spin kernel where the
// driver lacks stream memory operations). The host side joins the call to
// its round; the rank that completes a round checks that the calls agree
// and then drives the collective on the group's own streams, one per rank:
// (1) wait for every rank's arrived event; (2) each rank copies the inputs
// it needs into stream-ordered scratch on its own GPU, then records "read";
// (3) wait for every rank's read; (4) each rank writes its output (copies,
// or reduce_ranks adding the ranks in order 0..N-1 in fp32, float64 for
// F64, dividing by N for Avg, rounding once) and sets its flag, which
// releases the rank's stream. Outputs are written only after every rank has
// read, so outputs may alias inputs; results are identical on every rank
// and run to run. Calls that disagree release the streams without touching
// any buffer and make each rank's next Synchronize return the error.
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

	flagsHost unsafe.Pointer // n uint32 in mapped, pinned host memory
	flagsDev  uint64
	cs        []*Stream // the group's stream on each rank's device
	readEv    []uintptr // one CUevent per rank, in its context
}

func newGroup(b *Backend) (*group, error) {
	n := len(b.devs)
	g := &group{b: b, size: n, rounds: gpu.NewRounds[*Buffer, rankCall]("gpu/cuda", n)}
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
		var ev uintptr
		if err := d.g.do(func() error { return drv.check(drv.cuEventCreate(&ev, cuEventDisableTiming), "cuEventCreate") }); err != nil {
			g.close()
			return nil, fmt.Errorf("gpu/cuda: collectives: %w", err)
		}
		g.readEv = append(g.readEv, ev)
	}
	return g, nil
}

func (g *group) close() error {
	drv := g.b.l.drv
	for r, ev := range g.readEv {
		g.cs[r].dev.g.do(func() error { drv.cuEventDestroy(ev); return nil })
	}
	g.readEv = nil
	if g.flagsHost != nil {
		p := g.flagsHost
		g.flagsHost = nil
		return g.b.devs[0].g.do(func() error { return drv.check(drv.cuMemFreeHost(p), "cuMemFreeHost") })
	}
	return nil
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

// execute drives a complete round on the group's streams.
func (g *group) execute(rd *round) {
	n := g.size
	drv := g.b.l.drv
	err := rd.Err
	if err == nil {
		err = g.transfer(rd)
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

// transfer enqueues the four phases of the round on the group's streams.
func (g *group) transfer(rd *round) error {
	n := g.size
	drv := g.b.l.drv
	c0 := rd.Calls[0]
	// on runs f for rank r with its device's context current.
	on := func(r int, f func(cs *Stream) error) error {
		cs := g.cs[r]
		return cs.dev.g.do(func() error { return f(cs) })
	}
	waitAll := func(cs *Stream, evs func(q int) uintptr) error {
		for q := range n {
			if ev := evs(q); ev != 0 {
				if err := drv.check(drv.cuStreamWaitEvent(cs.h, ev, 0), "cuStreamWaitEvent"); err != nil {
					return err
				}
			}
		}
		return nil
	}
	copyAsync := func(cs *Stream, dst, src uint64, bytes int64) error {
		if bytes == 0 || dst == src {
			return nil
		}
		return drv.check(drv.cuMemcpyAsync(dst, src, uint64(bytes), cs.h), "cuMemcpyAsync %d bytes", bytes)
	}
	temps := make([]uint64, n)
	frees := make([]func(), n)
	defer func() {
		for r, f := range frees {
			if f != nil {
				on(r, func(*Stream) error { f(); return nil })
			}
		}
	}()
	// (1) and (2): wait for all arrivals, read the inputs into scratch.
	for r := range n {
		err := on(r, func(cs *Stream) error {
			if err := waitAll(cs, func(q int) uintptr { return rd.Ranks[q].arrived }); err != nil {
				return err
			}
			cl := rd.Calls[r]
			var size int64
			switch cl.Kind {
			case gpu.CollAllGather, gpu.CollAllReduce:
				size = int64(n) * cl.Send.Bytes()
			case gpu.CollReduceScatter:
				size = int64(n) * cl.Recv.Bytes()
			case gpu.CollBroadcast:
				size = cl.Send.Bytes()
			}
			if size > 0 {
				p, free, err := cs.scratch(size)
				if err != nil {
					return err
				}
				temps[r], frees[r] = p, free
			}
			switch cl.Kind {
			case gpu.CollAllGather, gpu.CollAllReduce:
				seg := cl.Send.Bytes()
				for q := range n {
					if err := copyAsync(cs, temps[r]+uint64(int64(q)*seg), rd.Calls[q].Send.Ptr(), seg); err != nil {
						return err
					}
				}
			case gpu.CollReduceScatter:
				seg := cl.Recv.Bytes()
				for q := range n {
					if err := copyAsync(cs, temps[r]+uint64(int64(q)*seg), rd.Calls[q].Send.Ptr()+uint64(int64(r)*seg), seg); err != nil {
						return err
					}
				}
			case gpu.CollBroadcast:
				if err := copyAsync(cs, temps[r], rd.Calls[cl.Root].Send.Ptr(), size); err != nil {
					return err
				}
			}
			return drv.check(drv.cuEventRecord(g.readEv[r], cs.h), "cuEventRecord")
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	// (3) and (4): wait for all reads, write the outputs.
	for r := range n {
		err := on(r, func(cs *Stream) error {
			if err := waitAll(cs, func(q int) uintptr { return g.readEv[q] }); err != nil {
				return err
			}
			cl := rd.Calls[r]
			rd.Ranks[r].s.dev.front.Links.Collective.Add(gpu.RingBytes(cl, r, n))
			switch cl.Kind {
			case gpu.CollAllGather, gpu.CollBroadcast:
				return copyAsync(cs, cl.Recv.Ptr(), temps[r], cl.Recv.Bytes())
			case gpu.CollReduceScatter, gpu.CollAllReduce:
				avg := int32(0)
				if cl.Op == gpu.Avg {
					avg = 1
				}
				m := int64(cl.Recv.Len())
				return cs.dev.g.launch(cs.h, "reduce_ranks", cs.dev.g.gridFor(m, 256), 256, 0, devPtr(temps[r]), dt(cl.Recv), m, int32(n), cl.Recv.p(), avg)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.Seq, c0.Kind, r, err)
		}
	}
	return nil
}
