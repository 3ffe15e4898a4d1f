package cuda

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

type collKind uint8

const (
	kindAllGather collKind = iota
	kindReduceScatter
	kindAllReduce
	kindBroadcast
	kindBarrier
)

func (k collKind) String() string {
	return [...]string{"all-gather", "reduce-scatter", "all-reduce", "broadcast", "barrier"}[k]
}

type call struct {
	kind       collKind
	send, recv *Buffer
	op         gpu.ReduceOp
	root       int
	s          *Stream // the rank's stream
	arrived    uintptr // CUevent recorded on s at enqueue (0 if that failed)
}

type round struct {
	seq     uint64
	calls   []call
	arrived int
}

type group struct {
	b      *Backend
	n      int
	mu     sync.Mutex
	rounds map[uint64]*round

	flagsHost unsafe.Pointer // n uint32 in mapped, pinned host memory
	flagsDev  uint64
	cs        []*Stream // the group's stream on each rank's device
	readEv    []uintptr // one CUevent per rank, in its context
}

func newGroup(b *Backend) (*group, error) {
	n := len(b.devs)
	g := &group{b: b, n: n, rounds: map[uint64]*round{}}
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

// Comm is one rank of a communicator over the devices of one backend.
type Comm struct {
	g    *group
	rank int
	dev  *Device
	seq  atomic.Uint64
}

func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.g.n }

func (c *Comm) reducible(b *Buffer, what string) {
	if b.dt != gpu.F32 && b.dt != gpu.BF16 && b.dt != gpu.F64 {
		panic(fmt.Sprintf("gpu/cuda: %s: cannot reduce %s (want f32, bf16 or f64)", what, b.dt))
	}
}

func checkOp(op gpu.ReduceOp) {
	if op != gpu.Sum && op != gpu.Avg {
		panic(fmt.Sprintf("gpu/cuda: unknown reduce op %d", op))
	}
}

// AllGather: rank r's send lands in recv[r*n:(r+1)*n] on every rank.
func (c *Comm) AllGather(s gpu.Stream, send, recv gpu.Buffer) {
	sb, rb := c.dev.buf(send, "all-gather send"), c.dev.buf(recv, "all-gather recv")
	if sb.dt != rb.dt || rb.n != c.g.n*sb.n {
		panic(fmt.Sprintf("gpu/cuda: all-gather: recv %d×%s must be %d × send %d×%s", rb.n, rb.dt, c.g.n, sb.n, sb.dt))
	}
	c.enqueue(s, call{kind: kindAllGather, send: sb, recv: rb})
}

// ReduceScatter: rank r receives the reduction of send[r*n:(r+1)*n].
func (c *Comm) ReduceScatter(s gpu.Stream, send, recv gpu.Buffer, op gpu.ReduceOp) {
	sb, rb := c.dev.buf(send, "reduce-scatter send"), c.dev.buf(recv, "reduce-scatter recv")
	if sb.dt != rb.dt || sb.n != c.g.n*rb.n {
		panic(fmt.Sprintf("gpu/cuda: reduce-scatter: send %d×%s must be %d × recv %d×%s", sb.n, sb.dt, c.g.n, rb.n, rb.dt))
	}
	c.reducible(sb, "reduce-scatter")
	checkOp(op)
	c.enqueue(s, call{kind: kindReduceScatter, send: sb, recv: rb, op: op})
}

// AllReduce reduces buf over ranks in place.
func (c *Comm) AllReduce(s gpu.Stream, buf gpu.Buffer, op gpu.ReduceOp) {
	b := c.dev.buf(buf, "all-reduce buffer")
	c.reducible(b, "all-reduce")
	checkOp(op)
	c.enqueue(s, call{kind: kindAllReduce, send: b, recv: b, op: op})
}

