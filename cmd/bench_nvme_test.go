//go:build linux

package cmd

import (
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestBenchNVMeSignal: `strata bench nvme` on a directory, stopped by
// SIGINT or SIGTERM in the middle of its workload (another process: this
// test binary run as strata, startChild), removes its temporary file, says
// so and exits with 128 + the signal's number.
func TestBenchNVMeSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		d := nvmetest.Dir(t)
		c := startChild(t, "", "", strings.Fields("bench nvme --path "+d+" --rw write --bs 64K --qd 4 --size 64M --duration 10m")...)
		go io.Copy(io.Discard, c.stdout)
		// Progress on stderr means the workload is running.
		c.waitStderr(t, "MB/s")
		left, _ := filepath.Glob(filepath.Join(d, "strata-bench-nvme-*.dat"))
		if len(left) != 1 {
			t.Fatalf("%v: running, but temporary files %v", sig, left)
		}
		if err := c.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		c.cmd.Wait()
		if code := c.cmd.ProcessState.ExitCode(); code != 128+int(sig) {
			t.Errorf("%v: exit status %d, want %d\n%s", sig, code, 128+int(sig), c.stderr.String())
		}
		if !strings.Contains(c.stderr.String(), "stopped by "+sig.String()) || !strings.Contains(c.stderr.String(), "temporary files removed") {
			t.Errorf("%v: stderr does not say it stopped and cleaned up:\n%s", sig, c.stderr.String())
		}
		if left, _ := filepath.Glob(filepath.Join(d, "*")); len(left) != 0 {
			t.Errorf("%v: left %v", sig, left)
		}
	}
}
