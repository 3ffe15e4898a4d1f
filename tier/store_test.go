package tier

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/shard"
)

// TestRoundTrip moves many shards of many sizes (odd element counts, sizes
// below and above the swap's stripe, bf16 and fp32, two ranks) around
// HBM -> host -> NVMe -> host -> HBM, and directly HBM -> NVMe -> HBM through
// a staging buffer, all concurrently, and checks every byte.
func TestRoundTrip(t *testing.T) {
	checkLeaks(t)
	r := newRig(t, rigConfig{devices: 2, poolBytes: 8 * units.MiB, swapBytes: 16 * units.MiB})
	elems := []int{1, 3, 64, 1000, 2048, 4097, 30001, 65536, 100003}
	type job struct {
		key  shard.Key
		data []byte
		hops bool // via host (two single hops) or direct (two-hop moves)
	}
	var jobs []job
	var wantPCIe, wantNVMe int64
	for i, n := range elems {
		for rank := range int32(2) {
			for _, st := range []shard.State{shard.Param, shard.Master} {
				dt := dtype.BF16
				if st == shard.Master {
					dt = dtype.F32
				}
				k := shard.Key{Chunk: shard.ChunkID(i), Rank: rank, State: st}
				if err := r.s.Register(k, Spec{Elems: n, DType: dt, Home: shard.NVMe}); err != nil {
					t.Fatal(err)
				}
				size := int64(n * dt.Size())
				jobs = append(jobs, job{key: k, data: pattern(k, 1, size), hops: (i+int(rank))%2 == 0})
				wantPCIe += 2 * size
				wantNVMe += 2 * units.AlignUp(size, r.swap.Alignment())
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs))
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- roundTrip(r, j.key, j.data, j.hops)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	st := r.s.Stats()
	if got := st.Links[shard.HBMToHost].Bytes + st.Links[shard.HostToHBM].Bytes; got != wantPCIe {
		t.Errorf("pcie bytes %d, want %d", got, wantPCIe)
	}
	if got := st.Links[shard.HostToNVMe].Bytes + st.Links[shard.NVMeToHost].Bytes; got != wantNVMe {
		t.Errorf("nvme bytes %d, want %d", got, wantNVMe)
	}
	if st.Failed != 0 || st.InFlight != 0 || st.Host.InUseBytes != 0 {
		t.Errorf("after the round trips: %s", st)
	}
	checkBudgets(t, st)
	for _, j := range jobs {
		res, err := r.s.Where(j.key)
		if err != nil {
			t.Fatal(err)
		}
		c := res.Copies
		if !c[shard.HBM].Valid || c[shard.Host].Present || !c[shard.NVMe].Valid || res.Dirty {
			t.Errorf("%s: residency %+v", j.key, res)
		}
	}
}

// roundTrip: Alloc HBM, write, write back to NVMe (through host, or
// directly), read back to HBM, compare.
func roundTrip(r *rig, k shard.Key, data []byte, viaHost bool) error {
	s := r.s
	step := func(m shard.Move) error {
		op, err := s.Submit(m)
		if err != nil {
			return err
		}
		return op.Wait()
	}
	if _, err := s.Submit(shard.Move{Key: k, To: shard.HBM, Reason: shard.Alloc}); err != nil {
		return err
	}
	l, err := s.Acquire(k, shard.HBM, shard.Write)
	if err != nil {
		return err
	}
	d := r.devs[k.Rank]
	st := d.NewStream()
	d.CopyHostToDevice(st, l.Buffer(), 0, data)
	if err := st.Synchronize(); err != nil {
		return err
	}
	l.Release()
	var moves []shard.Move
	if viaHost {
		moves = []shard.Move{
			{Key: k, From: shard.HBM, To: shard.Host, Reason: shard.WriteBack},
			{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack},
			{Key: k, From: shard.NVMe, To: shard.Host, Reason: shard.Prefetch},
			{Key: k, From: shard.Host, To: shard.HBM, Reason: shard.Prefetch},
			{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.Evict},
		}
	} else {
		moves = []shard.Move{
			{Key: k, From: shard.HBM, To: shard.NVMe, Reason: shard.WriteBack},
			{Key: k, From: shard.NVMe, To: shard.HBM, Reason: shard.Demand},
		}
	}
	for _, m := range moves {
		if err := step(m); err != nil {
			return err
		}
	}
	l, err = s.Acquire(k, shard.HBM, shard.Read)
	if err != nil {
		return err
	}
	defer l.Release()
	got := make([]byte, len(data))
	d.CopyDeviceToHost(st, got, l.Buffer(), 0)
	if err := st.Synchronize(); err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("%s: data differs after the round trip", k)
	}
	return nil
}

