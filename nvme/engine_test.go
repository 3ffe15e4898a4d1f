//go:build linux

package nvme

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/leaktest"
)

// TestRoundTrip writes random extents of many sizes at many offsets with
// several queue depths through both engines (with and without fixed buffers
// and files), reads them back and compares every byte.
func TestRoundTrip(t *testing.T) {
	for _, kind := range engines {
		for _, qd := range []int{1, 4, 32} {
			for _, fixed := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/qd%d/fixed=%v", kind, qd, fixed), func(t *testing.T) {
					leaktest.Check(t)
					roundTrip(t, kind, qd, fixed)
				})
			}
		}
	}
}

func roundTrip(t *testing.T, kind string, qd int, fixed bool) {
	const fileSize = 32 << 20
	e := openEngine(t, kind, qd)
	dir := diskDir(t)
	f := openFile(t, dir, "rt", fileSize)
	a := f.Alignment()
	src := alignedBuf(t, 16<<20)
	dst := alignedBuf(t, 16<<20)
	if fixed {
		if err := e.RegisterBuffers(src, dst); err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterFiles(f); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(qd), 7))
	for round := range 3 {
		// Non-overlapping pieces of random aligned sizes at random file offsets.
		type piece struct{ bufOff, fileOff, n int64 }
		var pieces []piece
		var bufOff int64
		fileOffs := rng.Perm(fileSize / (1 << 20))
		for i := 0; i < len(fileOffs) && bufOff < int64(len(src))-(1<<20); i++ {
			n := (1 + rng.Int64N((1<<20)/a)) * a // a .. 1 MiB
			if i%5 == 0 {
				n = a
			}
			fo := int64(fileOffs[i])<<20 + rng.Int64N(((1<<20)-n)/a+1)*a
			pieces = append(pieces, piece{bufOff, fo, n})
			bufOff += (n + 4095) / 4096 * 4096
		}
		fill(src, uint64(round*100+qd))
		clear(dst)
		var c Completion
		reqs := make([]*Request, len(pieces))
		for i, p := range pieces {
			reqs[i] = &Request{Op: OpWrite, File: f, Buf: src[p.bufOff : p.bufOff+p.n], Offset: p.fileOff, Wait: &c}
		}
		if err := e.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(f); err != nil {
			t.Fatal(err)
		}
		var done sync.WaitGroup
		done.Add(len(pieces))
		for i, p := range pieces {
			reqs[i] = &Request{Op: OpRead, File: f, Buf: dst[p.bufOff : p.bufOff+p.n], Offset: p.fileOff,
				Done: func(r *Request) { done.Done() }}
		}
		if err := e.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		done.Wait()
		for i, p := range pieces {
			if reqs[i].Err != nil || reqs[i].N != int(p.n) {
				t.Fatalf("read %d: n=%d err=%v", i, reqs[i].N, reqs[i].Err)
			}
			if !bytes.Equal(src[p.bufOff:p.bufOff+p.n], dst[p.bufOff:p.bufOff+p.n]) {
				t.Fatalf("round %d piece %d (%d bytes at file offset %d): data differs", round, i, p.n, p.fileOff)
			}
		}
	}
	st := e.Stats()
	if st.Errors != 0 || st.BytesRead != st.BytesWritten || st.BytesRead == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShortTransfersAndRetries makes every first attempt short, EAGAIN or
// EINTR; the engine must resubmit the rest and deliver exact data.
func TestShortTransfersAndRetries(t *testing.T) {
	for _, kind := range engines {
		t.Run(kind, func(t *testing.T) {
			leaktest.Check(t)
			e := openEngine(t, kind, 8)
			var mu sync.Mutex
			seen := map[*Request]int{}
			e.resHook = func(r *Request, res int) int {
				mu.Lock()
				defer mu.Unlock()
				seen[r]++
				switch {
				case res <= 0 || r.Op == OpSync:
					return res
				case seen[r] == 1:
					return -int(syscall.EAGAIN)
				case seen[r] == 2:
					return -int(syscall.EINTR)
				case seen[r] == 3 && res > 4096:
					return 4096 // short: only the first block counts
				}
				return res
			}
			f := openFile(t, diskDir(t), "short", 8<<20)
			src, dst := alignedBuf(t, 1<<20), alignedBuf(t, 1<<20)
			fill(src, 3)
			for i := range 8 {
				if err := e.WriteAt(f, src, int64(i)<<20); err != nil {
					t.Fatal(err)
				}
				if err := e.ReadAt(f, dst, int64(i)<<20); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(src, dst) {
					t.Fatalf("block %d differs after short transfers", i)
				}
			}
			st := e.Stats()
			if st.ShortResubmits < 16 || st.Retries < 32 || st.Errors != 0 {
				t.Fatalf("stats %+v: want resubmits and retries, no errors", st)
			}
		})
	}
}

