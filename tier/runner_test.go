package tier

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/prefetch"
	"github.com/strata-ai/strata/shard"
)

// plannerFor returns a prefetch planner over the registered shards of r's
// store (sizes as the store charges them) and a runner driving it.
func plannerFor(t *testing.T, r *rig, keys ...shard.Key) (*prefetch.Planner, *Runner) {
	t.Helper()
	res := prefetch.Residency{}
	for _, k := range keys {
		w, err := r.s.Where(k)
		if err != nil {
			t.Fatal(err)
		}
		res[k] = prefetch.Placement{SizeBytes: slices.Max(w.ChargeBytes[:]), Home: w.Spec.Home}
	}
	opts := prefetch.DefaultOptions()
	opts.BudgetBytes[shard.Host] = r.s.Stats().Host.BudgetBytes
	p, err := prefetch.New(res, opts)
	if err != nil {
		t.Fatal(err)
	}
	run, err := NewRunner(r.s, p, RunnerOptions{Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(run.Close)
	return p, run
}

// TestRunnerMoveFails: a demand read that fails with EIO ends Use with one
// error, wrapped once by tier, that names the shard, the move and the swap
// file; the rank stays failed (Use and BeginStep return it again) and no
// lease is left behind.
func TestRunnerMoveFails(t *testing.T) {
	checkLeaks(t)
	r, k, _ := faultRig(t, nvme.Fault{Kind: nvme.FaultEIO, Op: nvme.OpRead, Nth: 1})
	_, run := plannerFor(t, r, k)
	a := shard.Access{Key: k, Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Update}
	l, err := run.Use(a)
	if err == nil {
		run.Done(l, nil)
		t.Fatal("Use succeeded over a failed read")
	}
	checkNamed(t, err, k, r.paths)
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("error %v does not wrap EIO", err)
	}
	if n := strings.Count(err.Error(), "tier:"); n != 1 {
		t.Errorf("error %q is wrapped by tier %d times, want once", err, n)
	}
	if _, again := run.Use(a); again != err {
		t.Errorf("Use after the failure: %v, want the first failure", again)
	}
	if got := run.BeginStep(); got != err {
		t.Errorf("BeginStep after the failure: %v, want the first failure", got)
	}
	if w, _ := r.s.Where(k); w.Copies[shard.Host].Leases != 0 {
		t.Errorf("a failed Use left %d leases", w.Copies[shard.Host].Leases)
	}
}

// gateEvent is a gpu.Event that completes when it is closed.
type gateEvent chan struct{}

func (g gateEvent) Synchronize() { <-g }

func (g gateEvent) Done() bool {
	select {
	case <-g:
		return true
	default:
		return false
	}
}

// TestRunnerReleasesOnEvent: Done with an event keeps the lease until the
// event completes, and the runner's waiter releases it then, with no
// further call from the rank.
func TestRunnerReleasesOnEvent(t *testing.T) {
	checkLeaks(t)
	r := newRig(t, rigConfig{})
	k := shard.Key{Chunk: 1, State: shard.Param}
	if err := r.s.Register(k, Spec{Elems: 1024, DType: dtype.BF16, Home: shard.Host}); err != nil {
		t.Fatal(err)
	}
	_, run := plannerFor(t, r, k)
	l, err := run.Use(shard.Access{Key: k, Phase: shard.Forward, Tier: shard.Host, Kind: shard.Read})
	if err != nil {
		t.Fatal(err)
	}
	leases := func() int {
		w, _ := r.s.Where(k)
		return w.Copies[shard.Host].Leases
	}
	ev := make(gateEvent)
	run.Done(l, ev)
	if n := leases(); n != 1 {
		t.Fatalf("%d leases before the event completed, want 1", n)
	}
	close(ev)
	deadline := time.Now().Add(10 * time.Second)
	for leases() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lease was not released after its event completed")
		}
		time.Sleep(time.Millisecond)
	}
}

// gatedDevice holds every read until its gate is closed.
type gatedDevice struct {
	nvme.Device
	gate chan struct{}
}

func (d gatedDevice) Submit(reqs ...*nvme.Request) error {
	for _, q := range reqs {
		if q.Op == nvme.OpRead {
			<-d.gate
			break
		}
	}
	return d.Device.Submit(reqs...)
}

func (d gatedDevice) ReadAt(f *nvme.File, buf []byte, off int64) error {
	<-d.gate
	return d.Device.ReadAt(f, buf, off)
}

