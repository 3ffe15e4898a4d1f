// Package nvme moves bytes between host buffers and files on NVMe drives.
//
// It moves them between caller-owned host buffers and files, with
// O_DIRECT, and keeps swap space on those drives.
//
// What it owns:
//
//   - Engine: the request engine. Requests are submitted in batches and
//     completed one by one, each keyed by a slot index in a fixed table of
//     QueueDepth slots (a full table blocks Submit: back-pressure). The
//     io_uring backend hands the kernel at most Options.SubmitBatch SQEs
//     per io_uring_enter, by default one, so that each request reaches the
//     block layer as the caller sized it: io_uring plugs a submission of
//     several SQEs and the block layer merges adjacent requests in the plug
//     up to max_sectors_kb, which leaves fewer requests in flight (on a
//     virtio disk 0.79-0.89x fio, bench/README-nvme.md). Stats.Enters and
//     Stats.SQEs count what went to the kernel. The io_uring
//     backend (nvme/internal/uring) is the default; a pool of pread/pwrite
//     workers (one per slot, at most 64) serves the same API when io_uring
//     cannot be set up (seccomp, kernel.io_uring_disabled, an old kernel), and
//     Info says which backend runs and why. Short transfers are resubmitted for the rest, EINTR and EAGAIN
//     are retried, and every other failure completes the request with an
//     *IOError naming the file, offset and length. An io_uring_enter that
//     fails transiently (EINTR, EAGAIN, EBUSY, ENOMEM) is tried again,
//     backing off without holding the submission lock so the reaper can
//     drain the completion queue (the reaper sleeps on an eventfd the ring
//     signals, in Go's poller, not in io_uring_enter: a goroutine blocked
//     in a system call holds its scheduler P until the runtime takes it
//     back, and the compute of the same process lost a core meanwhile);
//     after 10 s without progress the requests it would not take are
//     withdrawn from the SQ and fail with an *IOError
//     (nothing panics, nothing is submitted later behind the caller's back).
//   - File: a file opened with O_DIRECT, with the alignment the kernel reports
//     (statx STATX_DIOALIGN, else the device's logical block size). Misaligned
//     buffers, offsets and lengths are refused with ErrMisaligned before
//     anything reaches the kernel.
//   - Swap: preallocated files on one or more paths, an extent allocator, large
//     extents striped across the paths, and a CRC-32C per stripe unit of every
//     extent, verified on read (a mismatch is a *CorruptionError). Each Swap
//     has files of its own ("strata-<pid>-<random>.swap"), held under an
//     exclusive flock until Close removes them, so runs sharing a path never
//     share a file; paths are compared resolved (ResolvePath). The files of
//     a killed run stay until removed: StaleSwapFiles lists those no live
//     run holds (their lock is free), RemoveStaleSwapFiles removes them (the
//     engine does at start-up). CheckSwapSpace is NewSwap's space check,
//     creating nothing: short of space, it names the path, the need, the
//     free space and what stale files hold there (reclaimable).
//   - Faulty: a Device wrapper that injects EIO, short reads and writes,
//     ENOSPC and flipped bytes, for tests of everything above it.
//
// Device is the small interface that Engine and Faulty implement; the tier
// store and tests take a Device.
//
// Lifecycle: Open an Engine, OpenFile the files (or NewSwap over the
// engine), optionally RegisterBuffers and RegisterFiles while nothing is in
// flight, Submit requests, Close the files and then the engine. Close waits
// for requests in flight.
//
// Memory rules: buffers belong to the caller. From Submit until the request's
// completion (Done called, Completion released) the buffer is the kernel's and
// must not be touched, freed or returned to a pool; production buffers come
// from pinned (page-aligned, outside the Go heap). The engine allocates nothing
// per request on the io_uring path: a Request is the caller's, the slot table
// is fixed, user_data is a slot index, never a pointer.
package nvme
