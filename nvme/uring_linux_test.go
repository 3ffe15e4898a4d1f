//go:build linux

package nvme

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/leaktest"
	"golang.org/x/sys/unix"
)

// withTinyRings makes the next engines' rings one SQE and two CQEs, so that
// a queue depth of 2 fills the SQ and the CQ, and installs hook before every
// io_uring_enter of the backend.
func withTinyRings(t *testing.T, hook func(toSubmit, minComplete, ready uint32) error) {
	oldSizes, oldHook := ringSizes, enterHook
	ringSizes = func(int) (uint32, uint32) { return 1, 2 }
	enterHook = hook
	t.Cleanup(func() { ringSizes, enterHook = oldSizes, oldHook })
}

// TestFullRingsManySubmitters forces a full SQ and CQ: rings of one SQE and
// two CQEs, queue depth 1, 2 and 4 (4 overflows the kernel's CQ), 16
// goroutines submitting at once (single
// requests and batches larger than the queue depth), while io_uring_enter refuses to submit
// (EBUSY, as Linux 5.x does while the CQ overflows) as long as completions
// wait unreaped, and now and then fails with EAGAIN, ENOMEM or EINTR, waits
// included. Then chains resubmitted from completion callbacks run under the
// same conditions. Every byte must round-trip and nothing may panic or hang: a
// submitter that backs off must let the reaper drain the CQ.
func TestFullRingsManySubmitters(t *testing.T) {
	for _, qd := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("qd%d", qd), func(t *testing.T) {
			leaktest.Check(t)
			var calls, refused atomic.Uint64
			withTinyRings(t, func(toSubmit, minComplete, ready uint32) error {
				n := calls.Add(1)
				switch {
				case toSubmit > 0 && ready > 0:
					refused.Add(1)
					return unix.EBUSY
				case n%7 == 0:
					return unix.EAGAIN
				case n%11 == 0:
					return unix.ENOMEM
				case n%13 == 0:
					return unix.EINTR
				}
				return nil
			})
			e := openEngine(t, EngineUring, qd)
			if got := e.Info().SQEntries; got != 1 {
				t.Fatalf("sq entries %d, want 1", got)
			}
			f := openFile(t, diskDir(t), "full", 4<<20)
			a := int(f.Alignment())
			const workers, rounds, batch = 16, 12, 4
			src := alignedBuf(t, workers*batch*a)
			dst := alignedBuf(t, workers*batch*a)
			fill(src, uint64(qd))
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- fullRingWorker(e, f, w, rounds, batch, a, src, dst)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			// Chains resubmitted from the callbacks: requests submitted
			// while the reaper runs callbacks are left for its next enter.
			if err := chainedRoundTrip(e, f, qd, workers*batch, a, src, dst); err != nil {
				t.Error(err)
			}
			if st := e.Stats(); st.Errors != 0 {
				t.Errorf("stats %+v", st)
			}
			if qd > 1 && refused.Load() == 0 {
				t.Error("io_uring_enter was never refused: the test did not fill the CQ")
			}
			t.Logf("%d enters, %d refused while completions waited", calls.Load(), refused.Load())
		})
	}
}

// fullRingWorker writes and reads back its own blocks, one request at a
// time (even workers) or in batches of batch requests (odd workers, more
// than the queue depth, so Submit waits for slots).
func fullRingWorker(e *Engine, f *File, w, rounds, batch, a int, src, dst []byte) error {
	base := w * batch * a
	for round := range rounds {
		fileOff := int64((round%4)*(16*batch*a) + base)
		reqs := make([]*Request, batch)
		var c Completion
		for i := range reqs {
			reqs[i] = &Request{Op: OpWrite, File: f, Buf: src[base+i*a : base+(i+1)*a], Offset: fileOff + int64(i*a), Wait: &c}
		}
		if w%2 == 0 {
			for _, r := range reqs {
				if err := e.Submit(r); err != nil {
					return err
				}
				if err := c.Wait(); err != nil {
					return err
				}
			}
		} else if err := e.Submit(reqs...); err != nil {
			return err
		}
		if err := c.Wait(); err != nil {
			return err
		}
		clear(dst[base : base+batch*a])
		for i := range reqs {
			reqs[i] = &Request{Op: OpRead, File: f, Buf: dst[base+i*a : base+(i+1)*a], Offset: fileOff + int64(i*a), Wait: &c}
		}
		if err := e.Submit(reqs...); err != nil {
			return err
		}
		if err := c.Wait(); err != nil {
			return err
		}
		if !bytes.Equal(src[base:base+batch*a], dst[base:base+batch*a]) {
			return fmt.Errorf("worker %d round %d: data differs", w, round)
		}
	}
	return nil
}

