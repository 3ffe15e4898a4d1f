// Package leaktest checks that a test leaves no goroutines and no open file
// descriptors behind. It imports only the standard library, so any package's
// tests may use it.
//
// Use: call Check(t) first in a test (or subtest), before anything that
// starts goroutines or opens files. Check snapshots the goroutines and the
// descriptors of the process and registers a cleanup; cleanups run last
// registered first, so the test's own cleanups (Close of engines, pools,
// files) run before the comparison. Goroutines get a grace period to exit.
//
// What counts as a leak: a goroutine that did not exist at Check and still
// runs (other tests' goroutines and the runtime's are ignored), and a
// descriptor that was not open at Check, or now names another file. The
// failure lists each leaked goroutine's stack and each descriptor's target.
//
// Tests that use it must not run in parallel with tests that start
// goroutines or open files (t.Parallel): their work would count as leaks.
package leaktest

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Grace is how long Check waits for goroutines to exit and descriptors to
// close before it reports them.
var Grace = 3 * time.Second

// Check fails t if goroutines or file descriptors created after this call
// are still there once t and its later cleanups have finished.
func Check(t testing.TB) {
	t.Helper()
	g0 := goroutines()
	fd0, err := FDs()
	if err != nil {
		t.Fatalf("leaktest: %v", err)
	}
	t.Cleanup(func() {
		var leakedG []goroutine
		var leakedFD []string
		deadline := time.Now().Add(Grace)
		for {
			leakedG = newGoroutines(g0, goroutines())
			fd, err := FDs()
			if err != nil {
				t.Errorf("leaktest: %v", err)
				return
			}
			leakedFD = newFDs(fd0, fd)
			if len(leakedG) == 0 && len(leakedFD) == 0 {
				return
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "leaktest: %d goroutines and %d file descriptors outlived the test", len(leakedG), len(leakedFD))
		for _, fd := range leakedFD {
			fmt.Fprintf(&b, "\nfd %s", fd)
		}
		for _, g := range leakedG {
			fmt.Fprintf(&b, "\n\n%s", g.stack)
		}
		t.Error(b.String())
	})
}

// FDs lists the open descriptors of the process as "N -> target" (the
// target as /proc/self/fd shows it), sorted by number. Without /proc (not
// Linux) it returns none, so only goroutines are checked there.
func FDs() ([]string, error) {
	d, err := os.Open("/proc/self/fd")
	if os.IsNotExist(err) {
		return nil, nil // no procfs (not Linux): descriptors are not checked
	}
	if err != nil {
		return nil, fmt.Errorf("list file descriptors: %w", err)
	}
	names, err := d.Readdirnames(-1)
	self := int(d.Fd())
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("list file descriptors: %w", err)
	}
	var out []string
	nums := make([]int, 0, len(names))
	for _, n := range names {
		i, err := strconv.Atoi(n)
		if err != nil || i == self {
			continue
		}
		nums = append(nums, i)
	}
	slices.Sort(nums)
	for _, i := range nums {
		target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(i))
		if err != nil {
			continue // closed meanwhile
		}
		out = append(out, strconv.Itoa(i)+" -> "+target)
	}
	return out, nil
}

// CountFDs is the number of open descriptors of the process.
func CountFDs() (int, error) {
	fds, err := FDs()
	return len(fds), err
}

func newFDs(before, after []string) []string {
	var out []string
	for _, fd := range after {
		if !slices.Contains(before, fd) {
			out = append(out, fd)
		}
	}
	return out
}

type goroutine struct {
	id    uint64
	stack string
}

// goroutines parses runtime.Stack of all goroutines, leaving out the
// caller's and those that are not the test's business.
func goroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for i, block := range bytes.Split(buf, []byte("\n\n")) {
		s := string(block)
		if i == 0 || !strings.HasPrefix(s, "goroutine ") || ignored(s) {
			continue // the first is the caller's own
		}
		f := strings.Fields(s)
		if len(f) < 2 {
			continue
		}
		id, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, goroutine{id, s})
	}
	return out
}

// ignored says whether a stack belongs to another test or to the runtime and
// standard library's long-lived helpers, which start on first use.
func ignored(stack string) bool {
	for _, line := range strings.Split(stack, "\n") {
		if strings.HasPrefix(line, "created by ") {
			break
		}
		for _, f := range []string{"testing.tRunner(", "testing.(*T).Run(", "testing.runTests(", "testing.(*M).",
			"os/signal.signal_recv(", "os/signal.loop(", "runtime.ensureSigM"} {
			if strings.HasPrefix(line, f) {
				return true
			}
		}
	}
	return false
}

func newGoroutines(before, after []goroutine) []goroutine {
	var out []goroutine
	for _, g := range after {
		if !slices.ContainsFunc(before, func(b goroutine) bool { return b.id == g.id }) {
			out = append(out, g)
		}
	}
	return out
}
