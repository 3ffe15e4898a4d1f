// Package nvmetest gives tests a directory on a filesystem that does direct I/O.
//
// The directory is for swap files and the NVMe engine; it skips tests only
// when no candidate directory does: a skip names each directory tried and
// why it failed, and a probe error that is not a refused O_DIRECT fails the
// test (an alignment bug must not pass for a missing feature). Imported by
// test files only.
package nvmetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/strata-ai/strata/nvme"
)

// Candidates are the directories Dir tries, in order: "" is the test's own
// temporary directory (under $TMPDIR, often tmpfs), then /var/tmp (a disk
// on most systems).
var Candidates = []string{"", "/var/tmp"}

// probe is the outcome of probing Candidates, once per process.
var probe struct {
	sync.Mutex
	done    bool
	base    string // the first candidate that does direct I/O
	skipped string // why every candidate failed; "" when one works
}

// Dir returns a new empty directory, removed after the test, on the first
// candidate filesystem that does direct I/O; it skips the test when none
// does.
func Dir(t testing.TB) string {
	t.Helper()
	base := Require(t)
	if base == "" {
		return t.TempDir()
	}
	d, err := os.MkdirTemp(base, "strata-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Require skips the test unless a candidate directory does direct I/O, and
// returns that candidate.
func Require(t testing.TB) string {
	t.Helper()
	p := &probe
	p.Lock()
	defer p.Unlock()
	if !p.done {
		var why []string
		found := false
		for _, base := range Candidates {
			dir := base
			if dir == "" {
				dir = t.TempDir()
			}
			err := nvme.ProbeDirectIO(dir)
			if err == nil {
				p.base, found = base, true
				break
			}
			if !errors.Is(err, nvme.ErrNoDirectIO) && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("probing O_DIRECT in %s: %v", dir, err)
			}
			why = append(why, fmt.Sprintf("%s: %v", dir, err))
		}
		p.done = true
		if !found {
			p.skipped = strings.Join(why, "; ")
		}
	}
	if p.skipped != "" {
		t.Skipf("no directory here does direct I/O: %s", p.skipped)
	}
	return p.base
}
