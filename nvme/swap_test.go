//go:build linux

package nvme

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/strata-ai/strata/internal/leaktest"
)

func newSwap(t *testing.T, dev Device, paths []string, size int64) *Swap {
	t.Helper()
	s, err := NewSwap(dev, SwapOptions{Paths: paths, SizeBytes: size, StripeBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSwapRoundTripStriped writes extents of many sizes over two paths
// (striped and not), with both engines, and reads them back bit-exact; then
// frees them all and checks that the free lists coalesce.
func TestSwapRoundTripStriped(t *testing.T) {
	for _, kind := range engines {
		for _, qd := range []int{2, 16} {
			t.Run(fmt.Sprintf("%s/qd%d", kind, qd), func(t *testing.T) {
				leaktest.Check(t)
				e := openEngine(t, kind, qd)
				paths := []string{diskDir(t), diskDir(t)}
				s := newSwap(t, e, paths, 64<<20)
				total := s.FreeBytes()
				a := s.Alignment()
				sizes := []int64{a, 4096, 256<<10 - a, 256 << 10, 512 << 10, 512<<10 + a, 3 << 20, 4<<20 + 8192, 9 << 20}
				var exts []*Extent
				var bufs [][]byte
				for i, n := range sizes {
					ext, err := s.Alloc(n)
					if err != nil {
						t.Fatal(err)
					}
					if want := n >= 512<<10; ext.Striped() != want {
						t.Fatalf("extent of %d bytes: striped=%v, want %v", n, ext.Striped(), want)
					}
					buf := alignedBuf(t, int(n))
					fill(buf, uint64(i+qd))
					if err := s.Write(ext, buf); err != nil {
						t.Fatal(err)
					}
					exts, bufs = append(exts, ext), append(bufs, buf)
				}
				for i, ext := range exts {
					got := alignedBuf(t, int(ext.SizeBytes()))
					if err := s.Read(ext, got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, bufs[i]) {
						t.Fatalf("extent %d (%d bytes) differs", ext.ID(), ext.SizeBytes())
					}
				}
				// Free in an interleaved order; everything must merge back.
				for i := 0; i < len(exts); i += 2 {
					s.Free(exts[i])
				}
				for i := 1; i < len(exts); i += 2 {
					s.Free(exts[i])
				}
				if s.FreeBytes() != total {
					t.Fatalf("free %d after freeing all, want %d", s.FreeBytes(), total)
				}
				for _, f := range s.files {
					if len(f.free) != 1 {
						t.Fatalf("free list not coalesced: %v", f.free)
					}
				}
				// The whole space is one extent again.
				big, err := s.Alloc(total)
				if err != nil {
					t.Fatal(err)
				}
				s.Free(big)
				if _, err := s.Alloc(total + a); !errors.Is(err, ErrNoSpace) {
					t.Fatalf("over-allocation: %v", err)
				}
			})
		}
	}
}

func TestSwapReadBeforeWriteAndDoubleFree(t *testing.T) {
	leaktest.Check(t)
	e := openEngine(t, EngineUring, 4)
	s := newSwap(t, e, []string{diskDir(t)}, 4<<20)
	ext, err := s.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(t, 1<<20)
	if err := s.Read(ext, buf); !errors.Is(err, ErrNoData) {
		t.Fatalf("read of unwritten extent: %v", err)
	}
	if _, err := s.Alloc(1000); err == nil {
		t.Fatal("misaligned alloc accepted")
	}
	s.Free(ext)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "freed twice") {
			t.Fatalf("double free: %v", r)
		}
	}()
	s.Free(ext)
}

// TestSwapFaults: every injected fault ends in an error that names the
// extent and what was lost, and a later read never returns bad data as good.
func TestSwapFaults(t *testing.T) {
	cases := []struct {
		fault     Fault
		writeErr  error // expected from Write (nil: Write succeeds)
		readErr   error // expected from the Read that follows
		wantInMsg string
	}{
		{Fault{Kind: FaultEIO, Op: OpWrite, Nth: 2}, syscall.EIO, ErrNoData, "injected EIO"},
		{Fault{Kind: FaultShortWrite, Op: OpWrite, Nth: 3}, io.ErrShortWrite, ErrNoData, "lost"},
		{Fault{Kind: FaultNoSpace, Op: OpWrite, Nth: 1}, syscall.ENOSPC, ErrNoData, "ENOSPC"},
		{Fault{Kind: FaultEIO, Op: OpRead, Nth: 2}, nil, syscall.EIO, "injected EIO"},
		{Fault{Kind: FaultShortRead, Op: OpRead, Nth: 4}, nil, io.ErrUnexpectedEOF, "lost"},
		{Fault{Kind: FaultFlipByte, Op: OpWrite, Nth: 3}, nil, ErrCorrupt, "data lost"},
		{Fault{Kind: FaultFlipByte, Op: OpRead, Nth: 1}, nil, ErrCorrupt, "data lost"},
	}
	for _, kind := range engines {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/%v-%v", kind, c.fault.Kind, c.fault.Op), func(t *testing.T) {
				leaktest.Check(t)
				e := openEngine(t, kind, 8)
				fd := NewFaulty(e, c.fault)
				paths := []string{diskDir(t), diskDir(t)}
				s := newSwap(t, fd, paths, 16<<20)
				ext, err := s.Alloc(2 << 20) // striped: 8 units of 256 KiB
				if err != nil {
					t.Fatal(err)
				}
				src := alignedBuf(t, 2<<20)
				fill(src, 42)
				keep := bytes.Clone(src)
				err = s.Write(ext, src)
				if !bytes.Equal(src, keep) {
					t.Fatal("write changed the caller's buffer")
				}
				checkErr := func(what string, err, want error, wantInMsg string) {
					t.Helper()
					if !errors.Is(err, want) {
						t.Fatalf("%s: got %v, want %v", what, err, want)
					}
					msg := err.Error()
					t.Logf("%s: %v", what, msg)
					named := strings.Contains(msg, fmt.Sprintf("extent %d", ext.ID())) &&
						(strings.Contains(msg, paths[0]) || strings.Contains(msg, paths[1]) || errors.Is(err, ErrNoData)) &&
						(strings.Contains(msg, "offset ") || errors.Is(err, ErrNoData))
					if !named || !strings.Contains(msg, wantInMsg) {
						t.Fatalf("%s: error does not name extent, file, offset and %q: %v", what, wantInMsg, msg)
					}
					// Wrapped once at the package boundary: "nvme:" leads and
					// is not repeated by the request error inside.
					if !strings.HasPrefix(msg, "nvme: ") || strings.Count(msg, "nvme:") != 1 {
						t.Fatalf("%s: names the package %d times: %v", what, strings.Count(msg, "nvme:"), msg)
					}
				}
				if c.writeErr != nil {
					checkErr("write", err, c.writeErr, c.wantInMsg)
				} else if err != nil {
					t.Fatalf("write: %v", err)
				}
				dst := alignedBuf(t, 2<<20)
				err = s.Read(ext, dst)
				if c.writeErr != nil {
					checkErr("read after failed write", err, c.readErr, "no valid data")
				} else {
					checkErr("read", err, c.readErr, c.wantInMsg)
				}
				if fd.Injected(c.fault.Kind) != 1 {
					t.Fatalf("injected %d faults, want 1", fd.Injected(c.fault.Kind))
				}
				// Once the fault is gone (the rule fired), a new write and read
				// of the extent succeed and return exactly the data.
				if err := s.Write(ext, src); err != nil {
					t.Fatal(err)
				}
				if err := s.Read(ext, dst); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(dst, src) {
					t.Fatal("data differs after recovery")
				}
			})
		}
	}
}

