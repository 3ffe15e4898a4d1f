package cpu

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/strata-ai/strata/gpu"
)

// Collectives. Every rank's call is enqueued on its stream; when the stream
// reaches it, the rank joins the round of that call's sequence number (the
// n-th collective call on a Comm belongs to round n). A round runs in three
// steps: (1) all ranks arrive and the last one checks that the calls agree
// (kind, dtype, length, op, root) — if not, every rank's stream gets the
// error and no output is written; (2) each rank reads the inputs it needs
// into a temporary (AllReduce: rank r reduces segment r of the buffer into
// a shared temporary); (3) after all ranks have read, each rank writes its
// own output. Nothing is written while another rank may still read, so
// outputs may alias inputs.
//
// Reductions: s = x_0; s += x_1; ...; s += x_{N-1} in fp32 (float64 for F64
// buffers), then Avg divides: s / float32(N) (a division, not a
// multiplication by 1/N), then one rounding on store (bf16: nearest even).
// Every rank therefore holds identical bits, and runs are reproducible.
//
// Link counters count the bytes a ring algorithm would send from each rank:
// AllGather (N-1)*send, ReduceScatter (N-1)*recv, AllReduce 2*(N-1)/N*buf,
// Broadcast buf for every rank but the one before root in the ring.

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
	send, recv *Buffer // AllReduce and Broadcast: send == recv == buf
	op         gpu.ReduceOp
	root       int
}

type round struct {
	seq      uint64
	calls    []call
	arrived  int
	all      chan struct{} // closed when every rank has arrived
	err      error         // set before all is closed
	read     int
	allRead  chan struct{} // closed when every rank has read its inputs
	left     int
	sharedF  []float32 // AllReduce: the reduced buffer
	sharedD  []float64
	sharedMu sync.Mutex
}

type group struct {
	n      int
	mu     sync.Mutex
	rounds map[uint64]*round
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

func (c *Comm) enqueue(gs gpu.Stream, cl call) {
	s := c.dev.stream(gs)
	seq := c.seq.Add(1)
	s.enqueue(func() error { return c.execute(seq, cl) })
}

func (c *Comm) reducible(b *Buffer, what string) {
	if b.dt != gpu.F32 && b.dt != gpu.BF16 && b.dt != gpu.F64 {
		panic(fmt.Sprintf("gpu/cpu: %s: cannot reduce %s (want f32, bf16 or f64)", what, b.dt))
	}
}

// AllGather: rank r's send lands in recv[r*n:(r+1)*n] on every rank.
func (c *Comm) AllGather(s gpu.Stream, send, recv gpu.Buffer) {
	sb, rb := c.dev.buf(send, "all-gather send"), c.dev.buf(recv, "all-gather recv")
	if sb.dt != rb.dt || rb.n != c.g.n*sb.n {
		panic(fmt.Sprintf("gpu/cpu: all-gather: recv %d×%s must be %d × send %d×%s", rb.n, rb.dt, c.g.n, sb.n, sb.dt))
	}
	c.enqueue(s, call{kind: kindAllGather, send: sb, recv: rb})
}

// ReduceScatter: rank r receives the reduction of send[r*n:(r+1)*n].
func (c *Comm) ReduceScatter(s gpu.Stream, send, recv gpu.Buffer, op gpu.ReduceOp) {
	sb, rb := c.dev.buf(send, "reduce-scatter send"), c.dev.buf(recv, "reduce-scatter recv")
	if sb.dt != rb.dt || sb.n != c.g.n*rb.n {
		panic(fmt.Sprintf("gpu/cpu: reduce-scatter: send %d×%s must be %d × recv %d×%s", sb.n, sb.dt, c.g.n, rb.n, rb.dt))
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
		panic(fmt.Sprintf("gpu/cpu: broadcast root %d outside [0, %d)", root, c.g.n))
	}
	c.enqueue(s, call{kind: kindBroadcast, send: b, recv: b, root: root})
}

// Barrier completes when every rank has reached it.
func (c *Comm) Barrier(s gpu.Stream) { c.enqueue(s, call{kind: kindBarrier}) }

func checkOp(op gpu.ReduceOp) {
	if op != gpu.Sum && op != gpu.Avg {
		panic(fmt.Sprintf("gpu/cpu: unknown reduce op %d", op))
	}
}

func (g *group) join(seq uint64, rank int, cl call) *round {
	g.mu.Lock()
	defer g.mu.Unlock()
	rd := g.rounds[seq]
	if rd == nil {
		rd = &round{seq: seq, calls: make([]call, g.n), all: make(chan struct{}), allRead: make(chan struct{})}
		g.rounds[seq] = rd
	}
	rd.calls[rank] = cl
	rd.arrived++
	if rd.arrived == g.n {
		rd.err = rd.check()
		if rd.err == nil && cl.kind == kindAllReduce {
			if cl.send.dt == gpu.F64 {
				rd.sharedD = make([]float64, cl.send.n)
			} else {
				rd.sharedF = make([]float32, cl.send.n)
			}
		}
		close(rd.all)
	}
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
		return fmt.Errorf("gpu/cpu: collective %d (%s): calls disagree: %s", rd.seq, c0.kind, what)
	}
	return nil
}

