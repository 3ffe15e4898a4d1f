// Package shard is the vocabulary of movement that engine, tier and
// prefetch share.
//
// A chunk (all parameters of one transformer block, or a bounded slice of
// a large one) is sharded across the local ranks, and each shard has up to
// five states, each of which lives in one tier (and a block's chunk names
// one more thing that moves between tiers: the saved input of activation
// checkpointing, rank by rank). An Access says what the compute does with
// a shard (its Phase and Kind); a Move is what a planner asks a store to
// do with one. The package holds types and no state; it is public so that
// a library user names tiers and links (TierStats.LinkBytes[shard.HostToHBM])
// as the engine does.
package shard

import "fmt"

// ChunkID numbers the chunks of a model in forward order.
type ChunkID int32

//go:generate go tool stringer -type=State,Tier -linecomment -output=shard_string.go

// State is one of the per-shard tensors of mixed-precision Adam, or a
// block's saved input (Activation). Its String is the name on each
// constant's line (shard_string.go, by stringer).
type State uint8

const (
	// Param is the bf16 parameters (2 B/param).
	Param State = iota // param
	// Grad is the reduced gradient shard (2 or 4 B/param).
	Grad // grad
	// Master is the fp32 master weights (4 B/param).
	Master // master
	// AdamM is the fp32 first moment (4 B/param).
	AdamM // adam_m
	// AdamV is the fp32 second moment (4 B/param).
	AdamV // adam_v
	// Activation is not model state: a checkpointed block's saved input
	// (B·T·C of the activation dtype), kept in host memory between the
	// block's forward and its backward (cpu_checkpointing). Its Key names
	// the block's chunk.
	Activation // activation
)

// StateCount is the number of states.
const StateCount = int(Activation) + 1

// Tier is a level of the memory hierarchy, fastest first.
type Tier uint8

const (
	// HBM is device memory.
	HBM Tier = iota // hbm
	// Host is pinned host RAM.
	Host // host
	// NVMe is swap files through the nvme engine.
	NVMe // nvme
)

// TierCount is the number of tiers.
const TierCount = int(NVMe) + 1

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

// HostShare is the tier store's share of a host budget given as a whole
// (strata.host_budget): 4/5 of it. The pinned pool holds the whole budget;
// the rest absorbs the fragmentation of shards of several sizes coming and
// going. The store (tier) and the estimate both read it from here, so that
// the arithmetic needs no I/O package.
func HostShare(hostBudgetBytes int64) int64 { return hostBudgetBytes * 4 / 5 }

// Key names one shard state: chunk c's slice owned by rank r, state s.
type Key struct {
	Chunk ChunkID
	Rank  int32
	State State
}

func (k Key) String() string { return fmt.Sprintf("chunk %d rank %d %s", k.Chunk, k.Rank, k.State) }
