// Package shard is the vocabulary of movement shared by engine, tier and
// prefetch: a chunk (all parameters of one transformer block, or a bounded
// slice of a large one) is sharded across the local ranks, and each shard
// has up to five states, each of which lives in one tier (and a block's
// chunk names one more thing that moves between tiers: the saved input of
// activation checkpointing, rank by rank). An Access says
// what the compute does with a shard (its Phase and Kind); a Move is what a
// planner asks a store to do with one. It holds types and no state.
package shard

import "fmt"

// ChunkID numbers the chunks of a model in forward order.
type ChunkID int32

// State is one of the per-shard tensors of mixed-precision Adam, or a
// block's saved input (Activation).
type State uint8

const (
	Param  State = iota // bf16 parameters (2 B/param)
	Grad                // reduced gradient shard (2 or 4 B/param)
	Master              // fp32 master weights (4 B/param)
	AdamM               // fp32 first moment (4 B/param)
	AdamV               // fp32 second moment (4 B/param)
	// Activation is not model state: a checkpointed block's saved input
	// (B·T·C of the activation dtype), kept in host memory between the
	// block's forward and its backward (cpu_checkpointing). Its Key names
	// the block's chunk.
	Activation
	stateCount
)

// StateCount is the number of states.
const StateCount = int(stateCount)

func (s State) String() string {
	switch s {
	case Param:
		return "param"
	case Grad:
		return "grad"
	case Master:
		return "master"
	case AdamM:
		return "adam_m"
	case AdamV:
		return "adam_v"
	case Activation:
		return "activation"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Tier is a level of the memory hierarchy, fastest first.
type Tier uint8

const (
	HBM  Tier = iota // device memory
	Host             // pinned host RAM
	NVMe             // swap files through the nvme engine
	tierCount
)

// TierCount is the number of tiers.
const TierCount = int(tierCount)

func (t Tier) String() string {
	switch t {
	case HBM:
		return "hbm"
	case Host:
		return "host"
	case NVMe:
		return "nvme"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTier reads the names DeepSpeed's offload_*.device uses: none (= hbm), cpu (= host), nvme.
func ParseTier(s string) (Tier, error) {
	switch s {
	case "none", "hbm", "gpu", "device":
		return HBM, nil
	case "cpu", "host":
		return Host, nil
	case "nvme":
		return NVMe, nil
	}
	return 0, fmt.Errorf("shard: unknown tier %q (want none, cpu or nvme)", s)
}

// Key names one shard state: chunk c's slice owned by rank r, state s.
type Key struct {
	Chunk ChunkID
	Rank  int32
	State State
}

func (k Key) String() string { return fmt.Sprintf("chunk %d rank %d %s", k.Chunk, k.Rank, k.State) }