func (g *group) doneReading(rd *round) {
	g.mu.Lock()
	rd.read++
	if rd.read == g.n {
		close(rd.allRead)
	}
	g.mu.Unlock()
}

func (g *group) leave(rd *round) {
	g.mu.Lock()
	rd.left++
	if rd.left == g.n {
		delete(g.rounds, rd.seq)
	}
	g.mu.Unlock()
}

func (c *Comm) execute(seq uint64, cl call) error {
	g, n, r := c.g, c.g.n, c.rank
	rd := g.join(seq, r, cl)
	defer g.leave(rd)
	<-rd.all
	if rd.err != nil {
		// Every rank still passes the read barrier so the round is symmetric.
		g.doneReading(rd)
		<-rd.allRead
		return rd.err
	}
	var write func()
	switch cl.kind {
	case kindBarrier:
	case kindAllGather:
		sz := len(cl.send.raw())
		tmp := make([]byte, n*sz)
		for q := range n {
			copy(tmp[q*sz:], rd.calls[q].send.raw())
		}
		write = func() { copy(cl.recv.raw(), tmp) }
		c.dev.coll.Add(int64((n - 1) * sz))
	case kindBroadcast:
		var tmp []byte
		if r != cl.root {
			tmp = append([]byte(nil), rd.calls[cl.root].send.raw()...)
			write = func() { copy(cl.recv.raw(), tmp) }
		}
		if r != (cl.root+n-1)%n || n == 1 {
			c.dev.coll.Add(cl.send.Bytes())
		}
	case kindReduceScatter:
		m := cl.recv.n
		if cl.send.dt == gpu.F64 {
			tmp := make([]float64, m)
			reduceF64(tmp, rd.calls, r*m, cl.op)
			write = func() { copy(cl.recv.f64(), tmp) }
		} else {
			tmp := make([]float32, m)
			reduceF32(tmp, rd.calls, r*m, cl.op)
			write = func() { storeF32(cl.recv, 0, tmp) }
		}
		c.dev.coll.Add(int64(n-1) * cl.recv.Bytes())
	case kindAllReduce:
		lo, hi := r*cl.send.n/n, (r+1)*cl.send.n/n
		if rd.sharedD != nil {
			reduceF64(rd.sharedD[lo:hi], rd.calls, lo, cl.op)
			write = func() { copy(cl.recv.f64(), rd.sharedD) }
		} else {
			reduceF32(rd.sharedF[lo:hi], rd.calls, lo, cl.op)
			write = func() { storeF32(cl.recv, 0, rd.sharedF) }
		}
		c.dev.coll.Add(2 * int64(n-1) * cl.send.Bytes() / int64(n))
	}
	g.doneReading(rd)
	<-rd.allRead
	if write != nil {
		write()
	}
	return nil
}

// reduceF32 writes dst[i] = reduction over ranks of send[off+i], in rank order.
func reduceF32(dst []float32, calls []call, off int, op gpu.ReduceOp) {
	const chunk = 4096
	tmp := make([]float32, min(chunk, len(dst)))
	for lo := 0; lo < len(dst); lo += chunk {
		hi := min(lo+chunk, len(dst))
		d := dst[lo:hi]
		for q, cl := range calls {
			x := loadF32(cl.send, off+lo, off+hi, tmp)
			if q == 0 {
				copy(d, x)
				continue
			}
			for i, v := range x {
				d[i] += v
			}
		}
		if op == gpu.Avg {
			nf := float32(len(calls))
			for i := range d {
				d[i] /= nf
			}
		}
	}
}

func reduceF64(dst []float64, calls []call, off int, op gpu.ReduceOp) {
	for q, cl := range calls {
		x := cl.send.f64()[off : off+len(dst)]
		if q == 0 {
			copy(dst, x)
			continue
		}
		for i, v := range x {
			dst[i] += v
		}
	}
	if op == gpu.Avg {
		nf := float64(len(calls))
		for i := range dst {
			dst[i] /= nf
		}
	}
}
