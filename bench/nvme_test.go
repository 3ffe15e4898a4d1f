//go:build linux

package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/nvme"
	"golang.org/x/sys/unix"
)

// nvmeTestDir is a directory on a filesystem with O_DIRECT.
func nvmeTestDir(t *testing.T) string {
	d := t.TempDir()
	if _, err := nvme.OpenFile(filepath.Join(d, "probe"), os.O_RDWR|os.O_CREATE, 0o600); err == nil {
		return d
	}
	d, err := os.MkdirTemp("/var/tmp", "bench-nvme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestRunNVMeAllModes(t *testing.T) {
	dirs := []string{nvmeTestDir(t), nvmeTestDir(t)}
	for _, engine := range []string{nvme.EngineUring, nvme.EnginePread} {
		for _, rw := range nvmeRWs {
			o := NVMeOptions{Paths: dirs, RW: rw, BlockBytes: 64 << 10, QueueDepth: 4, SizeBytes: 4 << 20, Engine: engine, Loops: 2}
			r, err := RunNVMe(o)
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
		if _, err := os.Stat(filepath.Join(d, benchFileName)); err == nil {
			t.Fatalf("temporary bench file left in %s", d)
		}
	}
}

func TestRunNVMeBadInput(t *testing.T) {
	d := nvmeTestDir(t)
	cases := []struct {
		o    NVMeOptions
		want string
	}{
		{NVMeOptions{Paths: []string{"/does/not/exist/f"}, SizeBytes: 1 << 20}, "neither it nor its directory exists"},
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
		_, err := RunNVMe(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error containing %q", c.o, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(d, benchFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused run left its file: %v", err)
	}
}
