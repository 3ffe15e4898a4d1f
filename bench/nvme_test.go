//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/leaktest"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"golang.org/x/sys/unix"
)

func TestRunNVMeAllModes(t *testing.T) {
	leaktest.Check(t)
	dirs := []string{nvmetest.Dir(t), nvmetest.Dir(t)}
	for _, engine := range []string{nvme.EngineUring, nvme.EnginePread} {
		for _, rw := range nvmeRWs {
			o := NVMeOptions{Paths: dirs, RW: rw, BlockBytes: 64 << 10, QueueDepth: 4, SizeBytes: 4 << 20, Engine: engine, Loops: 2}.WithDefaults()
			r, err := RunNVMe(context.Background(), o)
			if engine == nvme.EngineUring && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS)) {
				t.Logf("io_uring unavailable here, uring runs skipped: %v", err)
				continue
			}
			if err != nil {
				t.Fatalf("%s %s: %v", engine, rw, err)
			}
			want := int64(2 * 2 * 4 << 20) // loops × paths × size
			if r.Bytes != want || r.Engine != engine || r.MBps <= 0 || r.IOPS <= 0 || r.P50us <= 0 || r.P999us < r.P50us {
				t.Fatalf("%s %s: %+v (want %d bytes)", engine, rw, r, want)
			}
			if rw == "mixed" && (r.ReadMBps <= 0 || r.WriteMBps <= 0) {
				t.Fatalf("mixed without both directions: %+v", r)
			}
		}
	}
	for _, d := range dirs {
		noLeftovers(t, d)
	}
}

func TestRunNVMeBadInput(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	cases := []struct {
		o    NVMeOptions
		want string
	}{
		{NVMeOptions{Paths: []string{"/does/not/exist/f"}, SizeBytes: 1 << 20}, "does not exist"},
		{NVMeOptions{Paths: []string{d}, BlockBytes: 1000, SizeBytes: 1000 * 1024}, "not a multiple of the I/O alignment"},
		{NVMeOptions{Paths: []string{d}, SizeBytes: 1 << 50}, "free"},
		{NVMeOptions{Paths: []string{d}, RW: "readwrite"}, "--rw"},
		{NVMeOptions{Paths: []string{d}, BlockBytes: 1 << 20, SizeBytes: 3 << 19}, "not a multiple of --bs"},
	}
	var sfs unix.Statfs_t
	if unix.Statfs("/dev/shm", &sfs) == nil && sfs.Type == 0x01021994 { // tmpfs
		cases = append(cases, struct {
			o    NVMeOptions
			want string
		}{NVMeOptions{Paths: []string{"/dev/shm"}, SizeBytes: 1 << 20}, "tmpfs"})
	}
	for _, c := range cases {
		_, err := RunNVMe(context.Background(), c.o.WithDefaults())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error containing %q", c.o, err, c.want)
		}
	}
	noLeftovers(t, d)
}

// TestNVMeOptionsExplicitZeros: WithDefaults fills only zero fields, and an
// explicit 0 or negative value that reaches Validate is refused, as are
// --loops with --duration and one place given twice. Validate changes
// nothing.
func TestNVMeOptionsExplicitZeros(t *testing.T) {
	def := NVMeOptions{Paths: []string{"/x"}}.WithDefaults()
	if def.Engine != nvme.EngineAuto || def.RW != "read" || def.BlockBytes != 1<<20 || def.QueueDepth != 32 ||
		def.SizeBytes != 1<<30 || def.Loops != 1 || def.Duration != 0 || def.SubmitBatch != 1 {
		t.Fatalf("defaults %+v", def)
	}
	if d := (NVMeOptions{Paths: []string{"/x"}, Duration: time.Second}).WithDefaults(); d.Loops != 0 {
		t.Fatalf("defaults with a duration set loops %d; want them left unset", d.Loops)
	}
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	cases := []struct {
		edit func(*NVMeOptions)
		want string
	}{
		{func(o *NVMeOptions) { o.BlockBytes = 0 }, "--bs 0"},
		{func(o *NVMeOptions) { o.BlockBytes = -4096 }, "--bs -4096"},
		{func(o *NVMeOptions) { o.QueueDepth = 0 }, "--qd 0"},
		{func(o *NVMeOptions) { o.QueueDepth = -1 }, "--qd -1"},
		{func(o *NVMeOptions) { o.SizeBytes = 0 }, "--size 0"},
		{func(o *NVMeOptions) { o.SizeBytes = -1 << 20 }, "--size -1048576"},
		{func(o *NVMeOptions) { o.SubmitBatch = 0 }, "--submit-batch 0"},
		{func(o *NVMeOptions) { o.SubmitBatch = 1025 }, "--submit-batch 1025"},
		{func(o *NVMeOptions) { o.Loops = 0 }, "--loops 0"},
		{func(o *NVMeOptions) { o.Loops = -2 }, "--loops -2"},
		{func(o *NVMeOptions) { o.Loops, o.Duration = 3, time.Second }, "--loops 3 and --duration 1s: give one or the other"},
		{func(o *NVMeOptions) { o.Loops, o.Duration = 0, -time.Second }, "--duration -1s"},
		{func(o *NVMeOptions) { o.Engine = "" }, `--engine ""`},
		{func(o *NVMeOptions) { o.Engine = "aio" }, `--engine "aio"`},
		{func(o *NVMeOptions) { o.RW = "" }, `--rw ""`},
		{func(o *NVMeOptions) { o.Paths = []string{"/d", "/d/"} }, "--path /d and --path /d/ are the same place"},
		{func(o *NVMeOptions) { o.Paths = []string{"/d", "/e/../d"} }, "--path /d and --path /e/../d are the same place"},
		{func(o *NVMeOptions) { o.Paths = nil }, "no --path"},
	}
	for _, c := range cases {
		o := def
		c.edit(&o)
		before := fmt.Sprintf("%+v", o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", before, err, c.want)
		}
		if after := fmt.Sprintf("%+v", o); after != before {
			t.Errorf("Validate changed the options: %s -> %s", before, after)
		}
		// RunNVMe refuses the same before touching anything.
		if _, err := RunNVMe(context.Background(), o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("RunNVMe(%s): got %v, want an error containing %q", before, err, c.want)
		}
	}
	// The duration alone runs.
	o := def
	o.Loops, o.Duration = 0, time.Second
	if err := o.Validate(); err != nil {
		t.Errorf("--duration alone: %v", err)
	}
}

