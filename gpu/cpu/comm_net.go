package cpu

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// Collectives across processes (Options.Net). The devices of P processes,
// L each, are one communicator of N = P·L global ranks; global rank
// g = q·L + l is device l of process q. A round first completes within
// the process as always (every local rank joined, the calls agree); then
// the rank that completed it runs the round's exchange between processes,
// in sequence order (rounds issued on several streams may complete out of
// order here and in another order elsewhere: an exchange waits for the
// previous one), before any local rank reads or writes:
//
//   - every process sends a description of its round (sequence number,
//     kind, dtype, length, op, root, and whether its own ranks disagreed)
//     to every other (Allgather); any difference is the same error on
//     every rank of every process, and nothing is written;
//   - AllGather: each process's ranks' inputs, back to back, to every
//     process (Allgather), so every rank holds all N in rank order;
//   - Broadcast: the root's process sends the root's input (Bcast);
//   - ReduceScatter and AllReduce: each process receives, from every
//     rank of every process, the segments its own ranks reduce (Alltoallv:
//     (P−1)/P of the data leaves each process, as a ring's reduce-scatter
//     sends); each rank then reduces its segment over the N inputs in
//     global rank order, exactly as the ranks of one process do (fp32 sums
//     x_0 + x_1 + … + x_{N−1}, Avg a division by N, one rounding on
//     store). AllReduce then gathers the reduced segments, already in the
//     buffer's dtype (Allgatherv).
//
// So a job of P processes of L devices computes the bits of one process of
// N devices, whatever P and L. An exchange that fails (the network, a
// process gone) fails its round on every local rank and every later round
// too: the processes are no longer in step.

// descBytes is the size of a round's description: seq, kind, dtype,
// length, op, root and a flag (the local calls disagreed), int64 each.
const descBytes = 7 * 8

type netGroup struct {
	net                gpu.Net
	procs, proc, local int // processes, this one, ranks per process
	bufs               *scratch

	mu   sync.Mutex
	cond *sync.Cond
	next uint64 // the sequence number whose exchange runs next
	err  error  // a failed exchange: every later round fails with it
}

// newNetGroup joins local devices (this process's) to the processes of
// net, after checking that every process has as many.
func newNetGroup(net gpu.Net, local int, dev *Device) (*netGroup, error) {
	x := &netGroup{net: net, procs: net.Procs(), proc: net.Proc(), local: local, bufs: &scratch{dev: dev}, next: 1}
	x.cond = sync.NewCond(&x.mu)
	mine := binary.LittleEndian.AppendUint64(nil, uint64(local))
	all := make([]byte, 8*x.procs)
	if err := net.Allgather(mine, all); err != nil {
		return nil, fmt.Errorf("cpu: devices of every process: %w", err)
	}
	for q := range x.procs {
		if n := int(binary.LittleEndian.Uint64(all[8*q:])); n != local {
			return nil, fmt.Errorf("cpu: process %d has %d device(s), process %d %d: every process must drive the same number (--devices)", q, n, x.proc, local)
		}
	}
	return x, nil
}

func (g *group) base() int {
	if g.x == nil {
		return 0
	}
	return g.x.proc * g.size
}

func (g *group) world() int {
	if g.x == nil {
		return g.size
	}
	return g.x.procs * g.size
}

// netRound is a round's data from the other processes.
type netRound struct {
	recv []byte // what the exchange received
	bufs [][]byte
	// AllReduce: the process's reduced segments in the buffer's dtype,
	// then every process's (full: local rank 0's buffer); ready closes
	// once full is gathered.
	out, full []byte
	reduced   int
	ready     chan struct{}
	err       error
	seg       []int // AllReduce: segment bounds in elements, N+1 of them
}

// wait blocks until seq's turn, or returns the error that broke the group.
func (x *netGroup) wait(seq uint64) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	for x.err == nil && x.next != seq {
		x.cond.Wait()
	}
	return x.err
}

// advance passes the turn to seq+1; err (not nil) breaks the group.
func (x *netGroup) advance(seq uint64, err error) {
	x.mu.Lock()
	if err != nil && x.err == nil {
		x.err = fmt.Errorf("cpu: collective %d across processes: %w (later collectives fail too)", seq, err)
	}
	x.next = seq + 1
	x.mu.Unlock()
	x.cond.Broadcast()
}

func (x *netGroup) get(rd *netRound, n int) []byte {
	b := x.bufs.get(n)
	if b != nil {
		rd.bufs = append(rd.bufs, b)
	}
	return b
}