// TestChainedMoves submits NVMe -> host and host -> HBM at once: the second
// waits for the first to land.
func TestChainedMoves(t *testing.T) {
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB})
	k := shard.Key{Chunk: 7, State: shard.Param}
	if err := r.s.Register(k, Spec{Elems: 50000, DType: dtype.BF16, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	data := pattern(k, 2, 100000)
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, data)
	r.mustWait(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}))
	a := r.mustOp(r.s.Fetch(k, shard.NVMe, shard.Host))
	b := r.mustOp(r.s.Fetch(k, shard.Host, shard.HBM))
	if err := b.Wait(); err != nil {
		t.Fatal(err)
	}
	if !a.Done() || a.Err() != nil {
		t.Fatalf("the first hop: done %v err %v", a.Done(), a.Err())
	}
	got, err := r.get(t, k, shard.HBM)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("HBM copy after chained moves: err %v, equal %v", err, bytes.Equal(got, data))
	}
}

// TestRegisterZeros: a fresh NVMe home reads as zeros without I/O; HBM and
// host homes are zeroed.
func TestRegisterZeros(t *testing.T) {
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB})
	for i, home := range []shard.Tier{shard.HBM, shard.Host, shard.NVMe} {
		k := shard.Key{Chunk: shard.ChunkID(i), State: shard.AdamM}
		if err := r.s.Register(k, Spec{Elems: 1000, DType: dtype.F32, Home: home}); err != nil {
			t.Fatal(err)
		}
		if home == shard.NVMe {
			r.mustWait(r.s.Fetch(k, shard.NVMe, shard.Host))
			home = shard.Host
		} else {
			// dirty the pool's memory for the next buffer of this size
			r.put(t, k, home, pattern(k, 3, 4000))
			if err := r.s.Unregister(k); err != nil {
				t.Fatal(err)
			}
			if err := r.s.Register(k, Spec{Elems: 1000, DType: dtype.F32, Home: home}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := r.get(t, k, home)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, make([]byte, 4000)) {
			t.Errorf("home %s: a fresh shard is not zero", home)
		}
	}
	if st := r.s.Stats(); st.Links[shard.NVMeToHost].Bytes != 0 {
		t.Errorf("reading a never-written NVMe home moved %d bytes", st.Links[shard.NVMeToHost].Bytes)
	}
}

