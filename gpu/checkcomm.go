package gpu

import (
	"fmt"
	"sync"
	"sync/atomic"
)

//go:generate go tool stringer -type=Collective -linecomment -output=collective_string.go

// Collective names a Comm method.
type Collective uint8

const (
	CollAllGather     Collective = iota // all-gather
	CollReduceScatter                   // reduce-scatter
	CollAllReduce                       // all-reduce
	CollBroadcast                       // broadcast
	CollBarrier                         // barrier
)

// Call is one rank's collective call, checked against the contract of
// Comm, with the buffers resolved to the backend's type B (AllReduce and
// Broadcast: Send == Recv, the buffer; Barrier: none).
type Call[B any] struct {
	Kind       Collective
	Send, Recv B
	Op         ReduceOp
	Root       int
}

// RingBytes is what rank's part of the collective c sends in a ring
// algorithm over size ranks, the figure every backend adds to its
// Collective link counter: AllGather (N-1)×send, ReduceScatter (N-1)×recv,
// AllReduce 2(N-1)/N×buf, Broadcast buf for every rank but the one before
// root in the ring (all of it when N = 1), Barrier nothing.
func RingBytes[B Buffer](c Call[B], rank, size int) int64 {
	n := int64(size)
	switch c.Kind {
	case CollAllGather:
		return (n - 1) * c.Send.Bytes()
	case CollReduceScatter:
		return (n - 1) * c.Recv.Bytes()
	case CollAllReduce:
		return 2 * (n - 1) * c.Send.Bytes() / n
	case CollBroadcast:
		if rank != (c.Root+size-1)%size || size == 1 {
			return c.Send.Bytes()
		}
	}
	return 0
}

// Issuer is what a backend implements behind CheckedComm: Issue enqueues
// on s the rank's seq-th collective call (1, 2, ...: the n-th call of
// every rank belongs to round n), already checked.
type Issuer[S, B any] interface {
	Issue(s S, seq uint64, c Call[B])
}

// CheckedComm returns rank's Comm, on f's device, of a communicator of
// size ranks: each call is checked against the contract of Comm (a
// violation panics when the call is enqueued), numbered, and handed to is.
// Whether the ranks' calls agree is checked when the round is complete
// (Rounds), since no rank sees the others' calls before.
func CheckedComm[S Queue, B Resident](f *Front, rank, size int, is Issuer[S, B]) Comm {
	return &checkedComm[S, B]{f: f, rank: rank, size: size, is: is}
}

type checkedComm[S Queue, B Resident] struct {
	f          *Front
	rank, size int
	is         Issuer[S, B]
	seq        atomic.Uint64
}

func (c *checkedComm[S, B]) Rank() int { return c.rank }
func (c *checkedComm[S, B]) Size() int { return c.size }

func (c *checkedComm[S, B]) issue(s Stream, cl Call[B]) {
	rs := StreamOf[S](c.f, s)
	c.is.Issue(rs, c.seq.Add(1), cl)
}

func (c *checkedComm[S, B]) buf(b Buffer, what string) B { return BufferOf[B](c.f, b, what) }

func (c *checkedComm[S, B]) reducible(b B, what string, op ReduceOp) {
	if dt := b.DType(); dt != F32 && !dt.Half() && dt != F64 {
		c.f.Panicf("%s: cannot reduce %s (want f32, bf16, f16 or f64)", what, dt)
	}
	if op != Sum && op != Avg {
		c.f.Panicf("unknown reduce op %d", op)
	}
}

func (c *checkedComm[S, B]) AllGather(s Stream, send, recv Buffer) {
	sb, rb := c.buf(send, "all-gather send"), c.buf(recv, "all-gather recv")
	if sb.DType() != rb.DType() || rb.Len() != c.size*sb.Len() {
		c.f.Panicf("all-gather: recv %d×%s must be %d × send %d×%s", rb.Len(), rb.DType(), c.size, sb.Len(), sb.DType())
	}
	c.issue(s, Call[B]{Kind: CollAllGather, Send: sb, Recv: rb})
}

func (c *checkedComm[S, B]) ReduceScatter(s Stream, send, recv Buffer, op ReduceOp) {
	sb, rb := c.buf(send, "reduce-scatter send"), c.buf(recv, "reduce-scatter recv")
	if sb.DType() != rb.DType() || sb.Len() != c.size*rb.Len() {
		c.f.Panicf("reduce-scatter: send %d×%s must be %d × recv %d×%s", sb.Len(), sb.DType(), c.size, rb.Len(), rb.DType())
	}
	c.reducible(sb, "reduce-scatter", op)
	c.issue(s, Call[B]{Kind: CollReduceScatter, Send: sb, Recv: rb, Op: op})
}

func (c *checkedComm[S, B]) AllReduce(s Stream, buf Buffer, op ReduceOp) {
	b := c.buf(buf, "all-reduce buffer")
	c.reducible(b, "all-reduce", op)
	c.issue(s, Call[B]{Kind: CollAllReduce, Send: b, Recv: b, Op: op})
}