// TestErrorsNameFileOffsetLength: a read past the end and a hard errno both
// come back as *IOError with the file, offset and length.
func TestErrorsNameFileOffsetLength(t *testing.T) {
	for _, kind := range engines {
		t.Run(kind, func(t *testing.T) {
			leaktest.Check(t)
			e := openEngine(t, kind, 4)
			f := openFile(t, diskDir(t), "eof", 1<<20)
			buf := alignedBuf(t, 1<<20)
			err := e.ReadAt(f, buf, 1<<20)
			var ioe *IOError
			if !errors.As(err, &ioe) || !errors.Is(err, io.ErrUnexpectedEOF) || ioe.Offset != 1<<20 || ioe.Length != 1<<20 {
				t.Fatalf("read past EOF: %v", err)
			}
			if !strings.Contains(err.Error(), f.Path()) || !strings.Contains(err.Error(), "offset 1048576 length 1048576") {
				t.Fatalf("error does not name file, offset and length: %v", err)
			}
			e.resHook = func(r *Request, res int) int { return -int(syscall.ECANCELED) }
			err = e.WriteAt(f, buf, 4096)
			if !errors.Is(err, syscall.ECANCELED) || !strings.Contains(err.Error(), "offset 4096") {
				t.Fatalf("cancelled write: %v", err)
			}
			e.resHook = func(r *Request, res int) int { return -int(syscall.EINVAL) }
			if err = e.ReadAt(f, buf, 0); !strings.Contains(err.Error(), "misalignment") {
				t.Fatalf("EINVAL not reported as probable misalignment: %v", err)
			}
			if st := e.Stats(); st.Errors != 3 {
				t.Fatalf("errors counted %d, want 3", st.Errors)
			}
		})
	}
}

// TestMisalignedRefused: a misaligned buffer, offset or length is refused
// before anything is submitted, and no request of a batch is queued.
func TestMisalignedRefused(t *testing.T) {
	for _, kind := range engines {
		t.Run(kind, func(t *testing.T) {
			leaktest.Check(t)
			e := openEngine(t, kind, 4)
			f := openFile(t, diskDir(t), "mis", 1<<20)
			buf := alignedBuf(t, 1<<20)
			a := int(f.Alignment())
			t.Logf("alignment: memory %d, offset %d (%s)", f.memAlign, f.offsetAlign, f.AlignmentSource())
			good := &Request{Op: OpWrite, File: f, Buf: buf[:a], Offset: 0}
			cases := map[string]*Request{
				"buffer": {Op: OpRead, File: f, Buf: buf[1 : 1+a], Offset: 0},
				"offset": {Op: OpRead, File: f, Buf: buf[:a], Offset: int64(a / 2)},
				"length": {Op: OpWrite, File: f, Buf: buf[:a+a/2], Offset: 0},
				"empty":  {Op: OpWrite, File: f, Buf: buf[:0], Offset: 0},
			}
			if f.memAlign == 1 {
				delete(cases, "buffer") // the filesystem accepts any address
			}
			for name, r := range cases {
				err := e.Submit(good, r)
				if !errors.Is(err, ErrMisaligned) || !strings.Contains(err.Error(), f.Path()) {
					t.Errorf("%s: got %v, want ErrMisaligned naming the file", name, err)
				}
			}
			if st := e.Stats(); st.Requests != 0 {
				t.Fatalf("%d requests reached the engine", st.Requests)
			}
		})
	}
}

// TestFallbackToPread: when io_uring cannot be set up, auto falls back and
// says why, and uring refuses.
func TestFallbackToPread(t *testing.T) {
	leaktest.Check(t)
	saved := uringSetup
	defer func() { uringSetup = saved }()
	uringSetup = func(*Engine) (backend, error) {
		return nil, setupError(fmt.Errorf("io_uring_setup: %w", syscall.EPERM))
	}
	e, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	info := e.Info()
	if info.Engine != EnginePread || !strings.Contains(info.FallbackReason, "operation not permitted") ||
		!strings.Contains(info.String(), "falling back to pread") {
		t.Fatalf("info %+v", info)
	}
	if _, err := Open(Options{Engine: EngineUring}); err == nil {
		t.Fatal("engine=uring opened without io_uring")
	}
	f := openFile(t, diskDir(t), "fb", 1<<20)
	buf := alignedBuf(t, 1<<20)
	fill(buf, 9)
	if err := e.WriteAt(f, buf, 0); err != nil {
		t.Fatal(err)
	}
}

