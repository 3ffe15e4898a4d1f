//go:build linux

package pinned

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mappedBytesIn counts the bytes of [start, end) covered by /proc/self/maps.
func mappedBytesIn(t *testing.T, ranges [][2]uintptr) uintptr {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var total uintptr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(sc.Text(), "%x-%x", &lo, &hi); err != nil {
			t.Fatalf("maps line %q: %v", sc.Text(), err)
		}
		for _, r := range ranges {
			if a, b := max(lo, r[0]), min(hi, r[1]); a < b {
				total += b - a
			}
		}
	}
	return total
}

func arenaRanges(p *Pool) ([][2]uintptr, uintptr) {
	var rs [][2]uintptr
	var total uintptr
	for _, mem := range p.Arenas() {
		lo := uintptr(unsafe.Pointer(&mem[0]))
		rs = append(rs, [2]uintptr{lo, lo + uintptr(len(mem))})
		total += uintptr(len(mem))
	}
	return rs, total
}

func TestCloseUnmaps(t *testing.T) {
	for _, pop := range []PopulateMethod{PopulateAuto, PopulateTouch, PopulateMapFlag} {
		p, err := New(Options{BudgetBytes: 10 * mib, ArenaSizeBytes: 4 * mib, AlignBytes: 64 << 10, Populate: pop, Lock: LockNever})
		if err != nil {
			t.Fatal(err)
		}
		ranges, total := arenaRanges(p)
		for _, r := range ranges {
			if r[0]%hugePageBytes != 0 {
				t.Errorf("%v: arena at %#x is not 2 MiB aligned", pop, r[0])
			}
		}
		if got := mappedBytesIn(t, ranges); got != total {
			t.Fatalf("%v: %d of %d arena bytes mapped before Close", pop, got, total)
		}
		b := mustGet(t, p, mib, "x")
		b.Bytes()[0] = 1
		p.Put(b)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if got := mappedBytesIn(t, ranges); got != 0 {
			t.Fatalf("%v: %d arena bytes still mapped after Close", pop, got)
		}
	}
}

// vmLockedBytes reads VmLck from /proc/self/status.
func vmLockedBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kib int64
		if _, err := fmt.Sscanf(line, "VmLck: %d kB", &kib); err == nil {
			return kib << 10
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

func TestLockedWithCapability(t *testing.T) {
	if !hasIPCLock() {
		t.Skip("needs CAP_IPC_LOCK (root) to lock past RLIMIT_MEMLOCK; the unlocked path is TestUnlockedWithoutCapability")
	}
	before := vmLockedBytes(t)
	p, err := New(Options{BudgetBytes: 32 * mib, Lock: LockRequired})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Residency()
	if !r.Locked || !strings.HasPrefix(r.LockNote, "mlock 32.0 MiB: ok") {
		t.Fatalf("residency %+v", r)
	}
	if got := vmLockedBytes(t) - before; got != 32*mib {
		t.Fatalf("VmLck grew by %d, want %d", got, 32*mib)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := vmLockedBytes(t); got != before {
		t.Fatalf("VmLck %d after Close, want %d", got, before)
	}
}

// TestUnlockedWithoutCapability runs New on an OS thread that lacks
// CAP_IPC_LOCK (capabilities are per thread: the test drops it from this
// thread's effective set, and the thread dies with the goroutine), with
// RLIMIT_MEMLOCK below the budget: mlock must fail, the pool must say so and
// still work, and LockRequired must be refused before anything is mapped.
func TestUnlockedWithoutCapability(t *testing.T) {
	const budget = 32 * mib
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur >= budget {
		lowered := rl
		lowered.Cur = 8 * mib
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lowered); err != nil {
			t.Fatal(err)
		}
		defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl)
	}
	before := vmLockedBytes(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if hasIPCLock() {
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			var data [2]unix.CapUserData
			if err := unix.Capget(&hdr, &data[0]); err != nil {
				t.Error(err)
				return
			}
			data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
			if err := unix.Capset(&hdr, &data[0]); err != nil {
				t.Errorf("drop CAP_IPC_LOCK: %v", err)
				return
			}
		}
		if hasIPCLock() {
			t.Error("CAP_IPC_LOCK still effective")
			return
		}
		p, err := New(Options{BudgetBytes: budget})
		if err != nil {
			t.Error(err)
			return
		}
		r := p.Residency()
		want := "mlock: ENOMEM: RLIMIT_MEMLOCK 8.0 MiB < 32.0 MiB requested and no CAP_IPC_LOCK"
		if r.Locked || !strings.HasPrefix(r.LockNote, want) || !strings.HasSuffix(r.LockNote, "; running unlocked") {
			t.Errorf("residency %+v, want unlocked with note %q", r, want)
		}
		if got := vmLockedBytes(t); got != before {
			t.Errorf("VmLck %d, want %d: an arena stayed locked", got, before)
		}
		b, err := p.Get(budget, "everything")
		if err != nil {
			t.Error(err)
		} else {
			mem := b.Bytes()
			clear(mem)
			mem[len(mem)-1] = 7
			p.Put(b)
		}
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		// LockRequired past RLIMIT_MEMLOCK is refused before anything is
		// mapped (CheckHost).
		_, err = New(Options{BudgetBytes: budget, Lock: LockRequired})
		var he *HostError
		if !errors.As(err, &he) || he.LockLimitBytes != 8*mib || !strings.Contains(err.Error(), "must be locked (LockRequired)") {
			t.Errorf("LockRequired without the capability: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("unprivileged New did not return")
	}
	if got := vmLockedBytes(t); got != before {
		t.Fatalf("VmLck %d after the test, want %d", got, before)
	}
}

func TestResidencyString(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 4 * mib})
	s := p.Residency().String()
	for _, want := range []string{"mlock: off (LockNever); running unlocked", "MADV_HUGEPAGE requested, THP " + thpMode(), "populated by "} {
		if !strings.Contains(s, want) {
			t.Errorf("%q does not contain %q", s, want)
		}
	}
}

// TestHugePages: the pool's arenas, advised with MADV_HUGEPAGE, are backed
// by transparent huge pages (AnonHugePages in /proc/self/smaps), and
// Residency says how much; without the advice under THP "madvise" none are,
// and Residency says what that costs.
func TestHugePages(t *testing.T) {
	mode := thpMode()
	if mode == "never" || mode == "unavailable" {
		t.Skipf("THP is %q on this machine: no huge pages to check (Residency then says so)", mode)
	}
	p := newPool(t, Options{BudgetBytes: 16 * mib})
	r := p.Residency()
	if r.MappedBytes != 16*mib || r.HugePageBytes < 2*mib {
		t.Fatalf("huge pages %d of %d mapped, want at least one 2 MiB page (THP %s): %s", r.HugePageBytes, r.MappedBytes, mode, r)
	}
	if !strings.Contains(r.String(), "on huge pages") {
		t.Errorf("%q does not say how much is on huge pages", r)
	}
	if mode != "madvise" {
		return // under "always" memory without the advice gets huge pages too
	}
	q := newPool(t, Options{BudgetBytes: 16 * mib, NoHugePages: true})
	if r := q.Residency(); r.HugePageBytes != 0 || !strings.Contains(r.String(), "no huge pages") {
		t.Fatalf("without MADV_HUGEPAGE under THP madvise: %d huge page bytes, %q", r.HugePageBytes, r)
	}
}