// TestBudgetError: a placement that does not fit names the tier's users.
func TestBudgetError(t *testing.T) {
	r := newRig(t, rigConfig{devices: 2, hbmBudgetBytes: 64 * units.KiB, swapBytes: 4 * units.MiB})
	reg := func(c shard.ChunkID, rank int32, st shard.State, elems int, home shard.Tier) error {
		return r.s.Register(shard.Key{Chunk: c, Rank: rank, State: st}, Spec{Elems: elems, DType: dtype.F32, Home: home})
	}
	for _, err := range []error{
		reg(0, 0, shard.Param, 4096, shard.HBM), // 16 KiB
		reg(1, 0, shard.Param, 4096, shard.HBM),
		reg(1, 0, shard.Grad, 4096, shard.HBM),
		reg(2, 1, shard.Param, 8192, shard.HBM), // rank 1: its own budget
		reg(5, 0, shard.Master, 8192, shard.NVMe),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// rank 0 has 48 KiB in use; 32 KiB more does not fit.
	err := reg(3, 0, shard.Master, 8192, shard.HBM)
	var be *BudgetError
	if !errors.Is(err, ErrBudget) || !errors.As(err, &be) {
		t.Fatalf("want a budget error, got %v", err)
	}
	if be.Tier != shard.HBM || be.Device != 0 || be.InUseBytes != 48*units.KiB || be.RequestBytes != 32*units.KiB {
		t.Errorf("budget error fields: %+v", be)
	}
	if be.ByState[shard.Param] != 32*units.KiB || be.ByState[shard.Grad] != 16*units.KiB {
		t.Errorf("by state: %v", be.ByState)
	}
	if len(be.ByChunk) != 2 || be.ByChunk[0] != (ChunkUse{1, 32 * units.KiB}) || be.ByChunk[1] != (ChunkUse{0, 16 * units.KiB}) {
		t.Errorf("by chunk: %v", be.ByChunk)
	}
	for _, want := range []string{"hbm of device 0", "chunk 3 rank 0 master", "param 32.0 KiB", "grad 16.0 KiB", "chunk 1 32.0 KiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// A move that would exceed the budget is refused at Submit; nothing changes.
	k := shard.Key{Chunk: 5, State: shard.Master}
	before := r.s.Stats()
	if _, err := r.s.Submit(shard.Move{Key: k, From: shard.NVMe, To: shard.HBM, Reason: shard.Prefetch}); !errors.Is(err, ErrBudget) {
		t.Fatalf("move over the budget: %v", err)
	}
	if _, err := r.s.Submit(shard.Move{Key: k, To: shard.HBM, Reason: shard.Alloc}); !errors.Is(err, ErrBudget) {
		t.Fatalf("alloc over the budget: %v", err)
	}
	if after := r.s.Stats(); after.HBM[0] != before.HBM[0] || after.Host != before.Host {
		t.Errorf("refused moves changed the accounting: %+v -> %+v", before, after)
	}
	// The device's own accounting agrees, tagged as model state by state name.
	ms := r.devs[0].MemStats()
	if ms.InUseByPurpose["param"] != 32*units.KiB || ms.InUseByPurpose["grad"] != 16*units.KiB || ms.InUseByKind[0] != 48*units.KiB {
		t.Errorf("device accounting: %s", ms)
	}
}

// TestLeases: a leased copy is never dropped, evicted or overwritten; a
// move from a copy being written waits for the writer; Acquire waits for a
// move into the copy and counts the wait.
func TestLeases(t *testing.T) {
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB})
	k := shard.Key{Chunk: 1, State: shard.Param}
	if err := r.s.Register(k, Spec{Elems: 8192, DType: dtype.BF16, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	v1 := pattern(k, 1, 16384)
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, v1)
	r.mustWait(r.s.Fetch(k, shard.Host, shard.NVMe)) // host stays: clean now

	l, err := r.s.Acquire(k, shard.Host, shard.Read)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.s.Evict(k, shard.Host); !errors.Is(err, ErrLeased) {
		t.Errorf("evict of a leased copy: %v", err)
	}
	if _, err := r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}); !errors.Is(err, ErrLeased) {
		t.Errorf("write-back (drop) of a leased copy: %v", err)
	}
	if _, err := r.s.Submit(shard.Move{Key: k, From: shard.NVMe, To: shard.Host, Reason: shard.Prefetch}); err != nil {
		t.Errorf("prefetch into a copy that is already valid should be a no-op: %v", err)
	}
	if err := r.s.Unregister(k); !errors.Is(err, ErrLeased) {
		t.Errorf("unregister with a lease: %v", err)
	}
	l.Release()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a second Release did not panic")
			}
		}()
		l.Release()
	}()
}

