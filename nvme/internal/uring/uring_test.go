//go:build linux

package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func newRing(t *testing.T, entries uint32) *Ring {
	t.Helper()
	r, err := New(entries, 0, 0)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) {
		t.Skipf("io_uring unavailable here (%v): seccomp, kernel.io_uring_disabled or an old kernel", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func alignedBuf(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func TestNopAndFull(t *testing.T) {
	r := newRing(t, 4)
	n := 0
	for r.GetSQE() != nil {
		n++
	}
	if n != int(r.SQEntries()) {
		t.Fatalf("got %d SQEs before full, want %d", n, r.SQEntries())
	}
	// The handed-out SQEs are zeroed, i.e. NOPs; submit them and wait for all.
	for i := range r.sqes {
		r.sqes[i].UserData = uint64(100 + i)
	}
	got, err := r.Submit(uint32(n))
	if err != nil || got != n {
		t.Fatalf("submit: %d, %v", got, err)
	}
	cqes := make([]CQE, 16)
	m := r.ReapCQEs(cqes)
	if m != n {
		t.Fatalf("reaped %d, want %d", m, n)
	}
	seen := map[uint64]bool{}
	for _, c := range cqes[:m] {
		if c.Res != 0 {
			t.Fatalf("nop res %d", c.Res)
		}
		seen[c.UserData] = true
	}
	if len(seen) != n || !seen[100] {
		t.Fatalf("user data %v", seen)
	}
	if r.Ready() != 0 {
		t.Fatal("CQ not empty after reap")
	}
}

// TestWithdraw takes back published and unpublished SQEs, many times round
// the ring: none of them may complete, and what is submitted afterwards
// completes alone.
func TestWithdraw(t *testing.T) {
	r := newRing(t, 4)
	cqes := make([]CQE, 16)
	for round := range 7 {
		for i := range 3 {
			sqe := r.GetSQE()
			PrepNop(sqe)
			sqe.UserData = uint64(10*round + i)
			if i == 1 {
				r.flush() // the first two are published, the third is not
			}
		}
		if r.Unconsumed() != 3 || r.Pending() != 1 {
			t.Fatalf("round %d: unconsumed %d pending %d, want 3 and 1", round, r.Unconsumed(), r.Pending())
		}
		got := r.Withdraw(nil)
		if want := []uint64{uint64(10 * round), uint64(10*round + 1), uint64(10*round + 2)}; !slices.Equal(got, want) {
			t.Fatalf("round %d: withdrew %v, want %v", round, got, want)
		}
		if r.Unconsumed() != 0 || r.Pending() != 0 {
			t.Fatalf("round %d: unconsumed %d pending %d after Withdraw", round, r.Unconsumed(), r.Pending())
		}
		sqe := r.GetSQE()
		PrepNop(sqe)
		sqe.UserData = 1000 + uint64(round)
		if n, err := r.Submit(1); err != nil || n != 1 {
			t.Fatalf("round %d: submit %d, %v; want 1 consumed", round, n, err)
		}
		if n := r.ReapCQEs(cqes); n != 1 || cqes[0].UserData != 1000+uint64(round) {
			t.Fatalf("round %d: reaped %v", round, cqes[:n])
		}
	}
}

func TestReadWriteFixedFsyncProbe(t *testing.T) {
	r := newRing(t, 8)
	p, err := r.Probe()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []uint8{OpNop, OpFsync, OpReadFixed, OpWriteFixed, OpRead, OpWrite} {
		if !p.Supported(op) {
			t.Errorf("probe: op %d not supported", op)
		}
	}
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 3 * 4096
	src, dst := alignedBuf(t, n), alignedBuf(t, n)
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	if err := r.RegisterBuffers([][]byte{src, dst}); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterFiles([]int32{int32(f.Fd())}); err != nil {
		t.Fatal(err)
	}
	addr := func(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
	// Plain write of the first page, fixed write of the rest through the registered file.
	PrepWrite(r.GetSQE(), int32(f.Fd()), addr(src), 4096, 0)
	sqe := r.GetSQE()
	PrepWriteFixed(sqe, 0, addr(src[4096:]), n-4096, 4096, 0)
	sqe.Flags |= SQEFixedFile
	sqe.UserData = 1
	if _, err := r.Submit(2); err != nil {
		t.Fatal(err)
	}
	cq := make([]CQE, 4)
	if k := r.ReapCQEs(cq); k != 2 || cq[0].Res+cq[1].Res != n {
		t.Fatalf("write cqes %d %+v", k, cq[:k])
	}
	PrepFsync(r.GetSQE(), int32(f.Fd()), FsyncDatasync)
	PrepReadFixed(r.GetSQE(), int32(f.Fd()), addr(dst), 4096, 0, 1)
	PrepRead(r.GetSQE(), int32(f.Fd()), addr(dst[4096:]), n-4096, 4096)
	if _, err := r.Submit(3); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitCQE(3); err != nil {
		t.Fatal(err)
	}
	k := r.ReapCQEs(cq)
	for _, c := range cq[:k] {
		if c.Res < 0 {
			t.Fatalf("cqe error %d", c.Res)
		}
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("read back differs from what was written")
	}
	if err := r.UnregisterFiles(); err != nil {
		t.Fatal(err)
	}
	if err := r.UnregisterBuffers(); err != nil {
		t.Fatal(err)
	}
}

// TestSubmitN: SubmitN hands the kernel at most limit SQEs, the oldest
// first; the rest stay queued for the next call, in order.
func TestSubmitN(t *testing.T) {
	r := newRing(t, 4)
	for i := range 3 {
		sqe := r.GetSQE()
		PrepNop(sqe)
		sqe.UserData = uint64(10 + i)
	}
	var got []uint64
	cqes := make([]CQE, 8)
	for _, want := range []struct{ limit, took, left uint32 }{{1, 1, 2}, {1, 1, 1}, {5, 1, 0}} {
		n, err := r.SubmitN(want.limit, 1)
		if err != nil || uint32(n) != want.took || r.Unconsumed() != want.left {
			t.Fatalf("SubmitN(%d): took %d (%v), %d left; want %d, %d left", want.limit, n, err, r.Unconsumed(), want.took, want.left)
		}
		for _, c := range cqes[:r.ReapCQEs(cqes)] {
			got = append(got, c.UserData)
		}
	}
	if !slices.Equal(got, []uint64{10, 11, 12}) {
		t.Fatalf("completed %v, want 10, 11, 12 in order", got)
	}
}
