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
	read                             int
	allRead                          chan struct{} // closed when every rank has read its inputs
	sharedF                          []float32     // AllReduce: the reduced buffer
	sharedD                          []float64
}

type group struct {
	size   int
	rounds *gpu.Rounds[*Buffer, chan *round]
}

func newGroup(n int) *group {
	return &group{size: n, rounds: gpu.NewRounds[*Buffer, chan *round]("gpu/cpu", n)}
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
	rd := &round{Round: gr, allRead: make(chan struct{})}
	if cl := gr.Calls[0]; gr.Err == nil && cl.Kind == gpu.CollAllReduce {
		if cl.Send.DType() == gpu.F64 {
			rd.sharedD = make([]float64, cl.Send.Len())
		} else {
			rd.sharedF = make([]float32, cl.Send.Len())
		}
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
	c.dev.front.Links.Collective.Add(gpu.RingBytes(cl, r, n))
	var write func()
	switch cl.Kind {
	case gpu.CollBarrier:
	case gpu.CollAllGather:
		sz := len(cl.Send.raw())
		tmp := make([]byte, n*sz)
		for q := range n {
			copy(tmp[q*sz:], rd.Calls[q].Send.raw())
		}
		write = func() { copy(cl.Recv.raw(), tmp) }
	case gpu.CollBroadcast:
		var tmp []byte
		if r != cl.Root {
			tmp = append([]byte(nil), rd.Calls[cl.Root].Send.raw()...)
			write = func() { copy(cl.Recv.raw(), tmp) }
		}
	case gpu.CollReduceScatter:
		m := cl.Recv.Len()
		if cl.Send.DType() == gpu.F64 {
			tmp := make([]float64, m)
			reduceF64(tmp, rd.Calls, r*m, cl.Op)
			write = func() { copy(cl.Recv.f64(), tmp) }
		} else {
			tmp := make([]float32, m)
			reduceF32(tmp, rd.Calls, r*m, cl.Op)
			write = func() { storeF32(cl.Recv, 0, tmp) }
		}
	case gpu.CollAllReduce:
		lo, hi := r*cl.Send.Len()/n, (r+1)*cl.Send.Len()/n
		if rd.sharedD != nil {
			reduceF64(rd.sharedD[lo:hi], rd.Calls, lo, cl.Op)
			write = func() { copy(cl.Recv.f64(), rd.sharedD) }
		} else {
			reduceF32(rd.sharedF[lo:hi], rd.Calls, lo, cl.Op)
			write = func() { storeF32(cl.Recv, 0, rd.sharedF) }
		}
	}
	rd.doneReading()
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
			x := loadF32(cl.Send, off+lo, off+hi, tmp)
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
		x := cl.Send.f64()[off : off+len(dst)]
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