func TestAcquireWaits(t *testing.T) {
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB})
	k := shard.Key{Chunk: 2, State: shard.Param}
	if err := r.s.Register(k, Spec{Elems: 8192, DType: dtype.BF16, Home: shard.Host}); err != nil {
		t.Fatal(err)
	}
	v1, v2 := pattern(k, 1, 16384), pattern(k, 2, 16384)
	r.put(t, k, shard.Host, v1)

	// A writer holds the host copy: the upload is deferred until it is done.
	w, err := r.s.Acquire(k, shard.Host, shard.Write)
	if err != nil {
		t.Fatal(err)
	}
	op := r.mustOp(r.s.Fetch(k, shard.Host, shard.HBM))
	got := make(chan []byte)
	go func() {
		b, err := r.get(t, k, shard.HBM) // waits for the upload
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	for {
		r.s.mu.Lock()
		n := r.s.waiting
		r.s.mu.Unlock()
		if n == 1 {
			break
		}
		runtime.Gosched()
	}
	if op.Done() {
		t.Fatal("the upload ran while its source was leased for writing")
	}
	copy(w.Bytes(), v2)
	w.Release()
	if b := <-got; !bytes.Equal(b, v2) {
		t.Error("the HBM copy does not hold what the writer wrote")
	}
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
	st := r.s.Stats()
	if st.Waits[shard.HBM] != 1 || st.Waited[shard.HBM] <= 0 {
		t.Errorf("waits %v waited %v", st.Waits, st.Waited)
	}
	// The HBM copy is valid (written after the write lease); after a new
	// write to host it is stale and a Read lease refuses it.
	r.put(t, k, shard.Host, v1)
	if _, err := r.s.Acquire(k, shard.HBM, shard.Read); !errors.Is(err, ErrNotResident) || !strings.Contains(err.Error(), "stale") {
		t.Errorf("read of a stale copy: %v", err)
	}
	if _, err := r.s.Acquire(k, shard.NVMe, shard.Read); !errors.Is(err, ErrBadMove) {
		t.Errorf("acquire in nvme: %v", err)
	}
}

// TestDirtyWriteBack: evicting the only valid copy writes it back home
// first; evicting a clean copy just drops it.
func TestDirtyWriteBack(t *testing.T) {
	completions := make(chan shard.Move, 16)
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB, onComplete: func(m shard.Move, err error) {
		completions <- m
	}})
	k := shard.Key{Chunk: 4, Rank: 0, State: shard.AdamV}
	if err := r.s.Register(k, Spec{Elems: 30000, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	data := pattern(k, 9, 120000)
	r.mustWait(r.s.Fetch(k, shard.NVMe, shard.HBM)) // through staging; zeros
	r.put(t, k, shard.HBM, data)
	res, _ := r.s.Where(k)
	if !res.Dirty || !res.Copies[shard.HBM].Valid || res.Copies[shard.NVMe].Valid {
		t.Fatalf("after a write in HBM: %+v", res)
	}
	op := r.mustOp(r.s.Evict(k, shard.HBM))
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
	res, _ = r.s.Where(k)
	if res.Dirty || res.Copies[shard.HBM].Present || !res.Copies[shard.NVMe].Valid {
		t.Fatalf("after evicting the dirty copy: %+v", res)
	}
	st := r.s.Stats()
	if st.Links[shard.HBMToHost].Bytes != 120000 || st.Links[shard.HostToNVMe].Bytes != units.AlignUp(120000, r.swap.Alignment()) {
		t.Errorf("write-back bytes: %s", st)
	}
	r.mustWait(r.s.Fetch(k, shard.NVMe, shard.Host))
	if got, err := r.get(t, k, shard.Host); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("data after write-back and fetch: err %v", err)
	}
	clean := r.mustOp(r.s.Evict(k, shard.Host))
	if !clean.Done() || clean.Err() != nil {
		t.Errorf("a clean evict should complete at once")
	}
	if after := r.s.Stats(); after.Links[shard.HostToNVMe] != st.Links[shard.HostToNVMe] {
		t.Errorf("a clean evict wrote to NVMe")
	}
	if _, err := r.s.Evict(k, shard.NVMe); !errors.Is(err, ErrBadMove) {
		t.Errorf("evicting the home: %v", err)
	}
	// async moves: the first fetch, the evict-with-write-back, the second
	// fetch. OnComplete may run after Wait returned, and callbacks from
	// different moves in any order: take the three (the test's timeout
	// bounds a missing one), then check no fourth came.
	var done []shard.Move
	evicts := 0
	for range 3 {
		m := <-completions
		done = append(done, m)
		if m.Reason == shard.Evict {
			evicts++
		}
	}
	if len(completions) != 0 || evicts != 1 {
		t.Errorf("completions: %v and %d more", done, len(completions))
	}
}

