package tier

import (
	"fmt"
	"strings"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// Options configure a Store. Host is required; without Devices there is no
// HBM tier, without Swap no NVMe tier.
type Options struct {
	// Devices are the local devices; HBM copies of rank r live on Devices[r].
	Devices []gpu.Device
	// HBMBudgetBytes is the store's sub-budget of each device's memory (the
	// rest is the engine's: gathered chunks, activations, workspace).
	// Default: the device's whole budget (MemStats().BudgetBytes).
	HBMBudgetBytes int64
	// Host is the pinned pool host copies and staging buffers come from. It
	// may be shared with other users; the store never takes more than
	// HostBudgetBytes of it. Required.
	Host *pinned.Pool
	// HostBudgetBytes caps the store's pinned bytes (padded). Default: the
	// pool's budget.
	HostBudgetBytes int64
	// Swap is the NVMe swap space. Optional.
	Swap *nvme.Swap
	// FixedIO, when set, is the engine under Swap: New registers the Host
	// pool's arenas (fixed buffers) and the swap files (fixed files) with
	// it, and Close unregisters them. Optional; a registration that fails
	// is reported by Registration, not returned.
	FixedIO FixedIO
	// NVMeBudgetBytes caps the store's swap bytes (extents, padded to the
	// swap's alignment). Default: the swap's free bytes at New.
	NVMeBudgetBytes int64
	// OnComplete, when set, is called once for every move that was still in
	// flight when Submit returned, after the store's state reflects its
	// outcome, from a store goroutine; it may run after the Op's Wait has
	// returned. It must not block; it may call the store.
	OnComplete func(m shard.Move, err error)
}

// withDefaults fills the zero budgets from the resources.
func (o Options) withDefaults() Options {
	if o.HBMBudgetBytes == 0 && len(o.Devices) > 0 {
		o.HBMBudgetBytes = o.Devices[0].MemStats().BudgetBytes
		for _, d := range o.Devices[1:] {
			o.HBMBudgetBytes = min(o.HBMBudgetBytes, d.MemStats().BudgetBytes)
		}
	}
	if o.HostBudgetBytes == 0 && o.Host != nil {
		o.HostBudgetBytes = o.Host.Stats().BudgetBytes
	}
	if o.NVMeBudgetBytes == 0 && o.Swap != nil {
		o.NVMeBudgetBytes = o.Swap.FreeBytes()
	}
	return o
}

// Validate reports the first problem with o, defaults applied.
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Host == nil:
		return fmt.Errorf("tier: Options.Host (a pinned.Pool) is required: host copies and staging buffers come from it")
	case o.HBMBudgetBytes < 0 || o.HostBudgetBytes < 0 || o.NVMeBudgetBytes < 0:
		return fmt.Errorf("tier: negative budget (hbm %d, host %d, nvme %d)", o.HBMBudgetBytes, o.HostBudgetBytes, o.NVMeBudgetBytes)
	case o.HostBudgetBytes > o.Host.Stats().BudgetBytes:
		return fmt.Errorf("tier: host budget %s is larger than the pinned pool (%s); raise the pool's budget or lower the store's",
			units.FormatBytes(o.HostBudgetBytes), units.FormatBytes(o.Host.Stats().BudgetBytes))
	case o.Swap != nil && o.NVMeBudgetBytes > o.Swap.FreeBytes():
		return fmt.Errorf("tier: nvme budget %s is larger than the swap's free space (%s)",
			units.FormatBytes(o.NVMeBudgetBytes), units.FormatBytes(o.Swap.FreeBytes()))
	case o.Swap == nil && o.NVMeBudgetBytes > 0:
		return fmt.Errorf("tier: nvme budget %s without a swap", units.FormatBytes(o.NVMeBudgetBytes))
	}
	for _, d := range o.Devices {
		if d == nil {
			return fmt.Errorf("tier: nil device")
		}
		if b := d.MemStats().BudgetBytes; o.HBMBudgetBytes > b {
			return fmt.Errorf("tier: hbm budget %s is larger than device %d's memory (%s)",
				units.FormatBytes(o.HBMBudgetBytes), d.Index(), units.FormatBytes(b))
		}
	}
	return nil
}

// String prints the options, defaults applied.
func (o Options) String() string {
	o = o.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "devices=%d hbm_budget=%s host_budget=%s", len(o.Devices), units.FormatBytes(o.HBMBudgetBytes), units.FormatBytes(o.HostBudgetBytes))
	if o.Swap != nil {
		fmt.Fprintf(&b, " nvme_budget=%s nvme_align=%d", units.FormatBytes(o.NVMeBudgetBytes), o.Swap.Alignment())
	} else {
		b.WriteString(" nvme=none")
	}
	return b.String()
}
