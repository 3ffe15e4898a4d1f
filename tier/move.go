package tier

import (
	"time"

	"github.com/strata-ai/strata/shard"
)

// Op is the handle of one submitted Move. It completes once: Done turns
// true, Ready's channel closes, Wait returns, and Options.OnComplete is
// called (for moves that were not already complete when Submit returned).
type Op struct {
	move  shard.Move
	done  chan struct{}
	err   error
	bytes int64 // bytes put on links
	start time.Time
	took  time.Duration
}

func newOp(m shard.Move) *Op { return &Op{move: m, done: make(chan struct{}), start: time.Now()} }

// doneOp is an Op complete at birth (instant moves, no-ops).
func doneOp(m shard.Move) *Op {
	o := newOp(m)
	close(o.done)
	return o
}

// Move is what was submitted.
func (o *Op) Move() shard.Move { return o.move }

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
