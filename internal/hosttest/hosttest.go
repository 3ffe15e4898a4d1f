// Package hosttest holds what tests of several packages ask of the host:
// a process's resident memory from /proc, the Python interpreter with
// Debian's python3-torch that the PyTorch comparisons run, and a small
// loop-mounted ext4 path for the full-disk tests. Test files only.
package hosttest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TorchPython is the interpreter with Debian's python3-torch and
// python3-numpy (.ci/run installs both).
const TorchPython = "/usr/bin/python3"

// RequireTorch fails the test when TorchPython or torch is missing, saying
// how to install them; only STRATA_SKIP_TORCH=1, set on purpose, turns
// that into a skip, so a failed install cannot pass for a green run.
func RequireTorch(t testing.TB) {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("STRATA_SKIP_TORCH") == "1" {
			t.Skipf(format, args...)
		}
		t.Fatalf(format+" (set STRATA_SKIP_TORCH=1 to skip the PyTorch comparisons)", args...)
	}
	if _, err := os.Stat(TorchPython); err != nil {
		missing("%s: %v (apt-get install python3-torch python3-numpy)", TorchPython, err)
		return
	}
	if out, err := exec.Command(TorchPython, "-c", "import torch, numpy").CombinedOutput(); err != nil {
		missing("%s cannot import torch and numpy (apt-get install python3-torch python3-numpy): %v: %s", TorchPython, err, out)
	}
}

// ProcRSS is the resident set size of process pid and its peak, in bytes
// (VmRSS and VmHWM of /proc/pid/status), 0 when they cannot be read.
func ProcRSS(pid int) (rss, hwm int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0
	}
	kib := func(v string) int64 {
		n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		return n << 10
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rss = kib(v)
		}
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm = kib(v)
		}
	}
	return rss, hwm
}

// SmallExt4 mounts an ext4 filesystem of size bytes (an image under the
// test's temporary directory, loop-mounted, no journal) and returns its
// mount point, unmounted when the test ends. It skips the test, naming
// the step, where the host cannot make one (not root, no loop device).
func SmallExt4(t testing.TB, size string) string {
	t.Helper()
	tmp := t.TempDir()
	img, dir := tmp+"/small.img", tmp+"/mnt"
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"truncate", "-s", size, img}, {"mkfs.ext4", "-q", "-F", "-O", "^has_journal", img}, {"mount", "-o", "loop", img, dir}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Skipf("cannot make a %s ext4 path (%s, needs root and a loop device): %v %s", size, strings.Join(c, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}
