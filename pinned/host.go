package pinned

import (
	"fmt"

	"github.com/strata-ai/strata/internal/hostmem"
	"github.com/strata-ai/strata/internal/units"
)

// HostError says the host cannot give a pool its budget, found before
// anything is mapped (CheckHost, New): the budget is above MemAvailable
// (mapping and faulting it in would end the process in the OOM killer,
// with no message), or the pool must be locked (LockRequired), the process
// has no CAP_IPC_LOCK and the budget is above RLIMIT_MEMLOCK.
type HostError struct {
	BudgetBytes int64
	// AvailableBytes is MemAvailable, read from Meminfo; set when that is
	// the limit.
	AvailableBytes int64
	Meminfo        string
	// LockLimitBytes is RLIMIT_MEMLOCK; set (≥ 0) when that is the limit.
	LockLimitBytes int64
}

func (e *HostError) Error() string {
	if e.LockLimitBytes >= 0 {
		return fmt.Sprintf("pinned: %s must be locked (LockRequired), but RLIMIT_MEMLOCK is %s and the process has no CAP_IPC_LOCK: "+
			"raise the limit (`ulimit -l`, LimitMEMLOCK= or /etc/security/limits.conf), grant CAP_IPC_LOCK, lower the budget, or let the pool run unlocked",
			units.FormatBytes(e.BudgetBytes), units.FormatBytes(e.LockLimitBytes))
	}
	return fmt.Sprintf("pinned: %s is more than the host's available memory, %s (MemAvailable in %s): "+
		"mapping and faulting it in would end the process in the OOM killer; lower the budget or free memory",
		units.FormatBytes(e.BudgetBytes), units.FormatBytes(e.AvailableBytes), e.Meminfo)
}

// CheckHost says, before anything is mapped, whether this host can give a
// pool of budgetBytes with lock (New calls it first): the budget must fit
// in MemAvailable (read from meminfo; "" is /proc/meminfo; where it cannot
// be read nothing is checked) and, where a lock is required (LockRequired)
// and the process has no CAP_IPC_LOCK, in RLIMIT_MEMLOCK. With
// LockIfAllowed a budget above RLIMIT_MEMLOCK is no error: the pool runs
// unlocked and Residency says so. The error is a *HostError.
func CheckHost(budgetBytes int64, lock LockMode, meminfo string) error {
	limit, limited := lockLimit()
	return checkHost(budgetBytes, lock, meminfo, hasIPCLock(), limit, limited)
}

func checkHost(budgetBytes int64, lock LockMode, meminfo string, capLock bool, lockLimitBytes int64, limited bool) error {
	if meminfo == "" {
		meminfo = hostmem.MeminfoPath
	}
	if avail, ok := hostmem.Available(meminfo); ok && budgetBytes > avail {
		return &HostError{BudgetBytes: budgetBytes, AvailableBytes: avail, Meminfo: meminfo, LockLimitBytes: -1}
	}
	if lock == LockRequired && !capLock && limited && budgetBytes > lockLimitBytes {
		return &HostError{BudgetBytes: budgetBytes, LockLimitBytes: lockLimitBytes}
	}
	return nil
}