// Broadcast copies root's buf into every rank's buf.
func (c *Comm) Broadcast(s gpu.Stream, buf gpu.Buffer, root int) {
	b := c.dev.buf(buf, "broadcast buffer")
	if root < 0 || root >= c.g.n {
		panic(fmt.Sprintf("gpu/cuda: broadcast root %d outside [0, %d)", root, c.g.n))
	}
	c.enqueue(s, call{kind: kindBroadcast, send: b, recv: b, root: root})
}

// Barrier completes when every rank has reached it.
func (c *Comm) Barrier(s gpu.Stream) { c.enqueue(s, call{kind: kindBarrier}) }

// flag returns the device address of rank r's flag.
func (g *group) flag(r int) uint64 { return g.flagsDev + uint64(4*r) }

func (c *Comm) enqueue(gs gpu.Stream, cl call) {
	s := c.dev.stream(gs)
	cl.s = s
	seq := c.seq.Add(1)
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
		cl.arrived = ev
		return nil
	})
	// Then the rank's stream waits for its flag, which the round's
	// release sets. The rank that completes the round enqueues that wait
	// after the release (execute), so its stream waits on device work
	// alone; with one rank that is every call. A rank that arrives earlier
	// waits on a release the host enqueues later: while it does, a driver
	// call that waits for the whole GPU to go idle (cuMemFree) would wait
	// forever on the driver thread the release needs (bench/README-cuda.md).
	waitFlag := func() {
		s.run(func() error {
			if drv.hasStreamMemOps {
				return drv.check(drv.cuStreamWaitValue32(s.h, c.g.flag(c.rank), uint32(seq), cuStreamWaitValueGEQ), "cuStreamWaitValue32")
			}
			return gc.launch(s.h, "wait_flag", 1, 1, 0, devPtr(c.g.flag(c.rank)), uint32(seq))
		})
	}
	rd := c.g.join(seq, c.rank, cl)
	if rd == nil {
		waitFlag()
		return
	}
	c.g.execute(rd)
	waitFlag()
}

// join adds rank's call to round seq and returns the round when it is
// complete (to the caller that completed it).
func (g *group) join(seq uint64, rank int, cl call) *round {
	g.mu.Lock()
	defer g.mu.Unlock()
	rd := g.rounds[seq]
	if rd == nil {
		rd = &round{seq: seq, calls: make([]call, g.n)}
		g.rounds[seq] = rd
	}
	rd.calls[rank] = cl
	rd.arrived++
	if rd.arrived < g.n {
		return nil
	}
	delete(g.rounds, seq)
	return rd
}

// check says how the ranks' calls disagree.
func (rd *round) check() error {
	c0 := rd.calls[0]
	for r, c := range rd.calls[1:] {
		r++
		var what string
		switch {
		case c.kind != c0.kind:
			what = fmt.Sprintf("rank %d called %s, rank 0 %s", r, c.kind, c0.kind)
		case c.kind == kindBarrier:
			continue
		case c.send.dt != c0.send.dt || c.send.n != c0.send.n:
			what = fmt.Sprintf("rank %d has %d elements of %s, rank 0 %d of %s", r, c.send.n, c.send.dt, c0.send.n, c0.send.dt)
		case c.op != c0.op:
			what = fmt.Sprintf("rank %d reduces with op %d, rank 0 with %d", r, c.op, c0.op)
		case c.root != c0.root:
			what = fmt.Sprintf("rank %d has root %d, rank 0 root %d", r, c.root, c0.root)
		default:
			continue
		}
		return fmt.Errorf("gpu/cuda: collective %d (%s): calls disagree: %s", rd.seq, c0.kind, what)
	}
	return nil
}

