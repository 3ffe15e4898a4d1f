package shard

import "fmt"

//go:generate go tool stringer -type=Link,Reason -linecomment -output=move_string.go

// Link is a one-way path between adjacent tiers. The HBM links exist once
// per device (rank); the NVMe links are shared by all ranks.
type Link uint8

const (
	// NVMeToHost is an NVMe read into pinned host memory.
	NVMeToHost Link = iota // nvme->host
	// HostToHBM is an upload (host -> device copy over PCIe/NVLink-C2C).
	HostToHBM // host->hbm
	// HBMToHost is a download (gradients, write-backs).
	HBMToHost // hbm->host
	// HostToNVMe is an NVMe write (write-backs).
	HostToNVMe // host->nvme
)

// LinkCount is the number of links.
const LinkCount = int(HostToNVMe) + 1

// LinkOf returns the link from one tier to an adjacent one.
func LinkOf(from, to Tier) (Link, bool) {
	switch {
	case from == NVMe && to == Host:
		return NVMeToHost, true
	case from == Host && to == HBM:
		return HostToHBM, true
	case from == HBM && to == Host:
		return HBMToHost, true
	case from == Host && to == NVMe:
		return HostToNVMe, true
	}
	return 0, false
}

// Reason says why a move exists: the planner (prefetch) emits moves with a
// reason and the store (tier) executes them by it.
type Reason uint8

const (
	// Prefetch copies a shard From -> To ahead of a predicted access; the
	// From copy stays. (The planner's write-behind is a Prefetch toward the
	// home tier, so a Prefetch does not always go toward a faster tier.)
	Prefetch Reason = iota // prefetch
	// Demand is a Prefetch for an access that is already waiting (a miss).
	Demand // demand
	// Evict drops the From copy; a valid copy remains in a slower tier (To).
	// The store writes a copy that holds the only valid data back first.
	Evict // evict
	// WriteBack copies a dirty copy From -> To, then drops the From copy.
	WriteBack // writeback
	// Alloc reserves space in To (contents undefined) for an access that
	// only writes.
	Alloc // alloc
)

// ReasonCount is the number of reasons.
const ReasonCount = int(Alloc) + 1

// Move is one instruction from a planner to a store: prefetch emits moves,
// tier executes them.
type Move struct {
	ID        uint64 // the planner's; the store only carries it
	Key       Key
	From, To  Tier
	SizeBytes int64 // informative; the store uses the registered size
	Reason    Reason
	// WriteBehind marks a Prefetch that copies a dirty copy one tier down
	// to its home while the link is idle, keeping the source: the copy is
	// clean when it lands, so its eviction later is instant. The store
	// executes it as any Prefetch (copy From -> To, the From copy stays).
	WriteBehind bool
}

// Instant reports whether the move completes as the store applies it
// (Evict, Alloc): a planner counts it done when it emits it.
func (m Move) Instant() bool { return m.Reason == Evict || m.Reason == Alloc }

// Link is the link a transfer uses; false for instant moves.
func (m Move) Link() (Link, bool) {
	if m.Instant() {
		return 0, false
	}
	return LinkOf(m.From, m.To)
}

func (m Move) String() string {
	size := ""
	if m.SizeBytes > 0 {
		size = fmt.Sprintf(" (%d B)", m.SizeBytes)
	}
	switch {
	case m.Reason == Evict:
		return fmt.Sprintf("evict %s from %s", m.Key, m.From)
	case m.Reason == Alloc:
		return fmt.Sprintf("alloc %s in %s%s", m.Key, m.To, size)
	case m.WriteBehind:
		return fmt.Sprintf("writebehind %s %s->%s%s", m.Key, m.From, m.To, size)
	}
	return fmt.Sprintf("%s %s %s->%s%s", m.Reason, m.Key, m.From, m.To, size)
}
