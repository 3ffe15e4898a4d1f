package engine

import (
	"errors"
	"fmt"

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
	if err := e.checkHostBudget(); err != nil {
		return err
	}
	return e.checkSwapSpace(mo)
}

// checkHostBudget refuses a strata.host_budget that, with the upload
// staging pinned beside it, is more than MemAvailable, or, with
// Options.PinnedLock LockRequired and no CAP_IPC_LOCK, more than
// RLIMIT_MEMLOCK (pinned.CheckHost). Without a host budget the pools'
// sizes follow from the model; pinned.New checks them as it makes them.
func (e *Engine) checkHostBudget() error {
	hb := e.cfg.Strata.HostBudgetBytes
	if hb <= 0 {
		return nil
	}
	staging := e.stagingPoolBytes()
	total, fits := units.Add(hb, staging)
	if !fits {
		return fmt.Errorf("engine: strata.host_budget %s: more than 2^63 bytes with the upload staging", units.FormatBytes(hb))
	}
	err := pinned.CheckHost(total, e.opts.PinnedLock, meminfoPath)
	var he *pinned.HostError
	if !errors.As(err, &he) {
		return err
	}
	if he.LockLimitBytes >= 0 {
		return fmt.Errorf("engine: strata.host_budget %s (and %s of upload staging) must be locked (PinnedLock LockRequired), but RLIMIT_MEMLOCK is %s and the process has no CAP_IPC_LOCK: raise the limit (`ulimit -l`, LimitMEMLOCK= or /etc/security/limits.conf), grant CAP_IPC_LOCK, or lower strata.host_budget to at most %s",
			units.FormatBytes(hb), units.FormatBytes(staging), units.FormatBytes(he.LockLimitBytes), units.FormatBytes(max(he.LockLimitBytes-staging, 0)))
	}
	return fmt.Errorf("engine: strata.host_budget %s (pinned host memory, and %s of upload staging) is more than the host's available memory, %s (MemAvailable in %s): the run would be killed for memory; lower strata.host_budget to at most %s, or free memory",
		units.FormatBytes(hb), units.FormatBytes(staging), units.FormatBytes(he.AvailableBytes), he.Meminfo, units.FormatBytes(max(he.AvailableBytes-staging, 0)))
}

// checkSwapSpace, for a run with NVMe homes, removes the swap files of
// killed runs on each nvme_path (no live process holds their flock; a
// note says what each path got back) and checks that each path has the
// room the run's swap takes there (nvme.CheckSwapSpace: the error names
// the path, the need, the free space and what is reclaimable).
func (e *Engine) checkSwapSpace(mo estimate.Options) error {
	est, err := estimate.Memory(mo)
	if err != nil {
		return err
	}
	t := &tiers{e: e, paramTier: mo.ParamTier, optTier: mo.OptimizerTier, specs: map[shard.Key]tier.Spec{}}
	t.layOut(est)
	var nv int64
	for st := range shard.StateCount {
		nv += t.homes[st][shard.NVMe]
	}
	if nv == 0 {
		return nil
	}
	notes := len(e.notes)
	err = t.resolveNVMePaths()
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
