//go:build linux

package cmd

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-ai/strata/config"
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

// TestBenchNVMeSweepConfig: the aio block --sweep recommends is one strata
// train takes whole (no key of it "accepted but not used"), each cell is
// the median of sweepRuns runs, and latencies read in µs or ms.
func TestBenchNVMeSweepConfig(t *testing.T) {
	d := nvmetest.Dir(t)
	out, stderr, err := runApp(t, "bench", "nvme", "--path", d, "--sweep", "--sweep-bs", "64K", "--sweep-qd", "2,4", "--size", "4M", "--rw", "read")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(out, fmt.Sprintf("each the median of %d runs", sweepRuns)) {
		t.Errorf("the sweep does not say its cells are medians:\n%s", out)
	}
	i := strings.Index(out, "{")
	if i < 0 {
		t.Fatalf("no aio block:\n%s", out)
	}
	block := strings.TrimSpace(out[i:])
	doc := `{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, ` + block[1:]
	cfg, err := config.Parse([]byte(doc), "sweep", config.Options{})
	if err != nil {
		t.Fatalf("the recommended block: %v\n%s", err, out[i:])
	}
	if ig := cfg.Ignored(); len(ig) > 0 {
		t.Errorf("train would say of the recommended block: %q", ig)
	}
	for _, c := range []struct {
		us   float64
		want string
	}{{85, "85 µs"}, {999.4, "999 µs"}, {1500, "1.50 ms"}, {23456, "23.46 ms"}} {
		if got := latency(c.us); got != c.want {
			t.Errorf("latency(%v) = %q, want %q", c.us, got, c.want)
		}
	}
}