func faultRig(t *testing.T, f nvme.Fault) (*rig, shard.Key, []byte) {
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB, faults: []nvme.Fault{f}})
	k := shard.Key{Chunk: 3, Rank: 0, State: shard.Master}
	if err := r.s.Register(k, Spec{Elems: 25000, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	data := pattern(k, 5, 100000)
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, data)
	r.mustWait(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}))
	return r, k, data
}

func checkNamed(t *testing.T, err error, k shard.Key, paths []string) {
	t.Helper()
	var me *MoveError
	if !errors.As(err, &me) || me.Move.Key != k {
		t.Errorf("error %v is not a *MoveError for %s", err, k)
	}
	msg := err.Error()
	t.Log(msg)
	checkOnce(t, err)
	if !strings.Contains(msg, k.String()) || !strings.Contains(msg, "offset") {
		t.Errorf("error %q does not name the shard %q and the offset", msg, k)
	}
	named := false
	for _, p := range paths {
		named = named || strings.Contains(msg, p)
	}
	if !named {
		t.Errorf("error %q names no swap file (%v)", msg, paths)
	}
}

// TestFaultEIO: a read error fails the move with an error naming the shard,
// file and offset; the shard stays where it was and a retry succeeds.
func TestFaultEIO(t *testing.T) {
	r, k, data := faultRig(t, nvme.Fault{Kind: nvme.FaultEIO, Op: nvme.OpRead, Nth: 1})
	err := r.mustOp(r.s.Fetch(k, shard.NVMe, shard.Host)).Wait()
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("want EIO, got %v", err)
	}
	var ioe *nvme.IOError
	if !errors.As(err, &ioe) {
		t.Fatalf("no *nvme.IOError in %v", err)
	}
	checkNamed(t, err, k, r.paths)
	res, _ := r.s.Where(k)
	if res.Copies[shard.Host].Present || !res.Copies[shard.NVMe].Valid || res.Lost != nil {
		t.Fatalf("after EIO: %+v", res)
	}
	_, err = r.s.Acquire(k, shard.Host, shard.Read)
	if !errors.Is(err, ErrNotResident) || !errors.Is(err, syscall.EIO) {
		t.Errorf("acquire after the failed fetch: %v", err)
	}
	checkOnce(t, err)
	if st := r.s.Stats(); st.Failed != 1 || st.Host.InUseBytes != 0 {
		t.Errorf("after EIO: %s", st)
	}
	r.mustWait(r.s.Fetch(k, shard.NVMe, shard.Host))
	if got, err := r.get(t, k, shard.Host); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("retry: err %v", err)
	}
}

// TestFaultFlipByte: a flipped byte on read is a checksum error naming the
// shard and file; the NVMe copy is marked lost and nothing reads it again —
// no zeros, no stale data.
func TestFaultFlipByte(t *testing.T) {
	for _, op := range []nvme.Op{nvme.OpRead, nvme.OpWrite} {
		t.Run(op.String(), func(t *testing.T) {
			r, k, _ := faultRig(t, nvme.Fault{Kind: nvme.FaultFlipByte, Op: op, Nth: 1})
			err := r.mustOp(r.s.Fetch(k, shard.NVMe, shard.HBM)).Wait()
			var ce *nvme.CorruptionError
			if !errors.Is(err, nvme.ErrCorrupt) || !errors.As(err, &ce) {
				t.Fatalf("want a checksum error, got %v", err)
			}
			checkNamed(t, err, k, r.paths)
			res, _ := r.s.Where(k)
			if res.Copies[shard.HBM].Present || res.Copies[shard.NVMe].Valid || !errors.Is(res.Lost, ErrLost) || !errors.Is(res.Lost, nvme.ErrCorrupt) {
				t.Fatalf("after corruption: %+v", res)
			}
			checkOnce(t, res.Lost)
			_, err = r.s.Fetch(k, shard.NVMe, shard.Host)
			if !errors.Is(err, ErrLost) {
				t.Errorf("fetch of a lost copy: %v", err)
			}
			checkOnce(t, err)
			if _, err := r.s.Acquire(k, shard.HBM, shard.Read); !errors.Is(err, ErrNotResident) {
				t.Errorf("acquire after the failed move: %v", err)
			}
			if st := r.s.Stats(); st.Host.InUseBytes != 0 || st.HBM[0].InUseBytes != 0 {
				t.Errorf("staging or destination not released: %s", st)
			}
		})
	}
}