// TestSwapBadInput: each bad input is refused with a clear message and
// leaves no file behind.
func TestSwapBadInput(t *testing.T) {
	leaktest.Check(t)
	e := openEngine(t, EnginePread, 2)
	good := diskDir(t)
	leftovers := func() {
		t.Helper()
		if left, _ := filepath.Glob(filepath.Join(good, "*.swap")); len(left) > 0 {
			t.Fatalf("swap files left behind: %v", left)
		}
	}
	check := func(name string, opts SwapOptions, want error, msg string) {
		t.Helper()
		_, err := NewSwap(e, opts)
		if err == nil || (want != nil && !errors.Is(err, want)) || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%s: got %v, want %v containing %q", name, err, want, msg)
		}
		leftovers()
	}
	check("missing path", SwapOptions{Paths: []string{good, "/does/not/exist"}, SizeBytes: 1 << 20}, nil, "/does/not/exist does not exist")
	free, err := FreeBytes(good)
	if err != nil {
		t.Fatal(err)
	}
	check("too large", SwapOptions{Paths: []string{good}, SizeBytes: free + 1<<30}, ErrNoSpace, "free")
	check("stripe not aligned", SwapOptions{Paths: []string{good}, SizeBytes: 1 << 20, StripeBytes: 1000}, nil, "not a multiple of the I/O alignment")
	if checkDirectIOFS("/dev/shm") != nil {
		check("tmpfs", SwapOptions{Paths: []string{good, "/dev/shm"}, SizeBytes: 1 << 20}, ErrNoDirectIO, "tmpfs")
	}
}
