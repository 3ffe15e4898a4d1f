package shard

import (
	"fmt"
	"time"
)

//go:generate go tool stringer -type=Phase,Kind -linecomment -output=access_string.go

// Phase is the part of a training step an access belongs to.
type Phase uint8

const (
	Forward   Phase = iota // fwd
	Backward               // bwd
	Optimizer              // opt
)

// Kind says what the compute does with the shard. The planner plans by it
// and the store leases by it: a Read lease shares the copy, Update and
// Write leases are exclusive of moves reading the copy and make it the
// newest version at release.
type Kind uint8

const (
	// Read needs the current contents in the access tier (params in
	// forward/backward, a gradient read by the optimizer).
	Read Kind = iota // read
	// Update reads and rewrites in place (master, m, v in the optimizer):
	// the copy is dirty after release.
	Update // update
	// Write produces the shard without reading it (a gradient in backward,
	// the new bf16 param written by the optimizer): only space is needed,
	// and every other copy is stale after release.
	Write // write
)

// Access is one use of one shard by the compute.
type Access struct {
	Key   Key
	Phase Phase
	// Tier is where the compute needs the shard: HBM for params in forward
	// and backward, Host for master/m/v/grad in the optimizer.
	Tier      Tier
	Kind      Kind
	SizeBytes int64
	// Compute is the measured time from the moment the shard was ready to
	// the start of the next access: the compute this access feeds. It is
	// what a planner sums deadlines from; ignored where an access begins.
	Compute time.Duration
	// Ahead says the access was declared before its use (tier.Runner.Begin:
	// the rank declares the optimizer's accesses and cpuadam waits for
	// them): a planner judges it a hit, late or a miss when it is awaited,
	// not when it is declared.
	Ahead bool
	// Conditional says the access happens only in the steps that need it
	// (a mixture of experts' expert, which only the tokens routed to it
	// need): a planner keeps its place in the trace but moves nothing for
	// it until the step confirms it, and the step may skip it instead
	// (prefetch.Planner.Confirm and Skip).
	Conditional bool
}

func (a Access) String() string {
	return fmt.Sprintf("%s %s@%s %s", a.Phase, a.Key, a.Tier, a.Kind)
}

// SameSlot reports whether b is the access a predicted: the same shard,
// tier and kind (phase, size and compute aside).
func (a Access) SameSlot(b Access) bool {
	return a.Key == b.Key && a.Tier == b.Tier && a.Kind == b.Kind
}