func (c *checkedComm[S, B]) Broadcast(s Stream, buf Buffer, root int) {
	b := c.buf(buf, "broadcast buffer")
	if root < 0 || root >= c.size {
		c.f.Panicf("broadcast root %d outside [0, %d)", root, c.size)
	}
	c.issue(s, Call[B]{Kind: CollBroadcast, Send: b, Recv: b, Root: root})
}

func (c *checkedComm[S, B]) Barrier(s Stream) { c.issue(s, Call[B]{Kind: CollBarrier}) }

// ScratchReserver is a Comm that can take, ahead of the calls, the scratch
// memory its backend's collectives use (every Comm CheckedComm returns is
// one; a backend without such scratch does nothing): so that a training
// loop takes it at start, not in its steps, and a device that cannot hold
// it is refused there.
type ScratchReserver interface {
	// ReserveScratch makes room for calls of kind whose largest buffer
	// (an AllGather's recv, a ReduceScatter's send, an AllReduce's or a
	// Broadcast's buffer) has up to elems elements of dt.
	ReserveScratch(kind Collective, elems int, dt DType) error
}

// ReserveScratch implements ScratchReserver: it hands the request to the
// backend's Issuer when it has the method, and checks it first.
func (c *checkedComm[S, B]) ReserveScratch(kind Collective, elems int, dt DType) error {
	if elems < 0 || kind > CollBarrier {
		c.f.Panicf("reserve scratch of %d elements for %s", elems, kind)
	}
	if r, ok := c.is.(interface {
		ReserveScratch(Collective, int, DType) error
	}); ok {
		return r.ReserveScratch(kind, elems, dt)
	}
	return nil
}

// Round is one collective of a communicator: every rank's call, by rank,
// and what the backend attached to each (Ranks).
type Round[B Buffer, R any] struct {
	Seq   uint64
	Calls []Call[B]
	Ranks []R
	// Err says how the calls disagree (kind, dtype, length, op, root);
	// nil when they agree. A backend must then write no output and give
	// every rank's stream the error.
	Err     error
	arrived int
}

// Rounds is the round bookkeeping of one communicator of n ranks: it
// collects the calls of each sequence number and hands the round, checked,
// to the rank whose call completes it. Safe for concurrent use.
type Rounds[B Buffer, R any] struct {
	backend string
	n       int
	mu      sync.Mutex
	open    map[uint64]*Round[B, R]
}

// NewRounds returns the bookkeeping of a communicator of n ranks of
// backend (the prefix of its errors).
func NewRounds[B Buffer, R any](backend string, n int) *Rounds[B, R] {
	return &Rounds[B, R]{backend: backend, n: n, open: map[uint64]*Round[B, R]{}}
}

// Join adds rank's call of round seq, with the backend's data r, and
// returns the round, with Err set, when this call completes it; nil when
// other ranks have yet to join.
func (g *Rounds[B, R]) Join(seq uint64, rank int, c Call[B], r R) *Round[B, R] {
	g.mu.Lock()
	defer g.mu.Unlock()
	rd := g.open[seq]
	if rd == nil {
		rd = &Round[B, R]{Seq: seq, Calls: make([]Call[B], g.n), Ranks: make([]R, g.n)}
		g.open[seq] = rd
	}
	rd.Calls[rank], rd.Ranks[rank] = c, r
	rd.arrived++
	if rd.arrived < g.n {
		return nil
	}
	delete(g.open, seq)
	rd.Err = rd.disagreement(g.backend)
	return rd
}

// disagreement says how the ranks' calls differ from rank 0's.
func (rd *Round[B, R]) disagreement(backend string) error {
	c0 := rd.Calls[0]
	for r, c := range rd.Calls[1:] {
		r++
		var what string
		switch {
		case c.Kind != c0.Kind:
			what = fmt.Sprintf("rank %d called %s, rank 0 %s", r, c.Kind, c0.Kind)
		case c.Kind == CollBarrier:
			continue
		case c.Send.DType() != c0.Send.DType() || c.Send.Len() != c0.Send.Len():
			what = fmt.Sprintf("rank %d has %d elements of %s, rank 0 %d of %s", r, c.Send.Len(), c.Send.DType(), c0.Send.Len(), c0.Send.DType())
		case c.Op != c0.Op:
			what = fmt.Sprintf("rank %d reduces with op %d, rank 0 with %d", r, c.Op, c0.Op)
		case c.Root != c0.Root:
			what = fmt.Sprintf("rank %d has root %d, rank 0 root %d", r, c.Root, c0.Root)
		default:
			continue
		}
		return fmt.Errorf("%s: collective %d (%s): calls disagree: %s", backend, rd.Seq, c0.Kind, what)
	}
	return nil
}