// TestRunNVMeSameFileTwice: two --path that lead to one file (a directory
// and its bench file, a symlink to the directory) are refused before any
// file is created; they would count each block twice.
func TestRunNVMeSameFileTwice(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(d, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		paths []string
		want  string
	}{
		// The bench file of d does not exist yet: a path that does not exist is refused first.
		{[]string{d, filepath.Join(d, "strata-bench-nvme.dat")}, "does not exist"},
		{[]string{d, link}, "give each drive once"},
		{[]string{link + "/", d}, "give each drive once"},
	} {
		paths := c.paths
		o := NVMeOptions{Paths: paths, BlockBytes: 64 << 10, QueueDepth: 2, SizeBytes: 1 << 20}.WithDefaults()
		_, err := RunNVMe(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want a refusal containing %q", paths, err, c.want)
		}
		noLeftovers(t, d)
	}
}

// TestRunNVMeWithoutIPCLock runs the default workload shape (1 MiB blocks,
// here 16 in flight: 16 MiB of buffers) as an ordinary user would: on an OS
// thread without CAP_IPC_LOCK (capabilities are per thread; io_uring charges
// the ring's pinned pages to the user that created it when it lacks the
// capability) and RLIMIT_MEMLOCK 8 MiB. Registering the buffers fails with
// ENOMEM; the run must go on without them and say so.
func TestRunNVMeWithoutIPCLock(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur == unix.RLIM_INFINITY || rl.Cur > 8<<20 {
		lowered := rl
		lowered.Cur = 8 << 20
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lowered); err != nil {
			t.Fatal(err)
		}
		defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl)
	}
	type outcome struct {
		res NVMeResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		if err := dropIPCLock(); err != nil {
			done <- outcome{err: err}
			return
		}
		o := NVMeOptions{Paths: []string{d}, QueueDepth: 16, SizeBytes: 16 << 20, Engine: nvme.EngineUring}.WithDefaults()
		res, err := RunNVMe(context.Background(), o)
		done <- outcome{res, err}
	}()
	out := <-done
	if errors.Is(out.err, unix.EPERM) || errors.Is(out.err, unix.ENOSYS) {
		t.Skipf("io_uring unavailable here: %v", out.err)
	}
	if out.err != nil {
		t.Fatalf("run without CAP_IPC_LOCK: %v", out.err)
	}
	r := out.res
	if r.Bytes != 16<<20 || r.Engine != nvme.EngineUring {
		t.Fatalf("result %+v", r)
	}
	for _, want := range []string{"fixed buffers 0,", "fixed buffers off: 16.0 MiB could not be pinned (nvme: register buffers: io_uring_register(0): cannot allocate memory", "running with plain buffers"} {
		if !strings.Contains(r.EngineInfo, want) {
			t.Errorf("engine info %q does not say %q", r.EngineInfo, want)
		}
	}
	t.Logf("engine: %s", r.EngineInfo)
}

// dropIPCLock removes CAP_IPC_LOCK from the calling thread's effective set.
func dropIPCLock() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop CAP_IPC_LOCK: %w", err)
	}
	return nil
}

// noLeftovers fails the test when dir holds a temporary bench file.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	left, err := filepath.Glob(filepath.Join(dir, benchFilePattern))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("temporary bench files left: %v", left)
	}
}