// exchange runs rd's part between processes (see the top of the file);
// on failure it sets rd.Err.
func (x *netGroup) exchange(rd *round) {
	seq := rd.Seq
	if err := x.wait(seq); err != nil {
		rd.Err = err
		return
	}
	xr := &netRound{ready: make(chan struct{})}
	rd.x = xr
	c0 := rd.Calls[0]
	desc := make([]int64, 7)
	desc[0], desc[1] = int64(seq), int64(c0.Kind)
	if c0.Kind != gpu.CollBarrier {
		desc[2], desc[3], desc[4], desc[5] = int64(c0.Send.DType()), int64(c0.Send.Len()), int64(c0.Op), int64(c0.Root)
	}
	if rd.Err != nil {
		desc[6] = 1
	}
	mine := make([]byte, descBytes)
	for i, v := range desc {
		binary.LittleEndian.PutUint64(mine[8*i:], uint64(v))
	}
	all := make([]byte, x.procs*descBytes)
	if err := x.net.Allgather(mine, all); err != nil {
		x.advance(seq, err)
		rd.Err = x.err
		return
	}
	if err := x.agree(rd, all); err != nil {
		x.advance(seq, nil) // every process saw the same descriptions: still in step
		if rd.Err == nil {
			rd.Err = err
		}
		return
	}
	L, N := x.local, x.procs*x.local
	var err error
	switch c0.Kind {
	case gpu.CollBarrier:
	case gpu.CollAllGather:
		sz := len(c0.Send.raw())
		send := x.get(xr, L*sz)
		for l, cl := range rd.Calls {
			copy(send[l*sz:], cl.Send.raw())
		}
		xr.recv = x.get(xr, N*sz)
		err = x.net.Allgather(send, xr.recv)
	case gpu.CollBroadcast:
		sz := len(c0.Send.raw())
		xr.recv = x.get(xr, sz)
		if root := c0.Root / L; root == x.proc {
			copy(xr.recv, rd.Calls[c0.Root%L].Send.raw())
		}
		err = x.net.Bcast(xr.recv, c0.Root/L)
	case gpu.CollReduceScatter:
		// Rank g's segment is [g·m, (g+1)·m); process q's ranks' segments
		// are one run [q·L·m, (q+1)·L·m) of every input.
		z, m := c0.Send.DType().Size(), c0.Recv.Len()
		run := L * m * z
		counts := make([]int, x.procs)
		send := c0.Send.raw() // one rank: its runs are the buffer in order
		if L > 1 {
			send = x.get(xr, x.procs*L*run)
		}
		for q := range x.procs {
			if L > 1 {
				for l, cl := range rd.Calls {
					copy(send[(q*L+l)*run:], cl.Send.raw()[q*run:(q+1)*run])
				}
			}
			counts[q] = L * run
		}
		xr.recv = x.get(xr, x.procs*L*run)
		err = x.net.Alltoallv(send, counts, xr.recv, counts)
	case gpu.CollAllReduce:
		// Rank g's segment is [g·n/N, (g+1)·n/N); process q's ranks' are
		// the run [seg[q·L], seg[(q+1)·L]) of every input.
		z, n := c0.Send.DType().Size(), c0.Send.Len()
		xr.seg = make([]int, N+1)
		for g := range xr.seg {
			xr.seg[g] = g * n / N
		}
		runOf := func(q int) (int, int) { return xr.seg[q*L] * z, xr.seg[(q+1)*L] * z }
		sc, rc := make([]int, x.procs), make([]int, x.procs)
		lo, hi := runOf(x.proc)
		var send []byte
		if L == 1 {
			send = c0.Send.raw() // one rank: its runs are the buffer in order
		} else {
			send = x.get(xr, L*n*z)
		}
		off := 0
		for q := range x.procs {
			qlo, qhi := runOf(q)
			if L > 1 {
				for _, cl := range rd.Calls {
					off += copy(send[off:], cl.Send.raw()[qlo:qhi])
				}
			}
			sc[q], rc[q] = L*(qhi-qlo), L*(hi-lo)
		}
		xr.recv = x.get(xr, x.procs*L*(hi-lo))
		if err = x.net.Alltoallv(send, sc, xr.recv, rc); err == nil {
			xr.out = x.get(xr, hi-lo)
			// Gathered into local rank 0's buffer (read by now: its input
			// went out above); the other local ranks copy it from there.
			xr.full = c0.Recv.raw()
			return // the turn passes after the gather of the reduced segments (allReduceNet)
		}
	}
	x.advance(seq, err)
	if err != nil {
		rd.Err = x.err
	}
}

// agree compares the processes' descriptions of the round.
func (x *netGroup) agree(rd *round, all []byte) error {
	at := func(q, i int) int64 { return int64(binary.LittleEndian.Uint64(all[q*descBytes+8*i:])) }
	names := []string{"sequence number", "kind", "dtype", "length", "op", "root"}
	for q := range x.procs {
		if at(q, 6) != 0 {
			return fmt.Errorf("gpu/cpu: collective %d (%s): the ranks of process %d disagree", rd.Seq, rd.Calls[0].Kind, q)
		}
		for i, name := range names {
			if at(q, i) != at(0, i) {
				return fmt.Errorf("gpu/cpu: collective %d (%s): processes disagree: process %d has %s %d, process 0 %d",
					rd.Seq, rd.Calls[0].Kind, q, name, at(q, i), at(0, i))
			}
		}
	}
	return nil
}

