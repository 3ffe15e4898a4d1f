package cpu

import (
	"sync"

	"github.com/strata-ai/strata/gpu"
)

// Collectives, behind the front end (gpu.CheckedComm checks each call and
// numbers it; gpu.Rounds keeps the rounds and checks that the calls of a
// round agree). Every rank's call is enqueued on its stream; when the
// stream reaches it, the rank joins the round of that call's sequence
// number (the n-th collective call on a Comm belongs to round n). A round
// runs in three steps: (1) all ranks arrive; the last one's Join checks
// that the calls agree (kind, dtype, length, op, root) and hands the round
// to every rank — if they disagree, every rank's stream gets the error and
// no output is written; (2) each rank reads the inputs it needs
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
// Link counters count the bytes a ring algorithm would send from each rank
// (gpu.RingBytes, as gpu/cuda counts).

// call is one rank's checked call; round is a complete round as every
// rank of it sees it: gpu.Rounds hands it to the last rank to join, which
// sends it to every rank's channel (Ranks).
type call = gpu.Call[*Buffer]

type round struct {
	*gpu.Round[*Buffer, chan *round] // Ranks: where each rank waits for the round
	mu                               sync.Mutex
	read, written                    int
	allRead                          chan struct{} // closed when every rank has read its inputs
	allWritten                       chan struct{} // AllReduce: closed when every rank has written its output
	// AllReduce: rank q reduces segment q of the buffer into seg[q], taken
	// from its scratch and given back once every rank has written its
	// output (every rank reads every segment).
	seg [][]byte
	x   *netRound // across processes (comm_net.go); nil within one
}

type group struct {
	size    int       // ranks in this process
	x       *netGroup // the other processes' ranks (Options.Net); nil: none
	rounds  *gpu.Rounds[*Buffer, chan *round]
	scratch []*scratch // per rank
}

func newGroup(devs []*Device) *group {
	g := &group{size: len(devs), rounds: gpu.NewRounds[*Buffer, chan *round]("gpu/cpu", len(devs))}
	for _, d := range devs {
		g.scratch = append(g.scratch, &scratch{dev: d})
	}
	return g
}

// comm is one rank of a communicator over the devices of one backend,
// behind the front end's checks (gpu.CheckedComm).
type comm struct {
	g    *group
	rank int
	dev  *Device
}

// Issue enqueues the rank's part of round seq on s.
func (c *comm) Issue(s *Stream, seq uint64, cl call) {
	s.enqueue(func() error { return c.execute(seq, cl) })
}

// start hands the round completed by the last rank to every rank.
func (g *group) start(gr *gpu.Round[*Buffer, chan *round]) {
	rd := &round{Round: gr, allRead: make(chan struct{}), allWritten: make(chan struct{}), seg: make([][]byte, g.size)}
	if g.x != nil {
		g.x.exchange(rd) // every input packed and sent before any rank writes
	}
	for _, w := range gr.Ranks {
		w <- rd
	}
}

func (rd *round) doneReading() {
	rd.mu.Lock()
	rd.read++
	if rd.read == len(rd.Calls) {
		close(rd.allRead)
	}
	rd.mu.Unlock()
}

// doneWriting counts a rank's output as written.
func (rd *round) doneWriting() {
	rd.mu.Lock()
	rd.written++
	if rd.written == len(rd.Calls) {
		close(rd.allWritten)
	}
	rd.mu.Unlock()
}

// reduceTmpElems is the most elements reduceF32 widens at a time.
const reduceTmpElems = 4096

func (c *comm) execute(seq uint64, cl call) error {
	n, r := c.g.size, c.rank
	wake := make(chan *round, 1)
	if gr := c.g.rounds.Join(seq, r, cl, wake); gr != nil {
		c.g.start(gr)
	}
	rd := <-wake
	if rd.Err != nil {
		return rd.Err
	}
	if c.g.x != nil {
		return c.executeNet(rd, cl)
	}
	c.dev.front.Links.Collective.Add(gpu.RingBytes(cl, r, n))
	sc := c.g.scratch[r]
	var tmp []byte // the rank's scratch for this round, given back after its write
	var write func()
	switch {
	case cl.Kind == gpu.CollBarrier:
	case n == 1 && (cl.Kind == gpu.CollAllGather || cl.Kind == gpu.CollReduceScatter && cl.Send.DType() == cl.Recv.DType()):
		// One rank: its gather, sum or mean (x/1) is its input, bit for
		// bit; copy it, without the scratch, the widening and the
		// rounding back.
		write = func() { copy(cl.Recv.raw(), cl.Send.raw()) }
	case cl.Kind == gpu.CollAllGather:
		sz := len(cl.Send.raw())
		tmp = sc.get(n * sz)
		for q := range n {
			copy(tmp[q*sz:], rd.Calls[q].Send.raw())
		}
		write = func() { copy(cl.Recv.raw(), tmp[:n*sz]) }
	case cl.Kind == gpu.CollBroadcast:
		if r != cl.Root {
			src := rd.Calls[cl.Root].Send.raw()
			tmp = sc.get(len(src))
			copy(tmp, src)
			write = func() { copy(cl.Recv.raw(), tmp[:len(src)]) }
		}
	case cl.Kind == gpu.CollReduceScatter:
		m := cl.Recv.Len()
		if cl.Send.DType() == gpu.F64 {
			tmp = sc.get(8 * m)
			out := f64View(tmp, m)
			reduceF64(out, rd.Calls, r*m, cl.Op)
			write = func() { copy(cl.Recv.f64(), out) }
		} else {
			tmp = sc.get(4 * (m + min(m, reduceTmpElems)))
			out, wide := f32View(tmp, m), f32View(tmp[4*m:], min(m, reduceTmpElems))
			reduceF32(out, rd.Calls, r*m, cl.Op, wide)
			write = func() { storeF32(cl.Recv, 0, out) }
		}
	case cl.Kind == gpu.CollAllReduce:
		write = c.allReduce(rd, cl)
	}
	rd.doneReading()
	<-rd.allRead
	if write != nil {
		write()
	}
	if tmp != nil {
		sc.put(tmp)
	}
	if cl.Kind == gpu.CollAllReduce {
		// The peers read the rank's segment until they have written: it
		// goes back to the scratch after that, before the rank's next
		// round can take it.
		rd.doneWriting()
		<-rd.allWritten
		if b := rd.seg[r]; b != nil {
			sc.put(b)
		}
	}
	return nil
}