// TestCloseWaitsAndRefuses: Close waits for requests in flight; Submit
// afterwards fails with ErrClosed.
func TestCloseWaitsAndRefuses(t *testing.T) {
	for _, kind := range engines {
		t.Run(kind, func(t *testing.T) {
			leaktest.Check(t)
			e, err := Open(Options{Engine: kind, QueueDepth: 4})
			skipWithoutUring(t, err)
			if err != nil {
				t.Fatal(err)
			}
			f := openFile(t, diskDir(t), "close", 8<<20)
			buf := alignedBuf(t, 8<<20)
			var c Completion
			var reqs []*Request
			for i := range 8 {
				reqs = append(reqs, &Request{Op: OpWrite, File: f, Buf: buf[i<<20 : (i+1)<<20], Offset: int64(i) << 20, Wait: &c})
			}
			if err := e.Submit(reqs...); err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			for i, r := range reqs {
				if r.Err != nil || r.N != 1<<20 {
					t.Fatalf("request %d after Close: n=%d err=%v", i, r.N, r.Err)
				}
			}
			if err := c.Wait(); err != nil {
				t.Fatal(err)
			}
			if err := e.WriteAt(f, buf[:4096], 0); !errors.Is(err, ErrClosed) {
				t.Fatalf("write after close: %v", err)
			}
		})
	}
}

func TestOpenFileBadInput(t *testing.T) {
	leaktest.Check(t)
	if _, err := OpenFile("/nonexistent-dir/x", 0, 0); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing path: %v", err)
	}
	if checkDirectIOFS("/dev/shm") == nil {
		t.Skip("/dev/shm is not tmpfs here")
	}
	_, err := OpenFile("/dev/shm/strata-nvme-test", 0x42 /* O_RDWR|O_CREAT */, 0o600)
	if !errors.Is(err, ErrNoDirectIO) || !strings.Contains(err.Error(), "tmpfs") {
		t.Fatalf("tmpfs: %v", err)
	}
}

// TestCloseWhileResubmitting: requests that reissue themselves from their
// completion callback (the bench's pattern) do not stall Close; their next
// Submit fails with ErrClosed.
func TestCloseWhileResubmitting(t *testing.T) {
	for _, kind := range engines {
		t.Run(kind, func(t *testing.T) {
			leaktest.Check(t)
			e, err := Open(Options{Engine: kind, QueueDepth: 4})
			skipWithoutUring(t, err)
			if err != nil {
				t.Fatal(err)
			}
			f := openFile(t, diskDir(t), "loop", 1<<20)
			buf := alignedBuf(t, 4*4096)
			var mu sync.Mutex
			completions, stopped := 0, 0
			var closedErrs []error
			started := make(chan struct{})
			allStopped := make(chan struct{})
			reqs := make([]*Request, 4)
			for i := range reqs {
				reqs[i] = &Request{Op: OpRead, File: f, Buf: buf[i*4096 : (i+1)*4096], Offset: int64(i) * 4096}
				reqs[i].Done = func(r *Request) {
					mu.Lock()
					completions++
					if completions == 50 {
						close(started)
					}
					mu.Unlock()
					if err := e.Submit(r); err != nil {
						mu.Lock()
						closedErrs = append(closedErrs, err)
						stopped++
						if stopped == len(reqs) {
							close(allStopped)
						}
						mu.Unlock()
					}
				}
			}
			if err := e.Submit(reqs...); err != nil {
				t.Fatal(err)
			}
			<-started
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			<-allStopped
			for _, err := range closedErrs {
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("resubmit after close: %v", err)
				}
			}
		})
	}
}

// TestPreadWorkers: the pread backend serves a queue deeper than
// preadWorkers with that many workers (each an OS thread in a system call),
// and every request still completes. A hook that holds each completed
// transfer for a moment lets the concurrent ones pile up to the workers.
func TestPreadWorkers(t *testing.T) {
	leaktest.Check(t)
	const qd = 512
	e := openEngine(t, EnginePread, qd)
	var busy, most atomic.Int32
	e.resHook = func(r *Request, res int) int {
		n := busy.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(50 * time.Millisecond) // long beside a 4 KiB write, even under -race on a loaded machine
		busy.Add(-1)
		return res
	}
	const unit = 4096
	f := openFile(t, diskDir(t), "workers", qd*unit)
	writeUnits(t, e, f, alignedBuf(t, qd*unit), unit, qd)
	// At most the workers; more than half of them at once, or the cap
	// would be starving the queue (timing on a loaded machine allows less
	// than all 64 to overlap).
	if got := most.Load(); got > preadWorkers || got <= preadWorkers/2 {
		t.Errorf("%d transfers at once, want at most the %d workers and more than half of them", got, preadWorkers)
	}
	if got := e.Stats().BytesWritten; got != qd*unit {
		t.Errorf("wrote %d bytes, want %d", got, qd*unit)
	}
	if s := e.Info().String(); !strings.Contains(s, "workers (64, queue depth 512)") {
		t.Errorf("Info %q does not say the workers and the depth", s)
	}
}