// executeNet is a local rank's part of a round across processes: its
// inputs went out with the exchange, so it writes its output at once.
func (c *comm) executeNet(rd *round, cl call) error {
	x, xr := c.g.x, rd.x
	L, N := x.local, x.procs*x.local
	g := x.proc*L + c.rank
	c.dev.front.Links.Collective.Add(gpu.RingBytes(cl, g, N))
	var err error
	switch cl.Kind {
	case gpu.CollAllGather:
		copy(cl.Recv.raw(), xr.recv)
	case gpu.CollBroadcast:
		if g != cl.Root {
			copy(cl.Recv.raw(), xr.recv)
		}
	case gpu.CollReduceScatter:
		z, m := cl.Send.DType().Size(), cl.Recv.Len()
		run := L * m * z
		src := func(q int) []byte { // rank q's input of this rank's segment
			o := q*run + c.rank*m*z
			return xr.recv[o : o+m*z]
		}
		c.reduceRaw(cl.Recv.raw(), cl.Recv.DType(), cl.Send.DType(), m, src, N, cl.Op)
	case gpu.CollAllReduce:
		err = c.allReduceNet(rd, cl)
	}
	rd.doneWriting()
	<-rd.allWritten
	if c.rank == 0 { // every rank is done with the round's buffers
		for _, b := range xr.bufs {
			x.bufs.put(b)
		}
	}
	return err
}

// allReduceNet reduces the rank's segment into the process's run (in the
// buffer's dtype); the last local rank to do so gathers every process's
// run, and each rank copies the whole.
func (c *comm) allReduceNet(rd *round, cl call) error {
	x, xr := c.g.x, rd.x
	L, N := x.local, x.procs*x.local
	g := x.proc*L + c.rank
	dt := cl.Send.DType()
	z := dt.Size()
	base, w := xr.seg[x.proc*L], xr.seg[(x.proc+1)*L]-xr.seg[x.proc*L] // the process's run
	lo, hi := xr.seg[g], xr.seg[g+1]
	src := func(q int) []byte { // rank q's input of this rank's segment
		o := (q*w + lo - base) * z
		return xr.recv[o : o+(hi-lo)*z]
	}
	c.reduceRaw(xr.out[(lo-base)*z:(hi-base)*z], dt, dt, hi-lo, src, N, cl.Op)
	rd.mu.Lock()
	xr.reduced++
	last := xr.reduced == L
	rd.mu.Unlock()
	if last {
		counts := make([]int, x.procs)
		for q := range counts {
			counts[q] = (xr.seg[(q+1)*L] - xr.seg[q*L]) * z
		}
		err := x.net.Allgatherv(xr.out, xr.full, counts)
		x.advance(rd.Seq, err)
		if err != nil {
			xr.err = x.err
		}
		close(xr.ready)
	}
	<-xr.ready
	if xr.err != nil {
		return xr.err
	}
	if c.rank != 0 {
		copy(cl.Recv.raw(), xr.full)
	}
	return nil
}

// reduceRaw writes into dst (m elements of odt) the reduction over the n
// ranks' inputs src(0), …, src(n−1) (m elements of idt each), in rank
// order, as reduceF32 and reduceF64 compute it: fp32 (F64: float64) sums
// from rank 0 up, Avg a division by n, one rounding on store.
func (c *comm) reduceRaw(dst []byte, odt, idt gpu.DType, m int, src func(q int) []byte, n int, op gpu.ReduceOp) {
	if idt == gpu.F64 {
		sumRanks(f64View(dst, m), n, func(q int) []float64 { return f64View(src(q), m) }, op)
		return
	}
	if m == 0 {
		return // an empty segment (more ranks than elements)
	}
	k := min(m, reduceTmpElems)
	sc := c.g.scratch[c.rank] // the sums and the widened inputs, kept for the rank's next round
	tmp := sc.get(8 * k)
	defer sc.put(tmp)
	sum, wide := f32View(tmp, k), f32View(tmp[4*k:], k)
	for lo := 0; lo < m; lo += k {
		hi := min(lo+k, m)
		d := sum[:hi-lo]
		sumRanks(d, n, func(q int) []float32 { return rawF32(idt, src(q), lo, hi, wide) }, op)
		switch odt {
		case gpu.F32:
			copy(f32View(dst, m)[lo:hi], d)
		case gpu.BF16, gpu.F16:
			dtype.Narrow(odt, u16View(dst, m)[lo:hi], d)
		default:
			panic(fmt.Sprintf("gpu/cpu: reduction into %s across processes", odt))
		}
	}
}

// rawF32 is elements [lo, hi) of raw bytes of dt as float32.
func rawF32(dt gpu.DType, raw []byte, lo, hi int, tmp []float32) []float32 {
	switch dt {
	case gpu.F32:
		return f32View(raw, len(raw)/4)[lo:hi]
	case gpu.BF16, gpu.F16:
		tmp = tmp[:hi-lo]
		dtype.Widen(dt, tmp, u16View(raw, len(raw)/2)[lo:hi])
		return tmp
	}
	panic(fmt.Sprintf("gpu/cpu: reduction of %s across processes", dt))
}
