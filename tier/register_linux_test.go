package tier

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/nvme"
	"github.com/strata-ai/strata/nvme/nvmetest"
	"github.com/strata-ai/strata/pinned"
	"github.com/strata-ai/strata/shard"
)

// TestStoreFixedIO: the store registers its pinned arenas and swap files
// with the io_uring engine, its swap I/O then goes out as READ_FIXED /
// WRITE_FIXED on fixed files (the engine's counters), round trips stay
// bit-exact, and Close unregisters both.
func TestStoreFixedIO(t *testing.T) {
	const size = 256 * units.KiB
	r := newRig(t, rigConfig{poolBytes: 4 * size, swapBytes: 8 * size, stripeBytes: 64 * units.KiB})
	if info := r.eng.Info(); info.Engine != nvme.EngineUring {
		t.Skipf("io_uring not available here (%s): nothing registers", info.FallbackReason)
	}
	reg := r.s.Registration()
	if reg.Buffers != len(r.pool.Arenas()) || reg.Files != len(r.paths) || reg.Note != "" {
		t.Fatalf("registration %+v, want %d arenas and %d files, no note", reg, len(r.pool.Arenas()), len(r.paths))
	}
	if info := r.eng.Info(); info.RegisteredBuffers != reg.Buffers || info.RegisteredFiles != reg.Files {
		t.Fatalf("engine has %d buffers and %d files registered, store says %+v", info.RegisteredBuffers, info.RegisteredFiles, reg)
	}
	before := r.eng.Stats()
	for i := range 3 {
		k := shard.Key{Chunk: shard.ChunkID(i), State: shard.Master}
		if err := r.s.Register(k, Spec{Elems: int(size / 4), DType: dtype.F32, Home: shard.NVMe}); err != nil {
			t.Fatal(err)
		}
		r.mustOp(r.s.Submit(shard.Move{Key: k, To: shard.Host, Reason: shard.Alloc}))
		want := pattern(k, 7, size)
		r.put(t, k, shard.Host, want)
		mustWait(t, r.mustOp(r.s.Submit(shard.Move{Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack})))
		mustWait(t, r.mustOp(r.s.Submit(shard.Move{Key: k, From: shard.NVMe, To: shard.Host, Reason: shard.Prefetch})))
		got, err := r.get(t, k, shard.Host)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs after a round trip through fixed buffers", k)
		}
	}
	st := r.eng.Stats()
	n := st.Requests - before.Requests
	if st.BytesRead == before.BytesRead {
		t.Fatal("no bytes read from the swap: the round trip did not reach NVMe")
	}
	if n == 0 || st.FixedBuffers-before.FixedBuffers != n || st.FixedFiles-before.FixedFiles != n {
		t.Fatalf("%d requests, %d with a fixed buffer, %d with a fixed file: want all", n, st.FixedBuffers-before.FixedBuffers, st.FixedFiles-before.FixedFiles)
	}
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
	if info := r.eng.Info(); info.RegisteredBuffers != 0 || info.RegisteredFiles != 0 {
		t.Fatalf("after Close the engine still has %d buffers and %d files registered", info.RegisteredBuffers, info.RegisteredFiles)
	}
}

func mustWait(t *testing.T, op *Op) {
	t.Helper()
	if err := op.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestStoreFixedIOFallback: as an ordinary user (no CAP_IPC_LOCK,
// RLIMIT_MEMLOCK 8 MiB) the 32 MiB of arenas cannot be registered: the store
// still opens, says why in Registration().Note, registers the files, and
// moves data through plain buffers.
func TestStoreFixedIOFallback(t *testing.T) {
	dir := nvmetest.Dir(t)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		t.Fatal(err)
	}
	lowered := rl
	lowered.Cur = uint64(8 * units.MiB)
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lowered); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			t.Error(err)
			return
		}
		data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			t.Errorf("drop CAP_IPC_LOCK: %v", err)
			return
		}
		if err := fallbackStore(dir); err != "" {
			t.Error(err)
		}
	}()
	<-done
}

// fallbackStore opens an engine (its ring made without CAP_IPC_LOCK), a
// pool, a swap and a store, checks the note and a round trip, and closes
// them; it returns what went wrong.
func fallbackStore(dir string) string {
	eng, err := nvme.Open(nvme.Options{QueueDepth: 8})
	if err != nil {
		return err.Error()
	}
	defer eng.Close()
	if info := eng.Info(); info.Engine != nvme.EngineUring {
		return "" // nothing registers under pread workers (TestStoreFixedIO says so)
	}
	pool, err := pinned.New(pinned.Options{BudgetBytes: 32 * units.MiB})
	if err != nil {
		return err.Error()
	}
	defer pool.Close()
	swap, err := nvme.NewSwap(eng, nvme.SwapOptions{Paths: []string{dir}, SizeBytes: 4 * units.MiB, StripeBytes: 64 * units.KiB})
	if err != nil {
		return err.Error()
	}
	defer swap.Close()
	s, err := New(Options{Host: pool, Swap: swap, FixedIO: eng})
	if err != nil {
		return err.Error()
	}
	defer s.Close()
	reg := s.Registration()
	if reg.Buffers != 0 || reg.Files != 1 || !strings.Contains(reg.Note, "fixed buffers off") || !strings.Contains(reg.Note, "RLIMIT_MEMLOCK") {
		return "registration without CAP_IPC_LOCK: " + strings.ReplaceAll(reg.Note, "\n", " ") + ", want fixed buffers off naming RLIMIT_MEMLOCK, files on"
	}
	k := shard.Key{State: shard.Master}
	if err := s.Register(k, Spec{Elems: 1 << 16, DType: dtype.F32, Home: shard.NVMe}); err != nil {
		return err.Error()
	}
	for i, m := range []shard.Move{{Key: k, To: shard.Host, Reason: shard.Alloc}, {Key: k, From: shard.Host, To: shard.NVMe, Reason: shard.WriteBack}, {Key: k, From: shard.NVMe, To: shard.Host, Reason: shard.Prefetch}} {
		if i == 1 { // the reserved copy written once
			l, err := s.Acquire(k, shard.Host, shard.Write)
			if err != nil {
				return err.Error()
			}
			l.Release()
		}
		op, err := s.Submit(m)
		if err == nil {
			err = op.Wait()
		}
		if err != nil {
			return err.Error()
		}
	}
	if st := eng.Stats(); st.FixedBuffers != 0 || st.FixedFiles == 0 {
		return "fallback used fixed buffers or no fixed files"
	}
	return ""
}
