package prefetch

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/strata-ai/strata/shard"
)

// Options are the inputs of planning besides the trace and the residency.
type Options struct {
	// BudgetBytes per tier. The HBM budget applies to each device (rank)
	// separately and should exclude what the engine keeps outside the
	// planner (gathered chunks, activations). 0 means unlimited.
	BudgetBytes [shard.TierCount]int64
	// BandwidthBytesPerSec of each link, measured. HBM links are per device.
	BandwidthBytesPerSec [shard.LinkCount]float64
	// Slack is the margin by which every transfer aims to finish before the
	// deadline of the access that needs it.
	Slack time.Duration
	// ComputeSteps is how many recorded steps the planner predicts compute
	// from: each access's compute is the shortest it took in the last
	// ComputeSteps steps with the same accesses (0 means 4; 1: the last
	// step alone). On a busy machine a layer can run 30 % faster than it
	// did in the step before; predicting the shorter time issues the
	// transfer earlier rather than late.
	ComputeSteps int
	// Window is how many accesses ahead the planner looks (its horizon:
	// every plan build is linear in it, see the package doc's Cost). 0
	// means automatic (see HorizonChains): the accesses that cover
	// HorizonChains times the longest transfer chain of the trace per
	// rank, at least MinWindow. A window at least the trace's length is one whole
	// step (the schedule is cyclic, so that reaches into the next one).
	Window int
	// DisableWriteBehind turns off the write-behind of dirty copies (see
	// Move.WriteBehind): they are then written back only when evicted.
	DisableWriteBehind bool
	// WriteBehindDepth is how many transfers may be in flight on a link
	// when a write-behind is added to it (planner transfers and other
	// write-behinds): 0 or 1 = only an idle link takes one. A drive with
	// a deep queue (NVMe) writes several at once faster than one by one.
	WriteBehindDepth int
	// DisableEager keeps every transfer at its latest start (ALAP), also
	// into pools that the trace does not overflow; by default those are
	// issued as soon as their source is ready (see Planner's doc).
	DisableEager bool
	// WaitForVictim makes a prefetch wait for Belady's busy victim even
	// when waiting makes it land after its deadline (MIN's fetch count,
	// at the cost of stall: the oracle tests). By default it then takes
	// the best victim free now (see makeRoom).
	WaitForVictim bool
}

// The automatic window (Options.Window 0): the accesses predicted to start
// within HorizonChains × ranks × (the longest transfer chain any access of
// the trace can need, from its home at the current bandwidths, plus the
// slack) of any access, ranks being those this planner plans for (their
// transfers share the NVMe links), and never fewer than MinWindow.
const (
	HorizonChains = 4
	MinWindow     = 32
)

// DefaultOptions are budgets unlimited, PCIe 4 x16-like host links, one
// NVMe drive, 1 ms of slack, the automatic window.
func DefaultOptions() Options {
	return Options{
		BandwidthBytesPerSec: [shard.LinkCount]float64{
			shard.NVMeToHost: 3e9,
			shard.HostToHBM:  20e9,
			shard.HBMToHost:  20e9,
			shard.HostToNVMe: 2e9,
		},
		Slack: time.Millisecond,
	}
}

// Validate checks that every value is usable.
func (o Options) Validate() error {
	for t, b := range o.BudgetBytes {
		if b < 0 {
			return fmt.Errorf("prefetch: %s budget %d B is negative (0 means unlimited)", shard.Tier(t), b)
		}
	}
	for l, bw := range o.BandwidthBytesPerSec {
		if !(bw > 0) || math.IsInf(bw, 0) {
			return fmt.Errorf("prefetch: %s bandwidth %v B/s must be positive and finite (measure it with strata bench nvme)", shard.Link(l), bw)
		}
	}
	if o.Slack < 0 {
		return fmt.Errorf("prefetch: negative slack %v", o.Slack)
	}
	if o.ComputeSteps < 0 {
		return fmt.Errorf("prefetch: negative compute steps %d", o.ComputeSteps)
	}
	if o.Window < 0 {
		return fmt.Errorf("prefetch: negative window %d", o.Window)
	}
	if o.WriteBehindDepth < 0 {
		return fmt.Errorf("prefetch: negative write-behind depth %d", o.WriteBehindDepth)
	}
	return nil
}

// TransferTime is the modeled time to move n bytes over link l, rounded up.
func (o Options) TransferTime(l shard.Link, n int64) time.Duration {
	s := float64(n) / o.BandwidthBytesPerSec[l]
	return time.Duration(math.Ceil(s * 1e9))
}

func (o Options) String() string {
	var b strings.Builder
	b.WriteString("budget")
	for t, v := range o.BudgetBytes {
		fmt.Fprintf(&b, " %s=%d", shard.Tier(t), v)
	}
	b.WriteString(" bandwidth")
	for l, v := range o.BandwidthBytesPerSec {
		fmt.Fprintf(&b, " %s=%.4g", shard.Link(l), v)
	}
	fmt.Fprintf(&b, " slack=%v window=%d", o.Slack, o.Window)
	if o.DisableWriteBehind {
		b.WriteString(" writebehind=off")
	}
	if o.DisableEager {
		b.WriteString(" eager=off")
	}
	return b.String()
}

// TierSet is a set of tiers.
type TierSet uint8

// Tiers builds a set.
func Tiers(ts ...shard.Tier) TierSet {
	var s TierSet
	for _, t := range ts {
		s |= 1 << t
	}
	return s
}

// Has reports whether t is in the set.
func (s TierSet) Has(t shard.Tier) bool { return s&(1<<t) != 0 }

// Placement is where one shard state lives when planning starts.
type Placement struct {
	SizeBytes int64
	// TierBytes, when set, is the shard's size in each tier where it
	// differs (a coded shard: bf16 in HBM, NF4 in host RAM and on NVMe);
	// zero entries are SizeBytes. The links carry its host size.
	TierBytes [shard.TierCount]int64
	// Home is where the shard persists; its space there is always held.
	Home shard.Tier
	// Cached lists the other tiers that hold a clean copy.
	Cached TierSet
}

// Residency is the placement of every shard the planner may see.
type Residency map[shard.Key]Placement
