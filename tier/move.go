package tier

import (
	"time"

	"github.com/strata-ai/strata/internal/shard"
)

// Reason says what a Move asks of the store (shard.Reason, the reason
// prefetch plans with).
type Reason = shard.Reason

const (
	// Prefetch copies the shard From -> To; the From copy stays.
	Prefetch = shard.Prefetch
	// Demand is Prefetch for an access that is already waiting.
	Demand = shard.Demand
	// Evict drops the From copy. A copy that holds the only valid data of
	// the shard is first written back to To (or home), then dropped.
	Evict = shard.Evict
	// WriteBack copies From -> To and then drops the From copy.
	WriteBack = shard.WriteBack
	// Alloc reserves space for the shard in To (contents undefined), for a
	// Write lease.
	Alloc = shard.Alloc
)

const reasonCount = shard.Reason(shard.ReasonCount)

// Move is one instruction to the store: shard.Move, the type prefetch plans
// with, so a planned move is submitted as it is. The store ignores
// WriteBehind (it is a Prefetch) and SizeBytes (it uses the registered size).
type Move = shard.Move

// Kind is what a lease holder does with the copy (shard.Kind, the kind of
// the access the lease serves).
type Kind = shard.Kind

const (
	// Read leases share the copy with other leases and with moves reading
	// it; the copy must hold the newest data.
	Read = shard.Read
	// Update leases read and rewrite the copy: it must hold the newest
	// data, as for Read, and the lease is exclusive of moves, as for Write.
	Update = shard.Update
	// Write leases wait until no move reads the copy; moves from the copy
	// wait until the lease is released. The copy's old contents are
	// undefined (space reserved by Alloc will do). Release makes the copy
	// the newest: every other copy becomes stale, and the shard is dirty
	// unless the copy is home.
	Write = shard.Write
)

// Link is a one-way path between adjacent tiers (shard.Link, as prefetch's).
type Link = shard.Link

const (
	NVMeToHost = shard.NVMeToHost // NVMe read into pinned host memory
	HostToHBM  = shard.HostToHBM  // upload (host -> device copy)
	HBMToHost  = shard.HBMToHost  // download (device -> host copy)
	HostToNVMe = shard.HostToNVMe // NVMe write
)

// LinkCount is the number of links.
const LinkCount = shard.LinkCount

// Op is the handle of one submitted Move. It completes once: Done turns
// true, Ready's channel closes, Wait returns, and Options.OnComplete is
// called (for moves that were not already complete when Submit returned).
type Op struct {
	move  Move
	done  chan struct{}
	err   error
	bytes int64 // bytes put on links
	start time.Time
	took  time.Duration
}

func newOp(m Move) *Op { return &Op{move: m, done: make(chan struct{}), start: time.Now()} }

// doneOp is an Op complete at birth (instant moves, no-ops).
func doneOp(m Move) *Op {
	o := newOp(m)
	close(o.done)
	return o
}

// Move is what was submitted.
func (o *Op) Move() Move { return o.move }

// Wait blocks until the move has completed and returns its error.
func (o *Op) Wait() error {
	<-o.done
	return o.err
}

// Done reports whether the move has completed, without blocking.
func (o *Op) Done() bool {
	select {
	case <-o.done:
		return true
	default:
		return false
	}
}

// Ready is closed when the move completes.
func (o *Op) Ready() <-chan struct{} { return o.done }

// Err is the move's error once Done; nil before.
func (o *Op) Err() error {
	if !o.Done() {
		return nil
	}
	return o.err
}

// Bytes is the number of bytes the move put on links (0 for instant moves
// and no-ops), once Done.
func (o *Op) Bytes() int64 {
	if !o.Done() {
		return 0
	}
	return o.bytes
}

// Duration is the time from Submit to completion, once Done.
func (o *Op) Duration() time.Duration {
	if !o.Done() {
		return 0
	}
	return o.took
}
