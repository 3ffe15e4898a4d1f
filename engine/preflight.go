package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
	"github.com/strata-ai/strata/tier"
)

// meminfoPath is where the start-up check reads MemAvailable (tests point
// it at a file of their own).
var meminfoPath = hostmem.MeminfoPath

// preflight runs before New allocates anything (device memory, pinned
// pools, swap files): what the host cannot give is refused here, with the
// key to change, rather than by the OOM killer or ENOSPC in the middle of
// the run. It checks strata.host_budget against the host's memory
// (checkHostBudget), and on each nvme_path removes the swap files of killed
// runs and checks the room the swap needs (checkSwapSpace).
func (e *Engine) preflight(mo estimate.Options) error {
	if !e.offload && !e.act.Offload {
		return nil // no tier store: nothing pinned, no swap
	}
	t, sizes, err := planTiers(e, mo)
	if err != nil {
		return err
	}
	if err := e.checkHostMemory(sizes); err != nil {
		return err
	}
	return e.checkSwapSpace(t)
}

// checkHostMemory refuses pinned host memory the host cannot give: the
// tier store's pool and the upload staging pinned beside it, above
// MemAvailable, or, with Options.PinnedLock LockRequired and no
// CAP_IPC_LOCK, above RLIMIT_MEMLOCK (pinned.CheckHost), or past what
// RLIMIT_AS leaves the process (hostmem.CheckAddressSpace: the pool is
// mapped whole at the start). With
// strata.host_budget the pool is the budget and the error names the key;
// without, the pool is what the layout homes in host RAM (tier.PlanBudgets;
// where that cannot be planned yet New's own call says why).
func (e *Engine) checkHostMemory(sizes tier.Sizes) error {
	hb := e.hostBudget()
	pool := hb
	if hb <= 0 {
		sizes.HBMFreeBytes = 1 << 60 // the host's part does not depend on it
		b, err := tier.PlanBudgets(sizes)
		if err != nil {
			return nil
		}
		pool = b.PoolBytes
	}
	staging := e.stagingPoolBytes()
	total, fits := units.Add(pool, staging)
	if !fits {
		return fmt.Errorf("engine: pinned host memory %s and %s of upload staging: more than 2^63 bytes", units.FormatBytes(pool), units.FormatBytes(staging))
	}
	what := fmt.Sprintf("strata.host_budget %s (pinned host memory, and %s of upload staging)", units.FormatBytes(hb), units.FormatBytes(staging))
	if hb <= 0 {
		what = fmt.Sprintf("the tier store's pinned host memory, %s (the state homed in host RAM, all ranks, with its staging and spare room), and %s of upload staging,",
			units.FormatBytes(pool), units.FormatBytes(staging))
	}
	err := pinned.CheckHost(total, e.opts.PinnedLock, meminfoPath)
	var he *pinned.HostError
	if err == nil {
		if err := hostmem.CheckAddressSpace(strings.TrimSuffix(what, ","), total); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
		return nil
	}
	if !errors.As(err, &he) {
		return err
	}
	if he.LockLimitBytes >= 0 {
		fix := fmt.Sprintf("lower strata.host_budget to at most %s", units.FormatBytes(max(he.LockLimitBytes-staging, 0)))
		if hb <= 0 {
			fix = "put the optimizer state on NVMe (offload_optimizer nvme) with a strata.host_budget below the limit"
		}
		return fmt.Errorf("engine: %s must be locked (PinnedLock LockRequired), but RLIMIT_MEMLOCK is %s and the process has no CAP_IPC_LOCK: raise the limit (`ulimit -l`, LimitMEMLOCK= or /etc/security/limits.conf), grant CAP_IPC_LOCK, or %s",
			what, units.FormatBytes(he.LockLimitBytes), fix)
	}
	room := units.FormatBytes(max(he.AvailableBytes-staging, 0))
	fix := "lower strata.host_budget to at most " + room
	if hb <= 0 {
		fix = "put the optimizer state on NVMe (offload_optimizer nvme) with strata.host_budget at most " + room
	}
	return fmt.Errorf("engine: %s is more than the host's available memory, %s (MemAvailable in %s): the run would be killed for memory; %s, or free memory",
		what, units.FormatBytes(he.AvailableBytes), he.Meminfo, fix)
}

// checkSwapSpace, for a run with NVMe homes (t: the store's layout),
// removes the swap files of killed runs on each nvme_path (no live process
// holds their flock; a note says what each path got back) and checks that
// each path has the room the run's swap takes there (nvme.CheckSwapSpace:
// the error names the path, the need, the free space and what is
// reclaimable).
func (e *Engine) checkSwapSpace(t *tiers) error {
	var nv int64
	for st := range shard.StateCount {
		nv += t.homes[st][shard.NVMe]
	}
	if nv == 0 {
		return nil
	}
	notes := len(e.notes)
	err := t.resolveNVMePaths()
	e.notes = e.notes[:notes] // openSwap resolves them again, with its notes
	if err != nil {
		return err
	}
	for _, p := range t.nvmePaths {
		removed, err := nvme.RemoveStaleSwapFiles(p)
		if len(removed) > 0 {
			var b int64
			for _, f := range removed {
				b += f.SizeBytes
			}
			e.notes = append(e.notes, fmt.Sprintf("nvme_path %s: removed %d stale swap files of killed runs (no live process held their lock), reclaimed %s (%d bytes)",
				p, len(removed), units.FormatBytes(b), b))
		}
		if err != nil {
			e.notes = append(e.notes, fmt.Sprintf("nvme_path %s: stale swap files left: %v", p, err))
		}
	}
	size, stripe := t.swapSize(nv)
	if err := nvme.CheckSwapSpace(t.nvmePaths, size, stripe); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}
