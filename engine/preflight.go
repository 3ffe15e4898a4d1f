package engine

import (
	"fmt"

	"github.com/strata-ai/strata/estimate"
	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/nvme"
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
// tier store's pool and the upload staging pinned beside it
// (tier.CheckHostMemory).
func (e *Engine) checkHostMemory(sizes tier.Sizes) error {
	sizes.HostBudgetBytes = e.hostBudget()
	if err := tier.CheckHostMemory(sizes, e.stagingPoolBytes(), e.opts.PinnedLock, meminfoPath); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
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
	e.notes = append(e.notes, nvme.ReclaimStaleSwapFiles(t.nvmePaths)...)
	size, stripe := t.swapSize(nv)
	if err := nvme.CheckSwapSpace(t.nvmePaths, size, stripe); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}
