// Package pinned owns Strata's pinned host memory: the buffers that the GPU
// copies from asynchronously and that NVMe reads and writes land in.
//
// # What it owns
//
// New first checks that the host can give the budget (CheckHost): above
// MemAvailable (/proc/meminfo) it is refused with a *HostError before
// anything is mapped, as is a pool that must be locked (LockRequired)
// above RLIMIT_MEMLOCK in a process without CAP_IPC_LOCK.
//
// A Pool maps its whole byte budget at New as a few arenas (anonymous,
// private mmap outside the Go heap; at most 1 GiB each by default, io_uring's
// limit for one fixed buffer), aligned to 2 MiB and advised with
// MADV_HUGEPAGE, faults every page in once (madvise(MADV_POPULATE_WRITE): a
// first touch of fresh memory runs at 1-3 GB/s here, a write to memory
// already faulted in about 3x faster; bench/README-pinned.md),
// and locks them with mlock when the kernel allows. When it does not (an
// ordinary user past RLIMIT_MEMLOCK, without CAP_IPC_LOCK), the pool goes on
// unlocked and Residency says so and how to fix it; LockRequired makes that
// an error instead. Consumers that must register host memory (the CUDA
// backend with cuMemHostRegister, the io_uring engine with fixed buffers)
// implement Registrar and are told about every arena once.
//
// # Size classes and the budget
//
// A buffer costs its size rounded up to AlignBytes (4096 by default), never
// a power of two: Strata's buffers are few and large (a layer's shard, an
// NVMe chunk), where power-of-two rounding would waste up to half the
// budget. Each padded size is its own class: Put keeps the buffer in its
// class for the next Get of that size (LIFO, so the memory reused is the
// most recently touched); a size with no cached buffer is carved best-fit
// from the arenas' free extents; if that fails, every cached buffer is given
// back to the arenas (coalescing neighbours) and the carve is tried again.
// Only then does Get fail, with a *BudgetError that lists what uses how much
// by purpose and says whether the free memory is merely fragmented. Check
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