// TestWriteFault: a failed write-back leaves the source copy in place; the
// home copy holds no valid data until a write-back succeeds.
func TestWriteFault(t *testing.T) {
	r := newRig(t, rigConfig{swapBytes: 4 * units.MiB, faults: []nvme.Fault{{Kind: nvme.FaultEIO, Op: nvme.OpWrite, Nth: 1}}})
	k := shard.Key{Chunk: 9, State: shard.AdamM}
	if err := r.s.Register(k, Spec{Elems: 40000, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		t.Fatal(err)
	}
	data := pattern(k, 11, 160000)
	r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
	r.put(t, k, shard.Host, data)
	err := r.mustOp(r.s.Evict(k, shard.Host)).Wait()
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("want EIO, got %v", err)
	}
	checkNamed(t, err, k, r.paths)
	res, _ := r.s.Where(k)
	if !res.Copies[shard.Host].Valid || res.Copies[shard.NVMe].Valid || !res.Dirty || res.Lost != nil {
		t.Fatalf("after a failed write-back: %+v", res)
	}
	r.mustWait(r.s.Evict(k, shard.Host))
	r.mustWait(r.s.Fetch(k, shard.NVMe, shard.Host))
	if got, err := r.get(t, k, shard.Host); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after the retried write-back: %v", err)
	}
}

// TestClose: moves in flight at Close finish (or are cancelled with
// ErrClosed), nothing leaks, leased copies are named.
func TestClose(t *testing.T) {
	checkLeaks(t)
	r := newRig(t, rigConfig{devices: 2, swapBytes: 8 * units.MiB})
	var ops []*Op
	for i := range 16 {
		k := shard.Key{Chunk: shard.ChunkID(i), Rank: int32(i % 2), State: shard.Param}
		if err := r.s.Register(k, Spec{Elems: 20000, DType: dtype.BF16, Home: shard.Host}); err != nil {
			t.Fatal(err)
		}
		r.put(t, k, shard.Host, pattern(k, 1, 40000))
		ops = append(ops, r.mustOp(r.s.Fetch(k, shard.Host, shard.NVMe)), r.mustOp(r.s.Fetch(k, shard.Host, shard.HBM)))
	}
	k0 := shard.Key{Chunk: 0, State: shard.Param}
	l, err := r.s.Acquire(k0, shard.Host, shard.Read)
	if err != nil {
		t.Fatal(err)
	}
	err = r.s.Close()
	if err == nil || !strings.Contains(err.Error(), "chunk 0 rank 0 param in host (1)") {
		t.Errorf("close with a lease: %v", err)
	}
	for _, op := range ops {
		if !op.Done() {
			t.Fatal("Close returned with a move in flight")
		}
		if err := op.Err(); err != nil && !errors.Is(err, ErrClosed) {
			t.Error(err)
		}
	}
	if _, err := r.s.Fetch(k0, shard.Host, shard.HBM); !errors.Is(err, ErrClosed) {
		t.Errorf("submit after close: %v", err)
	}
	st := r.s.Stats()
	if st.HBM[0].InUseBytes != 0 || st.NVMe.InUseBytes != 0 || st.Host.InUseBytes != r.s.entries[k0].charge[shard.Host] {
		t.Errorf("after close, with one host copy leased: %s", st)
	}
	if len(l.Bytes()) != 40000 {
		t.Error("the leased copy's memory is gone")
	}
	l.Release() // frees it: the pool closes clean
	if st := r.s.Stats(); st.Host.InUseBytes != 0 || st.Shards != 0 {
		t.Errorf("after the last release: %s", st)
	}
	if r.devs[0].MemStats().InUseBytes != 0 || r.devs[1].MemStats().InUseBytes != 0 {
		t.Errorf("device memory left: %s", r.devs[0].MemStats())
	}
}