// TestRunnerPauseWaits: Pause returns only once the moves in flight have
// completed and the planner has been told (the Use waiting for one gets
// its shard); afterwards nothing is in flight.
func TestRunnerPauseWaits(t *testing.T) {
	checkLeaks(t)
	gate := make(chan struct{})
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB, wrap: func(d nvme.Device) nvme.Device { return gatedDevice{d, gate} }})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the store's Close, which waits for the held read
	k := shard.Key{Chunk: 2, State: shard.Master}
	if err := r.s.Register(k, Spec{Elems: 4096, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	data := pattern(k, 7, 4096*4)
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, data)
	r.mustWait(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}))
	_, run := plannerFor(t, r, k)

	type result struct {
		l   *Lease
		err error
	}
	used := make(chan result, 1)
	go func() {
		l, err := run.Use(shard.Access{Key: k, Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Read})
		used <- result{l, err}
	}()
	for r.s.Stats().InFlight == 0 { // the demand read is held at the gate
		time.Sleep(time.Millisecond)
	}
	paused := make(chan error, 1)
	go func() { paused <- run.Pause() }()
	select {
	case err := <-paused:
		t.Fatalf("Pause returned (%v) while a move was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	open()
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if n := r.s.Stats().InFlight; n != 0 {
		t.Errorf("%d moves in flight after Pause", n)
	}
	u := <-used
	if u.err != nil {
		t.Fatal(u.err)
	}
	if !bytes.Equal(u.l.Bytes(), data) {
		t.Error("the shard fetched during Pause is not the one written")
	}
	run.Done(u.l, nil)
	run.Resume()
}

// TestRunnerPauseThenClose: a Pause waiting for a move returns once the
// move completes even when the runner is closed meanwhile (nothing wakes a
// closed runner's waiters but the move itself).
func TestRunnerPauseThenClose(t *testing.T) {
	checkLeaks(t)
	gate := make(chan struct{})
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB, wrap: func(d nvme.Device) nvme.Device { return gatedDevice{d, gate} }})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the store's Close, which waits for the held read
	k := shard.Key{Chunk: 2, State: shard.Master}
	if err := r.s.Register(k, Spec{Elems: 4096, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, pattern(k, 7, 4096*4))
	r.mustWait(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}))
	_, run := plannerFor(t, r, k)
	used := make(chan error, 1)
	go func() {
		l, err := run.Use(shard.Access{Key: k, Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Read})
		if l != nil {
			l.Release()
		}
		used <- err
	}()
	for r.s.Stats().InFlight == 0 { // the demand read is held at the gate
		time.Sleep(time.Millisecond)
	}
	paused := make(chan error, 1)
	go func() { paused <- run.Pause() }()
	time.Sleep(20 * time.Millisecond) // Pause is waiting (or about to)
	run.Close()
	open()
	select {
	case <-paused: // ErrClosed or nil: either is an answer
	case <-time.After(10 * time.Second):
		t.Fatal("Pause did not return after the move completed on a closed runner")
	}
	if err := <-used; !errors.Is(err, ErrClosed) {
		t.Fatalf("Use on a closed runner: %v, want ErrClosed", err)
	}
}

// TestRunnerCloseEndsUse: a Use waiting for a move returns ErrClosed when
// the runner is closed, as does every later one.
func TestRunnerCloseEndsUse(t *testing.T) {
	checkLeaks(t)
	gate := make(chan struct{})
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB, wrap: func(d nvme.Device) nvme.Device { return gatedDevice{d, gate} }})
	t.Cleanup(func() { close(gate) }) // before the store's Close, which waits for the held read
	k := shard.Key{Chunk: 4, State: shard.AdamV}
	if err := r.s.Register(k, Spec{Elems: 4096, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, pattern(k, 1, 4096*4))
	r.mustWait(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}))
	_, run := plannerFor(t, r, k)
	a := shard.Access{Key: k, Phase: shard.Optimizer, Tier: shard.Host, Kind: shard.Update}
	used := make(chan error, 1)
	go func() {
		l, err := run.Use(a)
		if err == nil {
			run.Done(l, nil)
		}
		used <- err
	}()
	for r.s.Stats().InFlight == 0 { // the demand read is held at the gate
		time.Sleep(time.Millisecond)
	}
	run.Close()
	select {
	case err := <-used:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Use waiting at Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the waiting Use")
	}
	if _, err := run.Use(a); !errors.Is(err, ErrClosed) {
		t.Errorf("Use after Close: %v, want ErrClosed", err)
	}
}