// chainedRoundTrip runs queueDepth chains, each resubmitting its request
// from the completion callback (as `strata bench nvme` does; a slot is
// always free since there are never more requests than slots), writing n
// blocks of a bytes from src, then reads them back into dst and compares.
func chainedRoundTrip(e *Engine, f *File, queueDepth, n, a int, src, dst []byte) error {
	for _, op := range []Op{OpWrite, OpRead} {
		buf := src
		if op == OpRead {
			buf = dst
			clear(dst[:n*a])
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		next := 0
		// take returns the next block to transfer, or -1 when all are out.
		take := func() int {
			mu.Lock()
			defer mu.Unlock()
			if next == n || firstErr != nil {
				return -1
			}
			next++
			return next - 1
		}
		reqs := make([]Request, queueDepth)
		for i := range reqs {
			r := &reqs[i]
			r.Op, r.File = op, f
			r.Done = func(r *Request) {
				if r.Err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, r.Err)
					mu.Unlock()
				}
				b := take()
				if b < 0 {
					wg.Done()
					return
				}
				r.Buf, r.Offset = buf[b*a:(b+1)*a], int64(b*a)
				if err := e.Submit(r); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					wg.Done()
				}
			}
			b := take()
			r.Buf, r.Offset = buf[b*a:(b+1)*a], int64(b*a)
			wg.Add(1)
		}
		for i := range reqs {
			if err := e.Submit(&reqs[i]); err != nil {
				return err
			}
		}
		wg.Wait()
		if firstErr != nil {
			return firstErr
		}
	}
	if !bytes.Equal(src[:n*a], dst[:n*a]) {
		return errors.New("chained round trip: data differs")
	}
	return nil
}

// TestEnterStallFailsRequests: when io_uring_enter fails transiently for
// longer than enterStallLimit, the requests it could not hand over complete
// with an error that names the request and the errno (no panic), and the
// engine works again once the kernel does.
func TestEnterStallFailsRequests(t *testing.T) {
	for _, errno := range []unix.Errno{unix.EAGAIN, unix.ENOMEM, unix.EBUSY} {
		t.Run(errno.Error(), func(t *testing.T) {
			leaktest.Check(t)
			oldLimit := enterStallLimit
			enterStallLimit = 20 * time.Millisecond
			t.Cleanup(func() { enterStallLimit = oldLimit })
			var stalled atomic.Bool
			oldHook := enterHook
			enterHook = func(toSubmit, _, _ uint32) error {
				if stalled.Load() && toSubmit > 0 {
					return errno
				}
				return nil
			}
			t.Cleanup(func() { enterHook = oldHook })
			e := openEngine(t, EngineUring, 4)
			f := openFile(t, diskDir(t), "stall", 1<<20)
			buf := alignedBuf(t, 1<<16)
			fill(buf, 3)
			if err := e.WriteAt(f, buf, 0); err != nil {
				t.Fatal(err)
			}

			stalled.Store(true)
			var c Completion
			reqs := make([]*Request, 8) // more than the queue depth
			for i := range reqs {
				reqs[i] = &Request{Op: OpRead, File: f, Buf: buf[i*4096 : (i+1)*4096], Offset: int64(i * 4096), Wait: &c}
			}
			if err := e.Submit(reqs...); err != nil {
				t.Fatal(err)
			}
			err := c.Wait()
			if !errors.Is(err, errno) {
				t.Fatalf("error %v, want %v", err, errno)
			}
			var ioe *IOError
			if !errors.As(err, &ioe) || !strings.Contains(err.Error(), "io_uring_enter") || !strings.Contains(err.Error(), "nvme: read ") {
				t.Fatalf("error %q does not name the request and io_uring_enter", err)
			}
			for i, r := range reqs {
				if r.Err == nil || r.N != 0 {
					t.Errorf("request %d: n=%d err=%v, want failed", i, r.N, r.Err)
				}
			}
			if st := e.Stats(); st.Errors != uint64(len(reqs)) {
				t.Errorf("errors counted %d, want %d", st.Errors, len(reqs))
			}

			// The withdrawn SQEs must not reach the kernel later: the
			// engine works as before once io_uring_enter does.
			stalled.Store(false)
			got := alignedBuf(t, 1<<16)
			if err := e.ReadAt(f, got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, buf) {
				t.Fatal("data differs after the stall")
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