// execute drives a complete round on the group's streams.
func (g *group) execute(rd *round) {
	n := g.n
	drv := g.b.l.drv
	err := rd.check()
	if err == nil {
		err = g.transfer(rd)
	}
	if err != nil {
		for _, cl := range rd.calls {
			cl.s.fail(err)
		}
	}
	// Release every rank, also after an error, so that no stream hangs.
	var errs []error
	for r := range n {
		cs := g.cs[r]
		errs = append(errs, cs.dev.g.do(func() error {
			if cl := rd.calls[r]; cl.arrived != 0 {
				drv.cuEventDestroy(cl.arrived) // released once the waits that use it are done
			}
			if drv.hasStreamMemOps {
				return drv.check(drv.cuStreamWriteValue32(cs.h, g.flag(r), uint32(rd.seq), 0), "cuStreamWriteValue32")
			}
			return cs.dev.g.launch(cs.h, "write_flag", 1, 1, 0, devPtr(g.flag(r)), uint32(rd.seq))
		}))
	}
	if e := errors.Join(errs...); e != nil {
		for _, cl := range rd.calls {
			cl.s.fail(fmt.Errorf("gpu/cuda: collective %d: release: %w", rd.seq, e))
		}
	}
}

// transfer enqueues the four phases of the round on the group's streams.
func (g *group) transfer(rd *round) error {
	n := g.n
	drv := g.b.l.drv
	c0 := rd.calls[0]
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
			if err := waitAll(cs, func(q int) uintptr { return rd.calls[q].arrived }); err != nil {
				return err
			}
			cl := rd.calls[r]
			var size int64
			switch cl.kind {
			case kindAllGather, kindAllReduce:
				size = int64(n) * cl.send.Bytes()
			case kindReduceScatter:
				size = int64(n) * cl.recv.Bytes()
			case kindBroadcast:
				size = cl.send.Bytes()
			}
			if size > 0 {
				p, free, err := cs.scratch(size)
				if err != nil {
					return err
				}
				temps[r], frees[r] = p, free
			}
			switch cl.kind {
			case kindAllGather, kindAllReduce:
				seg := cl.send.Bytes()
				for q := range n {
					if err := copyAsync(cs, temps[r]+uint64(int64(q)*seg), rd.calls[q].send.Ptr(), seg); err != nil {
						return err
					}
				}
			case kindReduceScatter:
				seg := cl.recv.Bytes()
				for q := range n {
					if err := copyAsync(cs, temps[r]+uint64(int64(q)*seg), rd.calls[q].send.Ptr()+uint64(int64(r)*seg), seg); err != nil {
						return err
					}
				}
			case kindBroadcast:
				if err := copyAsync(cs, temps[r], rd.calls[cl.root].send.Ptr(), size); err != nil {
					return err
				}
			}
			return drv.check(drv.cuEventRecord(g.readEv[r], cs.h), "cuEventRecord")
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.seq, c0.kind, r, err)
		}
	}
	// (3) and (4): wait for all reads, write the outputs.
	for r := range n {
		err := on(r, func(cs *Stream) error {
			if err := waitAll(cs, func(q int) uintptr { return g.readEv[q] }); err != nil {
				return err
			}
			cl := rd.calls[r]
			d := cl.s.dev
			switch cl.kind {
			case kindAllGather:
				d.coll.Add(int64(n-1) * cl.send.Bytes())
				return copyAsync(cs, cl.recv.Ptr(), temps[r], cl.recv.Bytes())
			case kindBroadcast:
				if r != (cl.root+n-1)%n || n == 1 {
					d.coll.Add(cl.send.Bytes())
				}
				return copyAsync(cs, cl.recv.Ptr(), temps[r], cl.recv.Bytes())
			case kindReduceScatter, kindAllReduce:
				if cl.kind == kindReduceScatter {
					d.coll.Add(int64(n-1) * cl.recv.Bytes())
				} else {
					d.coll.Add(2 * int64(n-1) * cl.send.Bytes() / int64(n))
				}
				avg := int32(0)
				if cl.op == gpu.Avg {
					avg = 1
				}
				m := int64(cl.recv.n)
				return cs.dev.g.launch(cs.h, "reduce_ranks", cs.dev.g.gridFor(m, 256), 256, 0, devPtr(temps[r]), dt(cl.recv), m, int32(n), cl.recv.p(), avg)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("gpu/cuda: collective %d (%s) rank %d: %w", rd.seq, c0.kind, r, err)
		}
	}
	return nil
}
