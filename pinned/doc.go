// Package pinned owns Strata's pinned host memory.
//
// Those are the buffers that the GPU copies from asynchronously and that
// NVMe reads and writes land in.
//
// # What it owns
//
// New first checks that the host can give the budget (CheckHost): above
// MemAvailable (/proc/meminfo) it is refused with a *HostError before
// anything is mapped, as is a pool that must be locked (LockRequired)
// above RLIMIT_MEMLOCK in a process without CAP_IPC_LOCK.
//
// A Pool maps its whole byte budget at New as one mapping (anonymous,
// private mmap outside the Go heap), aligned to 2 MiB and advised with
// MADV_HUGEPAGE, cut into arenas (at most 1 GiB each by default, io_uring's
// limit for one fixed buffer), faults every page in once (madvise(MADV_POPULATE_WRITE): a
// first touch of fresh memory runs at 1-3 GB/s here, a write to memory
// already faulted in about 3x faster; bench/README-pinned.md),
// and locks them with mlock when the kernel allows. When it does not (an
// ordinary user past RLIMIT_MEMLOCK, without CAP_IPC_LOCK), the pool goes on
// unlocked and Residency says so and how to fix it; LockRequired makes that
// an error instead. Consumers that must register host memory (the CUDA
// backend with cuMemHostRegister, the io_uring engine with fixed buffers)
// implement Registrar and are told about every arena once. The arenas are
// the unit of registration, population and locking only: a buffer is
// carved from the whole mapping and may span two arenas (io_uring then
// reads into it without the fixed-buffer path; gpu.HostRegistry counts it
// as registered, and the CUDA backend copies it a piece per arena).
//
// # The budget and fragmentation
//
// A buffer costs its size rounded up to AlignBytes (4096 by default), never
// a power of two: Strata's buffers are few and large (a layer's shard, an
// NVMe chunk), where power-of-two rounding would waste up to half the
// budget. Get carves best-fit (the smallest free extent that holds the
// request, the lowest of equals) from the mapping's free extents; Put gives
// the memory back at once, merged with its free neighbours. Get fails only
// when no free extent holds the request, with a *BudgetError that lists
// what uses how much by purpose and says whether the free memory is merely
// fragmented. Why one mapping and no size-class cache: shards of a few
// hundred MiB against 1 GiB arenas left up to half of each arena unusable
// at its end (gpt-5b with int8 moments stopped with 3.08 GiB of a 10 GiB
// pool free in runs of at most 350 MiB); the store's recorded sequence of
// Gets and Puts (testdata, TestReplayGPT5B) fits 10 GiB from one mapping,
// and with immediate coalescing needs less room than with buffers cached
// by size (about 9.4 GiB against 9.8, for a peak of 7.5 GiB in use). Best
// fit still leaves runs too short for a large shard now and then (gpt-5b
// with int8 moments again: 3.07 GiB free, no run of the 469 MiB a master
// needed). GetRelocating is the way out for an owner that can say which of
// its buffers are idle: it moves the fewest bytes of them into the free
// memory around a run (copies within the mapping, under the pool's lock)
// and carves the request there; the tier store uses it for every host copy
// and staging buffer. Check
// answers at start-up whether a list of (purpose, size, count) requirements
// fits, listing what needs how much.
//
// # Lifecycle
//
//	p, err := pinned.New(pinned.Options{BudgetBytes: 8 << 30})
//	p.AddRegistrar(r)           // optional, once per consumer
//	b, err := p.Get(n, "nvme read")
//	b.Lease()                   // before handing b.Bytes() to I/O or DMA
//	b.Release()                 // from the completion
//	p.Put(b)                    // after the last Release
//	p.Close()                   // Unregister, munlock, munmap
//
// # Memory rules
//
// Buffers are page-aligned and never move. Bytes must not be used after Put
// or Close. A buffer handed to the kernel or a device stays leased until the
// transfer completes: Put with a lease outstanding, a double Put, a Release
// without a Lease, and Close with a buffer still leased are broken contracts
// and panic with "pinned:". Close with buffers still held (not leased)
// unmaps anyway and returns an error naming them. All Pool and Buffer
// methods are safe for concurrent use; Registrar methods are called with
// the pool's lock held and must not call back into it. Outside Linux the
// arenas are plain Go memory, unlocked (Residency says so).
package pinned
