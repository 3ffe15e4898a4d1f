//go:build linux

package nvme

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/strata-ai/strata/internal/leaktest"
	"golang.org/x/sys/unix"
)

// TestSubmitBatch: the io_uring backend hands the kernel at most
// Options.SubmitBatch SQEs per io_uring_enter (io_uring plugs a larger
// submission and the block layer merges adjacent requests in the plug).
// One Submit of 16 adjacent requests goes in 16 enters at the default 1, in
// 4 at 4 and in 1 at 16, as io_uring_enter sees them (the hook) and as the
// engine counts them (Stats.Enters, Stats.SQEs). Then chains resubmitted
// from completion callbacks (the reaper's hand-over, several enters per
// round) keep the limit and round-trip every byte while io_uring_enter
// fails transiently now and then, between the enters of a hand-over too.
func TestSubmitBatch(t *testing.T) {
	const qd = 16
	for _, batch := range []int{0, 4, qd} { // 0: the default, 1
		t.Run(fmt.Sprintf("batch%d", batch), func(t *testing.T) {
			leaktest.Check(t)
			var calls, most atomic.Uint32
			var flaky atomic.Bool
			oldHook := enterHook
			enterHook = func(toSubmit, _, _ uint32) error {
				if toSubmit == 0 {
					return nil // a plain wait
				}
				n := calls.Add(1)
				for m := most.Load(); toSubmit > m && !most.CompareAndSwap(m, toSubmit); m = most.Load() {
				}
				switch {
				case flaky.Load() && n%5 == 0:
					return unix.EAGAIN
				case flaky.Load() && n%7 == 0:
					return unix.EINTR
				}
				return nil
			}
			t.Cleanup(func() { enterHook = oldHook })
			e, err := Open(Options{Engine: EngineUring, QueueDepth: qd, SubmitBatch: batch})
			skipWithoutUring(t, err)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			want := max(batch, 1)
			if got := e.Info().SubmitBatch; got != want {
				t.Fatalf("Info().SubmitBatch %d, want %d", got, want)
			}
			if s := e.Info().String(); !strings.Contains(s, fmt.Sprintf("%d SQE", want)) {
				t.Errorf("Info %q does not say the batch", s)
			}
			f := openFile(t, diskDir(t), "batch", 4<<20)
			a := int(f.Alignment())
			src, dst := alignedBuf(t, 64*a), alignedBuf(t, 64*a)
			fill(src, uint64(want))

			writeUnits(t, e, f, src, a, qd)
			st := e.Stats()
			if st.SQEs != qd || st.Enters != uint64(qd/want) || calls.Load() != uint32(qd/want) || most.Load() != uint32(want) {
				t.Fatalf("%d requests in one Submit: %d SQEs in %d enters (hook: %d calls, at most %d SQEs), want %d enters of %d",
					qd, st.SQEs, st.Enters, calls.Load(), most.Load(), qd/want, want)
			}

			flaky.Store(true)
			if err := chainedRoundTrip(e, f, qd, 64, a, src, dst); err != nil {
				t.Fatal(err)
			}
			st = e.Stats()
			if most.Load() > uint32(want) || st.SQEs < qd+2*64 || st.Enters*uint64(want) < st.SQEs {
				t.Fatalf("chains: %d SQEs in %d enters, at most %d per enter: want at most %d", st.SQEs, st.Enters, most.Load(), want)
			}
			if st.Errors != 0 {
				t.Fatalf("stats %+v", st)
			}
			t.Logf("%d SQEs in %d enters (%d hook calls)", st.SQEs, st.Enters, calls.Load())
		})
	}
}

// TestSubmitBatchValidate: a batch outside 1..4096 is refused, naming it.
func TestSubmitBatchValidate(t *testing.T) {
	for _, b := range []int{-1, 4097} {
		o := Options{SubmitBatch: b}
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("submit batch %d", b)) {
			t.Errorf("SubmitBatch %d: error %v", b, err)
		}
	}
	o := Options{}
	if err := o.Validate(); err != nil || o.SubmitBatch != 1 {
		t.Errorf("default: SubmitBatch %d, err %v; want 1", o.SubmitBatch, err)
	}
}
