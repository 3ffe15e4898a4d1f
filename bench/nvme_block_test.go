//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/leaktest"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"golang.org/x/sys/unix"
)

// TestIOBuffersHugePages: the bench's I/O buffers are in huge pages
// whenever the kernel allows THP (madvise or always), as /proc/self/smaps
// shows; with THP never they come from hugetlb pages or say they are in
// 4 KiB pages, with the fix.
func TestIOBuffersHugePages(t *testing.T) {
	b, err := newIOBuffers(32 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	thp, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	t.Logf("THP %s; buffers: %s", strings.TrimSpace(string(thp)), b.note)
	switch {
	case len(thp) == 0 || strings.Contains(string(thp), "[never]"):
		if b.hugeBytes != int64(len(b.mem)) && !strings.Contains(b.note, "4 KiB pages") {
			t.Fatalf("neither huge pages nor a note saying so: %q", b.note)
		}
	case b.hugeBytes != int64(len(b.mem)):
		t.Fatalf("THP allowed, but %d of %d bytes in huge pages: %s", b.hugeBytes, len(b.mem), b.note)
	case !strings.Contains(b.note, "huge pages"):
		t.Fatalf("note %q does not say huge pages", b.note)
	}
}

// TestSplitNote: a request average below the block size is reported as a
// split, with the cause that fits the queue's limits and the buffers.
func TestSplitNote(t *testing.T) {
	virtio := []*blockDev{{name: "vda", maxSegments: 254, maxSectorsKB: 1280}}
	small := []*blockDev{{name: "sdb", maxSegments: 254, maxSectorsKB: 512}}
	cases := []struct {
		avg, bs int64
		devs    []*blockDev
		huge    bool
		want    string // "" for no warning
	}{
		{1 << 20, 1 << 20, virtio, false, ""},
		{4 << 20, 1 << 20, virtio, true, ""},    // merged: fine
		{1000 << 10, 1 << 20, virtio, true, ""}, // within 5 %: other I/O
		{512 << 10, 1 << 20, virtio, false, "needs 256 segments, more than vda's max_segments 254"},
		{512 << 10, 1 << 20, small, true, "max_sectors_kb 512"},
		{512 << 10, 1 << 20, virtio, true, "other I/O on the device"},
		{64 << 10, 128 << 10, virtio, false, "requests split: 100 requests of 64.0 KiB on average for 128.0 KiB blocks"},
	}
	for _, c := range cases {
		r := &NVMeResult{BlockRequests: 100, BlockAvgBytes: c.avg, BlockBytes: c.bs}
		got := splitNote(r, c.devs, c.huge)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("avg %d bs %d huge %v: got %q, want %q", c.avg, c.bs, c.huge, got, c.want)
		}
	}
}

// TestRunNVMeBlockStats: a run on a file with a block device reports the
// device, its request count and their average size, and its buffers;
// with --trace-block, the tracer's count and average size as well.
func TestRunNVMeBlockStats(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	o := NVMeOptions{Paths: []string{d}, RW: "read", BlockBytes: 1 << 20, QueueDepth: 4, SizeBytes: 16 << 20, TraceBlock: true}.WithDefaults()
	r, err := RunNVMe(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("block: %d requests of %d B on %s; %s; buffers: %s", r.BlockRequests, r.BlockAvgBytes, r.BlockDevices, r.BlockNote, r.Buffers)
	if r.BlockDevices == "" {
		t.Skipf("the test directory %s has no block device: %s", d, r.BlockNote)
	}
	if r.BlockRequests <= 0 || r.BlockAvgBytes < 4096 || r.Buffers == "" || r.BufferBytes != 4<<20 {
		t.Fatalf("result %+v", r)
	}
	// With BPF (root, BTF) the tracer counts the requests and their size too.
	t.Logf("trace: %d requests of %d B; %s", r.DeviceIOs, r.DeviceAvgBytes, r.TraceNote)
	if r.TraceNote == "" && (r.DeviceIOs <= 0 || r.DeviceAvgBytes < 4096 || r.DeviceAvgBytes > 64<<20) {
		t.Fatalf("traced, but %d requests of %d B", r.DeviceIOs, r.DeviceAvgBytes)
	}
}

// TestRunNVMeSubmitBatch: by default every request goes to the kernel in an
// io_uring_enter of its own (so the block plug merges none: each reaches
// the disk at --bs), as the run's enters and sqes show; with SubmitBatch 8
// the first 8 requests go in one enter, so there are fewer enters than
// SQEs. 64 blocks of 64 KiB, 8 in flight.
func TestRunNVMeSubmitBatch(t *testing.T) {
	leaktest.Check(t)
	d := nvmetest.Dir(t)
	for _, batch := range []int{0, 8} {
		o := NVMeOptions{Paths: []string{d}, RW: "read", BlockBytes: 64 << 10, QueueDepth: 8, SizeBytes: 4 << 20,
			Engine: nvme.EngineUring, SubmitBatch: batch}.WithDefaults()
		r, err := RunNVMe(context.Background(), o)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) {
			t.Skipf("io_uring unavailable here: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("batch %d: %d SQEs in %d enters; block: %d requests of %d B", r.SubmitBatch, r.SQEs, r.Enters, r.BlockRequests, r.BlockAvgBytes)
		if r.SQEs < 64 || r.SubmitBatch != max(batch, 1) || !strings.Contains(r.EngineInfo, fmt.Sprintf("%d SQE", r.SubmitBatch)) {
			t.Fatalf("batch %d: %+v", batch, r)
		}
		if batch == 0 && r.Enters != r.SQEs {
			t.Fatalf("default: %d SQEs in %d enters, want one each", r.SQEs, r.Enters)
		}
		if batch == 8 && r.Enters > r.SQEs-7 {
			t.Fatalf("batch 8: %d SQEs in %d enters, want the first 8 in one", r.SQEs, r.Enters)
		}
	}
}
