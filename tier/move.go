package tier

import (
	"fmt"
	"time"

	"github.com/strata-ai/strata/internal/shard"
)

// Reason says what a Move asks of the store. The values and their meaning
// are those of prefetch.Reason, so the engine converts a planned move with
// tier.Reason(m.Reason).
type Reason uint8

const (
	// Prefetch copies the shard From -> To; the From copy stays.
	Prefetch Reason = iota
	// Demand is Prefetch for an access that is already waiting.
	Demand
	// Evict drops the From copy. A copy that holds the only valid data of
	// the shard is first written back to To (or home), then dropped.
	Evict
	// WriteBack copies From -> To and then drops the From copy.
	WriteBack
	// Alloc reserves space for the shard in To (contents undefined), for a
	// Write lease.
	Alloc
	reasonCount
)

func (r Reason) String() string {
	switch r {
	case Prefetch:
		return "prefetch"
	case Demand:
		return "demand"
	case Evict:
		return "evict"
	case WriteBack:
		return "writeback"
	case Alloc:
		return "alloc"
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Move is one instruction to the store. It has the fields of prefetch.Move:
//
//	tier.Move{ID: m.ID, Key: m.Key, From: m.From, To: m.To, SizeBytes: m.SizeBytes, Reason: tier.Reason(m.Reason)}
type Move struct {
	ID        uint64 // the caller's; the store only carries it
	Key       shard.Key
	From, To  shard.Tier
	SizeBytes int64 // informative; the store uses the registered size
	Reason    Reason
}

func (m Move) String() string {
	switch m.Reason {
	case Evict:
		return fmt.Sprintf("evict %s from %s", m.Key, m.From)
	case Alloc:
		return fmt.Sprintf("alloc %s in %s", m.Key, m.To)
	}
	return fmt.Sprintf("%s %s %s->%s", m.Reason, m.Key, m.From, m.To)
}

// Link is a one-way path between adjacent tiers, numbered as prefetch.Link.
type Link uint8

const (
	NVMeToHost Link = iota // NVMe read into pinned host memory
	HostToHBM              // upload (host -> device copy)
	HBMToHost              // download (device -> host copy)
	HostToNVMe             // NVMe write
	linkCount
)

// LinkCount is the number of links.
const LinkCount = int(linkCount)

func (l Link) String() string {
	switch l {
	case NVMeToHost:
		return "nvme->host"
	case HostToHBM:
		return "host->hbm"
	case HBMToHost:
		return "hbm->host"
	case HostToNVMe:
		return "host->nvme"
	}
	return fmt.Sprintf("link(%d)", uint8(l))
}

// linkOf returns the link between adjacent tiers.
func linkOf(from, to shard.Tier) (Link, bool) {
	switch {
	case from == shard.NVMe && to == shard.Host:
		return NVMeToHost, true
	case from == shard.Host && to == shard.HBM:
		return HostToHBM, true
	case from == shard.HBM && to == shard.Host:
		return HBMToHost, true
	case from == shard.Host && to == shard.NVMe:
		return HostToNVMe, true
	}
	return 0, false
}

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
