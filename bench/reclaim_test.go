package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/flock"
)

// TestReclaimStepDirs: what a killed bench run left under --nvme-path
// goes (its swap file, then its directory once empty and old), while a
// live run's directory (its swap file locked) and a young empty one (a
// run between MkdirTemp and its engine) stay; the notes say what went.
func TestReclaimStepDirs(t *testing.T) {
	parent := t.TempDir()
	mk := func(name string, age time.Duration, file string, lock bool) string {
		d := filepath.Join(parent, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if file != "" {
			p := filepath.Join(d, file)
			if err := os.WriteFile(p, make([]byte, 1<<16), 0o600); err != nil {
				t.Fatal(err)
			}
			if lock {
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				if err := flock.TryLock(int(f.Fd())); err != nil {
					t.Fatal(err)
				}
			}
		}
		old := time.Now().Add(-age)
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
		return d
	}
	killed := mk(stepDirPrefix+"killed", time.Hour, "strata-999999-0123456789ab.swap", false)
	liveFile := fmt.Sprintf("strata-%d-0123456789ab.swap", os.Getpid()) // a live run's pid: its lock is not waited for
	live := mk(stepDirPrefix+"live", time.Hour, liveFile, true)
	young := mk(stepDirPrefix+"young", time.Minute, "", false)
	other := mk("not-a-bench-dir", time.Hour, "strata-999997-0123456789ab.swap", false)
	notes := reclaimStepDirs(parent, time.Now())
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	if exists(killed) {
		t.Errorf("the killed run's directory %s stayed", killed)
	}
	if !exists(filepath.Join(live, liveFile)) {
		t.Error("the live run's swap file was removed")
	}
	if !exists(young) || !exists(filepath.Join(other, "strata-999997-0123456789ab.swap")) {
		t.Error("a young empty directory or another directory's file was removed")
	}
	all := strings.Join(notes, "\n")
	if !strings.Contains(all, "removed 1 stale swap files") || !strings.Contains(all, killed) || strings.Contains(all, live+"\n") {
		t.Errorf("notes:\n%s", all)
	}
}

// TestRemoveDeadBenchFiles: a temporary file of a killed bench nvme run
// (its pid gone) goes, one of a live process (this one) and files of
// other names stay; the note says how many and how much.
func TestRemoveDeadBenchFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dead := write(benchFilePrefix + "999999999-0badf00d.dat") // past pid_max: no such process
	alive := write(fmt.Sprintf("%s%d-0badf00d.dat", benchFilePrefix, os.Getpid()))
	other := write("strata-bench-nvme-notes.txt")
	notes := removeDeadBenchFiles(dir)
	if _, err := os.Stat(dead); err == nil {
		t.Error("the killed run's file stayed")
	}
	for _, p := range []string{alive, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed", p)
		}
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "removed 1 temporary files of killed bench runs, reclaimed 4.0 KiB") {
		t.Errorf("notes %q", notes)
	}
	if n := removeDeadBenchFiles(dir); n != nil {
		t.Errorf("a second pass: %q", n)
	}
}
