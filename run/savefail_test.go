package run

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// mountOrSkip mounts a filesystem (mount ARGS target) for the test, or
// skips it where mounting is not allowed.
func mountOrSkip(t *testing.T, target string, args ...string) {
	t.Helper()
	if out, err := exec.Command("mount", append(args, target)...).CombinedOutput(); err != nil {
		t.Skipf("cannot mount here (needs root with CAP_SYS_ADMIN): mount %s %s: %v: %s", strings.Join(args, " "), target, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", target).Run() })
}

// TestStepsLineOnFullDisk: steps.jsonl on a filesystem that fills up: the
// lines the disk refuses are cut back off (the file holds whole lines
// only), warned about once and counted, and the run goes on.
func TestStepsLineOnFullDisk(t *testing.T) {
	dir := t.TempDir()
	mountOrSkip(t, dir, "-t", "tmpfs", "-o", "size=8k", "tmpfs")
	f, err := os.Create(filepath.Join(dir, "steps.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stderr strings.Builder
	l := &trainLoop{o: &Options{}, jsonl: f, stderr: &stderr}
	const n = 200
	for step := int64(1); step <= n; step++ {
		line := fmt.Sprintf(`{"step":%d,"pad":%q}`+"\n", step, strings.Repeat("x", 90))
		if err := l.appendLine(step, []byte(line)); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
	b, _ := os.ReadFile(f.Name())
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i, line := range lines {
		if !json.Valid([]byte(line)) {
			t.Fatalf("line %d is torn: %q", i+1, line)
		}
	}
	if l.fails.lines == 0 || len(lines)+l.fails.lines != n {
		t.Errorf("%d lines written and %d counted as refused, want %d in all with some refused", len(lines), l.fails.lines, n)
	}
	if c := strings.Count(stderr.String(), "warning: steps.jsonl"); c != 1 || !strings.Contains(stderr.String(), "no space left on device") {
		t.Errorf("want one warning naming the cause, got:\n%s", stderr.String())
	}
	var sum strings.Builder
	l.fails.report(&sum)
	if !strings.Contains(sum.String(), fmt.Sprintf("%d lines of steps.jsonl were not written", l.fails.lines)) {
		t.Errorf("the summary does not count them: %q", sum.String())
	}
}
