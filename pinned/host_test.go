package pinned

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeMeminfo writes a meminfo file with MemAvailable of availMiB.
func writeMeminfo(t *testing.T, availKiB string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(p, []byte("MemTotal:       25165824 kB\nMemFree:            1000 kB\nMemAvailable:   "+availKiB+" kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckHost: a budget above MemAvailable is refused, naming both and
// the meminfo file; one that fits passes; an unreadable meminfo checks
// nothing. RLIMIT_MEMLOCK refuses only a pool that must be locked
// (LockRequired) in a process without CAP_IPC_LOCK: with LockIfAllowed
// the pool runs unlocked and says so (Residency), with the capability the
// limit does not apply.
func TestCheckHost(t *testing.T) {
	meminfo := writeMeminfo(t, "8388608") // 8 GiB
	if err := checkHost(8<<30, LockIfAllowed, meminfo, true, 0, false); err != nil {
		t.Errorf("8 GiB of 8 GiB: %v", err)
	}
	err := checkHost(30<<30, LockIfAllowed, meminfo, true, 0, false)
	var he *HostError
	want := "pinned: 30.00 GiB is more than the host's available memory, 8.00 GiB (MemAvailable in " + meminfo + ")"
	if !errors.As(err, &he) || he.AvailableBytes != 8<<30 || he.BudgetBytes != 30<<30 || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("30 GiB of 8 GiB: got %v\nwant %s...", err, want)
	}
	if err := checkHost(30<<30, LockIfAllowed, filepath.Join(t.TempDir(), "none"), true, 0, false); err != nil {
		t.Errorf("no meminfo: nothing to check, got %v", err)
	}
	const lim = 8 << 20
	for _, c := range []struct {
		lock    LockMode
		capLock bool
		refused bool
	}{
		{LockRequired, false, true},
		{LockRequired, true, false},
		{LockIfAllowed, false, false},
		{LockNever, false, false},
	} {
		err := checkHost(32<<20, c.lock, meminfo, c.capLock, lim, true)
		if got := err != nil; got != c.refused {
			t.Errorf("%s, CAP_IPC_LOCK %t, 32 MiB over RLIMIT_MEMLOCK 8 MiB: got %v, want refused %t", c.lock, c.capLock, err, c.refused)
		}
		if err != nil && (!errors.As(err, &he) || he.LockLimitBytes != lim || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK is 8.0 MiB and the process has no CAP_IPC_LOCK")) {
			t.Errorf("lock refusal: %v", err)
		}
	}
	if err := checkHost(32<<20, LockRequired, meminfo, false, 0, false); err != nil {
		t.Errorf("unlimited RLIMIT_MEMLOCK: %v", err)
	}
}

// TestNewRefusesPastMemAvailable: New checks before it maps: a budget above
// MemAvailable is a *HostError and nothing is mapped (the budget here is
// 1 TiB, which would fail or be killed if it were mapped and populated).
func TestNewRefusesPastMemAvailable(t *testing.T) {
	old := meminfoPath
	meminfoPath = writeMeminfo(t, "1048576") // 1 GiB
	defer func() { meminfoPath = old }()
	p, err := New(Options{BudgetBytes: 1 << 40, Lock: LockNever})
	var he *HostError
	if !errors.As(err, &he) || he.AvailableBytes != 1<<30 {
		if p != nil {
			p.Close()
		}
		t.Fatalf("1 TiB on a host with 1 GiB available: %v, want a *HostError", err)
	}
	p, err = New(Options{BudgetBytes: 4 << 20, Lock: LockNever})
	if err != nil {
		t.Fatalf("4 MiB of 1 GiB: %v", err)
	}
	p.Close()
}
