package tier

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

var (
	// ErrBudget matches every *BudgetError.
	ErrBudget = errors.New("tier: budget exceeded")
	// ErrNotResident: the shard has no usable copy in that tier (absent,
	// stale, reserved but never written, or being evicted).
	ErrNotResident = errors.New("not resident")
	// ErrLost: a copy's data was found corrupt (checksum mismatch); the copy
	// holds no valid data. The shard is lost when no other copy is valid.
	ErrLost = errors.New("data lost")
	// ErrLeased: the copy is leased, so it cannot be dropped or overwritten.
	ErrLeased = errors.New("leased")
	// ErrBusy: a move in flight reads, fills or drops the copy.
	ErrBusy = errors.New("move in flight")
	// ErrUnknown: the shard was never registered.
	ErrUnknown = errors.New("unknown shard")
	// ErrBadMove: the move does not make sense for the store (a tier that is
	// not configured, the home copy dropped, From == To ...).
	ErrBadMove = errors.New("bad move")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("store closed")
)

// MoveError is the error of a move that failed while in flight: which move
// (its shard: chunk, rank, state; its link) and the cause, which for NVMe
// names the file and the offset (*nvme.IOError, *nvme.CorruptionError).
type MoveError struct {
	Move shard.Move
	Err  error
}

func (e *MoveError) Error() string {
	return fmt.Sprintf("tier: %s: %v", e.Move, e.Err)
}

func (e *MoveError) Unwrap() error { return e.Err }

// inner presents an error of this package (a *MoveError kept as a copy's
// cause) inside another one: errors.Is and As still see it, and its message
// drops the "tier: " prefix the outer error already has, so the chain names
// the package once.
type inner struct{ err error }

func (e inner) Error() string { return strings.TrimPrefix(e.err.Error(), "tier: ") }

func (e inner) Unwrap() error { return e.err }

// ChunkUse is the bytes one chunk holds in a tier.
type ChunkUse struct {
	Chunk shard.ChunkID
	Bytes int64
}

// BudgetError says that a placement would exceed a tier's budget, and who
// uses that tier: bytes by state and by chunk (copies and staging buffers,
// including those of moves in flight).
type BudgetError struct {
	Tier          shard.Tier
	Device        int // the device of an HBM budget; -1 otherwise
	BudgetBytes   int64
	InUseBytes    int64
	RequestBytes  int64
	Key           shard.Key // the shard the request was for
	Purpose       string    // "copy" or "staging"
	InFlightBytes int64     // part of InUseBytes: destinations and staging of moves in flight
	ByState       [shard.StateCount]int64
	ByChunk       []ChunkUse // largest first
}

func (e *BudgetError) Error() string {
	var b strings.Builder
	where := e.Tier.String()
	if e.Device >= 0 {
		where = fmt.Sprintf("hbm of device %d", e.Device)
	}
	fmt.Fprintf(&b, "tier: %s budget %s exceeded: %s for %s (%s) does not fit, %s in use (%s in flight)",
		where, units.FormatBytes(e.BudgetBytes), units.FormatBytes(e.RequestBytes), e.Key, e.Purpose,
		units.FormatBytes(e.InUseBytes), units.FormatBytes(e.InFlightBytes))
	var parts []string
	for s, n := range e.ByState {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", shard.State(s), units.FormatBytes(n)))
		}
	}
	if len(parts) == 0 {
		parts = []string{"nothing"}
	}
	fmt.Fprintf(&b, "; by state: %s", strings.Join(parts, ", "))
	parts = parts[:0]
	const show = 8
	for i, c := range e.ByChunk {
		if i == show {
			parts = append(parts, fmt.Sprintf("%d more chunks", len(e.ByChunk)-show))
			break
		}
		parts = append(parts, fmt.Sprintf("chunk %d %s", c.Chunk, units.FormatBytes(c.Bytes)))
	}
	if len(parts) > 0 {
		fmt.Fprintf(&b, "; by chunk: %s", strings.Join(parts, ", "))
	}
	return b.String()
}

// Is makes errors.Is(err, ErrBudget) true.
func (e *BudgetError) Is(target error) bool { return target == ErrBudget }

func sortChunks(m map[shard.ChunkID]int64) []ChunkUse {
	out := make([]ChunkUse, 0, len(m))
	for c, n := range m {
		out = append(out, ChunkUse{c, n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Chunk < out[j].Chunk
	})
	return out
}