// ReserveScratch keeps, in the rank's scratch, a buffer for calls of kind
// whose largest buffer has elems elements of dt (gpu.ScratchReserver).
func (c *comm) ReserveScratch(kind gpu.Collective, elems int, dt gpu.DType) error {
	n := c.g.size
	var bytes int
	switch kind {
	case gpu.CollAllGather, gpu.CollBroadcast:
		if n > 1 { // one rank's gather is a copy, its broadcast nothing: no scratch
			bytes = elems * dt.Size()
		}
	case gpu.CollReduceScatter, gpu.CollAllReduce:
		m := (elems + n - 1) / n // a rank's shard or (at most) segment
		bytes = 8 * m            // F64: the reduced values
		if dt != gpu.F64 {
			bytes = 4 * (m + min(m, reduceTmpElems)) // F32 sums and the widened inputs
		}
	}
	if bytes > 0 {
		c.g.scratch[c.rank].put(c.g.scratch[c.rank].get(bytes))
	}
	return nil
}

// allReduce reduces the rank's segment of the buffer, [r·len/N,
// (r+1)·len/N), into a buffer of its scratch (rd.seg) and returns the
// write: every rank's segments, in rank order, into its buffer.
func (c *comm) allReduce(rd *round, cl call) func() {
	n, r, l := c.g.size, c.rank, cl.Send.Len()
	lo, hi := r*l/n, (r+1)*l/n
	if cl.Send.DType() == gpu.F64 {
		rd.seg[r] = c.g.scratch[r].get(8 * (hi - lo))
		reduceF64(f64View(rd.seg[r], hi-lo), rd.Calls, lo, cl.Op)
		return func() {
			for q := range n {
				ql, qh := q*l/n, (q+1)*l/n
				copy(cl.Recv.f64()[ql:qh], f64View(rd.seg[q], qh-ql))
			}
		}
	}
	k := min(hi-lo, reduceTmpElems)
	rd.seg[r] = c.g.scratch[r].get(4 * (hi - lo + k))
	reduceF32(f32View(rd.seg[r], hi-lo), rd.Calls, lo, cl.Op, f32View(rd.seg[r][4*(hi-lo):], k))
	return func() {
		for q := range n {
			ql, qh := q*l/n, (q+1)*l/n
			storeF32(cl.Recv, ql, f32View(rd.seg[q], qh-ql))
		}
	}
}

// reduceF32 writes dst[i] = reduction over ranks of send[off+i], in rank
// order; tmp (at least min(len(dst), reduceTmpElems) elements) holds the
// widened bf16 inputs.
func reduceF32(dst []float32, calls []call, off int, op gpu.ReduceOp, tmp []float32) {
	for lo := 0; lo < len(dst); lo += reduceTmpElems {
		hi := min(lo+reduceTmpElems, len(dst))
		sumRanks(dst[lo:hi], len(calls), func(q int) []float32 { return loadF32(calls[q].Send, off+lo, off+hi, tmp) }, op)
	}
}

func reduceF64(dst []float64, calls []call, off int, op gpu.ReduceOp) {
	sumRanks(dst, len(calls), func(q int) []float64 { return calls[q].Send.f64()[off : off+len(dst)] }, op)
}

// sumRanks sets d to x_0 + x_1 + … + x_{n−1}, x_q = load(q) (rank q's
// values of d's elements), added in rank order, then for Avg divides by n:
// the one reduction of every collective here, within a process and
// across processes.
func sumRanks[T float32 | float64](d []T, n int, load func(q int) []T, op gpu.ReduceOp) {
	for q := range n {
		x := load(q)
		if q == 0 {
			copy(d, x)
			continue
		}
		for i, v := range x {
			d[i] += v
		}
	}
	if op == gpu.Avg {
		nf := T(n)
		for i := range d {
			d[i] /= nf
		}
	}
}
