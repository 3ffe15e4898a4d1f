package tier

import (
	"errors"
	"fmt"
	"strings"

	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// Sizes are what a store's budgets are derived from. Shard bytes count as
// the store charges them (rounded up to the I/O alignment), per rank unless
// named otherwise; the ranks' shares are equal.
type Sizes struct {
	Ranks int // devices, one rank each

	// HBMFreeBytes is the least any device has left after the model state
	// the store does not hold, the activations and the workspace.
	HBMFreeBytes int64
	// ParamBytes is one rank's param shards that the store stages in HBM
	// (0: none, and no HBM budget), MaxParamBytes the largest of them.
	ParamBytes, MaxParamBytes int64
	// SlotShards are the classes of one rank's shards whose HBM copies the
	// slots of Store.ReserveHBM hold (SlabBytes): its param shards staged
	// in HBM and, with cpu_checkpointing, its saved block inputs; nil: no
	// slots.
	SlotShards []SlotClass
	// HBMBytes overrides the HBM budget (engine.Options.TierHBMBytes); 0:
	// ParamBytes, at most HBMFreeBytes.
	HBMBytes int64
	// ActivationHBMBytes is the HBM room, beyond the params', for the
	// copies of saved block inputs brought back for the backward
	// (cpu_checkpointing); 0: none.
	ActivationHBMBytes int64

	// HomeBytes is one rank's shards homed in host RAM, StagingBytes the
	// room for shards staged through the host beyond their homes
	// (estimate.HostStagingBytes), SpareBytes the room for reads outside the
	// plan (the largest fp32 shard).
	HomeBytes, StagingBytes, SpareBytes int64
	// HostBudgetBytes is strata.host_budget (all ranks; 0: none): the
	// pinned pool is then exactly this, the store gets HostShare of it.
	HostBudgetBytes int64
	// OptimizerOnHost says that the optimizer state is homed in host RAM,
	// so that a host budget too small for it can name NVMe as a way out.
	OptimizerOnHost bool
	// Inference says that the engine only evaluates: there is no optimizer
	// state to move, and the host holds the params and the staging of a
	// batch, so a host too small for them names those instead.
	Inference bool
	// Static says that every shard stays in its home in host RAM (no NVMe
	// tier, nothing staged in HBM: ZeRO-Offload). Its host buffers are
	// taken once, at Register, and never come and go, so the store needs no
	// spare room and the pool no room against fragmentation: the pool is
	// the homes (buffers are carved from one mapping).
	Static bool
}

// Budgets are a store's: Options.HBMBudgetBytes and HostBudgetBytes, each
// rank's planner's share of the host budget, and the pinned pool to make.
type Budgets struct {
	HBMBytes      int64 // per device; 0 when nothing is staged in HBM
	HBMSlabBytes  int64 // per device: the slots that hold HBMBytes of Sizes.SlotShards (SlabBytes)
	HostBytes     int64 // all ranks
	PlanHostBytes int64 // each rank's planner: its homes and staging room
	PoolBytes     int64 // the pinned pool the host copies come from
}

// HostShare is the store's share of a host budget given as a whole: 4/5 of
// it (shard.HostShare, which the estimate reads too).
func HostShare(hostBudgetBytes int64) int64 { return shard.HostShare(hostBudgetBytes) }

// PlanBudgets derives the budgets from s. HBM: the rank's param shards, at
// most what is left per device (or s.HBMBytes), and at least two of the
// largest (one in use, the next arriving), plus the room for saved block
// inputs (s.ActivationHBMBytes); the slots that hold the shards of that
// budget (HBMSlabBytes, SlabBytes of s.SlotShards) must fit in what is
// left too, which may lower the params' default room below what is left
// when shards of several classes share it. Host: the homes in RAM, the
// staging room and one spare shard per rank; the pinned pool a quarter more
// (and four spare shards) against fragmentation, or for a static store
// (Sizes.Static) only the homes. With a host budget the
// pool is the budget and the store's share (HostShare) must hold the same;
// a static store's pool must fit in the budget, and stays its own size.
// The errors say what does not fit and what to raise.
func PlanBudgets(s Sizes) (Budgets, error) {
	if s.Ranks < 1 {
		panic(fmt.Sprintf("tier: PlanBudgets for %d ranks", s.Ranks))
	}
	b, err := planHBM(s)
	if err != nil {
		return Budgets{}, err
	}
	n := int64(s.Ranks)
	spare := s.SpareBytes
	if s.Static {
		spare = 0
	}
	b.PlanHostBytes = s.HomeBytes + s.StagingBytes
	b.HostBytes = n * (b.PlanHostBytes + spare)
	b.PoolBytes = b.HostBytes + b.HostBytes/4 + 4*spare
	if s.Static {
		b.PoolBytes = b.HostBytes
	}
	hint := ""
	if s.OptimizerOnHost && !s.Inference {
		hint = ", or put the optimizer state on NVMe (offload_optimizer nvme)"
	}
	if s.HostBudgetBytes > 0 && s.Static {
		// The homes never move: the pool pins what they take, not the
		// whole budget, and the budget bounds it.
		if b.PoolBytes > s.HostBudgetBytes {
			return Budgets{}, fmt.Errorf("tier: strata.host_budget %s is too small: the state homed in host RAM takes %s (the homes, all ranks): raise it%s",
				units.FormatBytes(s.HostBudgetBytes), units.FormatBytes(b.PoolBytes), hint)
		}
		return b, nil
	}
	if s.HostBudgetBytes > 0 {
		if HostShare(s.HostBudgetBytes) < b.HostBytes {
			return Budgets{}, fmt.Errorf("tier: strata.host_budget %s is too small: the tier store needs %s (%s homes in host RAM, %s staging room, %s spare, all ranks) and a quarter more against fragmentation: raise it%s",
				units.FormatBytes(s.HostBudgetBytes), units.FormatBytes(b.HostBytes), units.FormatBytes(n*s.HomeBytes),
				units.FormatBytes(n*s.StagingBytes), units.FormatBytes(n*spare), hint)
		}
		b.PoolBytes = s.HostBudgetBytes
		b.HostBytes = HostShare(s.HostBudgetBytes)
		b.PlanHostBytes = b.HostBytes/n - spare
	}
	return b, nil
}

// planHBM is PlanBudgets' HBM part: the params' room, the saved inputs'
// room beyond it, and the slots of both.
func planHBM(s Sizes) (Budgets, error) {
	var room int64 // the params'
	if s.ParamBytes > 0 {
		// By default what is left after the saved inputs' room: the
		// params' shards, or as many as fit beside the inputs.
		room = min(s.HBMFreeBytes-s.ActivationHBMBytes, s.ParamBytes)
		if s.HBMBytes > 0 {
			room = s.HBMBytes
			if s.HBMBytes > s.HBMFreeBytes {
				return Budgets{}, fmt.Errorf("tier: hbm budget %s is more than the %s left per device after model state, activations and workspace: lower it or raise strata.hbm_bytes",
					units.FormatBytes(s.HBMBytes), units.FormatBytes(s.HBMFreeBytes))
			}
		}
		if room < 2*s.MaxParamBytes {
			return Budgets{}, fmt.Errorf("tier: %s of device memory left for param shards, the tier store needs at least two of the largest (%s): raise strata.hbm_bytes or use more devices",
				units.FormatBytes(max(room, 0)), units.FormatBytes(2*s.MaxParamBytes))
		}
	}
	act := s.ActivationHBMBytes
	if left := s.HBMFreeBytes - room; act > 0 && act > left {
		return Budgets{}, fmt.Errorf("tier: %s of device memory left beyond the params' room, the saved block inputs need %s (two, brought back for the backward): raise strata.hbm_bytes or use more devices",
			units.FormatBytes(max(left, 0)), units.FormatBytes(act))
	}
	slab := SlabBytes(room+act, s.SlotShards)
	if slab > 0 && slab > s.HBMFreeBytes {
		inputs := ""
		if act > 0 {
			inputs = fmt.Sprintf(" with the saved block inputs' %s", units.FormatBytes(act))
		}
		if s.HBMBytes > 0 {
			return Budgets{}, fmt.Errorf("tier: hbm budget %s%s takes %s of device memory in slots (one per shard it can hold, per shard size), more than the %s left per device after model state, activations and workspace: lower it or raise strata.hbm_bytes",
				units.FormatBytes(s.HBMBytes), inputs, units.FormatBytes(slab), units.FormatBytes(s.HBMFreeBytes))
		}
		room = largestRoom(room, act, s.HBMFreeBytes, s.SlotShards)
		slab = SlabBytes(room+act, s.SlotShards)
		if room < 2*s.MaxParamBytes || slab > s.HBMFreeBytes {
			return Budgets{}, fmt.Errorf("tier: %s of device memory left for param shards once their slots%s fit in the %s left per device (one slot per shard the budget can hold, per shard size), the tier store needs at least two of the largest (%s): raise strata.hbm_bytes or use more devices",
				units.FormatBytes(room), inputs, units.FormatBytes(s.HBMFreeBytes), units.FormatBytes(2*s.MaxParamBytes))
		}
	}
	return Budgets{HBMBytes: room + act, HBMSlabBytes: slab}, nil
}

// largestRoom is the largest params' room up to hi whose slots, with the
// saved inputs' room act beside it (SlabBytes of room+act, nondecreasing
// in it), fit in freeBytes; 0 when none does.
func largestRoom(hi, act, freeBytes int64, shards []SlotClass) int64 {
	lo := int64(0)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if SlabBytes(mid+act, shards) <= freeBytes {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// inferenceFix is CheckHostMemory's way out for an inference engine, which
// has no optimizer state: fewer windows at a time, or the params on NVMe.
const inferenceFix = "an evaluation has no optimizer state: evaluate fewer windows at a time (train_micro_batch_size_per_gpu; strata eval's --batch), or put the params on NVMe (offload_param nvme; strata eval --offload nvme)"

// CheckHostMemory refuses pinned host memory the host cannot give before
// anything is allocated (its errors name the config keys and carry no
// package prefix: the engine's are its own): the store's pool for sizes (strata.host_budget
// when sizes.HostBudgetBytes is set) and staging bytes pinned beside it, above
// MemAvailable, or, with lock LockRequired and no
// CAP_IPC_LOCK, above RLIMIT_MEMLOCK (pinned.CheckHost), or past what
// RLIMIT_AS leaves the process (hostmem.CheckAddressSpace: the pool is
// mapped whole at the start). With
// strata.host_budget the pool is the budget and the error names the key;
// without, the pool is what the layout homes in host RAM (tier.PlanBudgets;
// where that cannot be planned yet New's own call says why).
func CheckHostMemory(sizes Sizes, staging int64, lock pinned.LockMode, meminfo string) error {
	hb := sizes.HostBudgetBytes
	pool := hb
	if hb <= 0 {
		sizes.HBMFreeBytes = 1 << 60 // the host's part does not depend on it
		b, err := PlanBudgets(sizes)
		if err != nil {
			return nil
		}
		pool = b.PoolBytes
	}
	total, fits := units.Add(pool, staging)
	if !fits {
		return fmt.Errorf("pinned host memory %s and %s of upload staging: more than 2^63 bytes", units.FormatBytes(pool), units.FormatBytes(staging))
	}
	what := fmt.Sprintf("strata.host_budget %s (pinned host memory, and %s of upload staging)", units.FormatBytes(hb), units.FormatBytes(staging))
	if hb <= 0 {
		what = fmt.Sprintf("the tier store's pinned host memory, %s (the state homed in host RAM, all ranks, with its staging and spare room), and %s of upload staging,",
			units.FormatBytes(pool), units.FormatBytes(staging))
	}
	err := pinned.CheckHost(total, lock, meminfo)
	var he *pinned.HostError
	if err == nil {
		return hostmem.CheckAddressSpace(strings.TrimSuffix(what, ","), total)
	}
	if !errors.As(err, &he) {
		return err
	}
	if he.LockLimitBytes >= 0 {
		fix := fmt.Sprintf("lower strata.host_budget to at most %s", units.FormatBytes(max(he.LockLimitBytes-staging, 0)))
		if hb <= 0 {
			fix = "put the optimizer state on NVMe (offload_optimizer nvme) with a strata.host_budget below the limit"
			if sizes.Inference {
				fix = inferenceFix
			}
		}
		return fmt.Errorf("%s must be locked (PinnedLock LockRequired), but RLIMIT_MEMLOCK is %s and the process has no CAP_IPC_LOCK: raise the limit (`ulimit -l`, LimitMEMLOCK= or /etc/security/limits.conf), grant CAP_IPC_LOCK, or %s",
			what, units.FormatBytes(he.LockLimitBytes), fix)
	}
	room := units.FormatBytes(max(he.AvailableBytes-staging, 0))
	fix := "lower strata.host_budget to at most " + room
	if hb <= 0 {
		fix = "put the optimizer state on NVMe (offload_optimizer nvme) with strata.host_budget at most " + room
		if sizes.Inference {
			fix = inferenceFix
		}
	}
	return fmt.Errorf("%s is more than the host's available memory, %s (MemAvailable in %s): the run would be killed for memory; %s, or free memory",
		what, units.FormatBytes(he.AvailableBytes), he.Meminfo, fix)
}
