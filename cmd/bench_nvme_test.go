//go:build linux

package cmd

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/nvme/nvmetest"
)

// TestBenchNVMeSignalChild is the child of TestBenchNVMeSignal: it runs
// the CLI with the arguments in STRATA_BENCH_NVME_ARGS and exits with its
// status.
func TestBenchNVMeSignalChild(t *testing.T) {
	args := os.Getenv("STRATA_BENCH_NVME_ARGS")
	if args == "" {
		t.Skip("the child of TestBenchNVMeSignal; runs only when it starts this binary")
	}
	os.Exit(Main(append([]string{"strata"}, strings.Fields(args)...)))
}

// TestBenchNVMeSignal: `strata bench nvme` on a directory, stopped by
// SIGINT or SIGTERM in the middle of its workload (another process, this
// test binary started again), removes its temporary file, says so and
// exits with 128 + the signal's number.
func TestBenchNVMeSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		d := nvmetest.Dir(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestBenchNVMeSignalChild$")
		cmd.Env = append(os.Environ(), "STRATA_BENCH_NVME_ARGS=bench nvme --path "+d+
			" --rw write --bs 64K --qd 4 --size 64M --duration 10m")
		var stderr lockedBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Progress on stderr means the workload is running.
		for !strings.Contains(stderr.String(), "MB/s") {
			select {
			case err := <-exited:
				t.Fatalf("%v: the child ended before its workload ran: %v\n%s", sig, err, stderr.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
		left, _ := filepath.Glob(filepath.Join(d, "strata-bench-nvme-*.dat"))
		if len(left) != 1 {
			t.Fatalf("%v: running, but temporary files %v", sig, left)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		err := <-exited
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
			t.Errorf("%v: %v, want exit status %d\n%s", sig, err, 128+int(sig), stderr.String())
		}
		if !strings.Contains(stderr.String(), "stopped by "+sig.String()) || !strings.Contains(stderr.String(), "temporary files removed") {
			t.Errorf("%v: stderr does not say it stopped and cleaned up:\n%s", sig, stderr.String())
		}
		if left, _ := filepath.Glob(filepath.Join(d, "*")); len(left) != 0 {
			t.Errorf("%v: left %v", sig, left)
		}
	}
}

// lockedBuffer is a bytes.Buffer that a child's stderr copier and the
// test use at once.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
