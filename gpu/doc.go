// Package gpu defines the interfaces every accelerator backend implements.
//
// They are Device (memory against a byte budget, streams, events, copies),
// Ops (the kernels of a GPT-2 or Llama-family training step and an Adam
// step: flash attention with grouped-query heads and packed examples (and,
// for generation, attention against a key/value cache), LayerNorm and
// RMSNorm, rotary embeddings, GELU and SwiGLU, embedding, cross-entropy with
// ignored targets, GEMM) and Comm (collectives across the devices of one
// box), and the checked front end both backends share.
//
// The interfaces are those a CUDA device can honour: all work is enqueued on
// streams and completes asynchronously; events order streams against each
// other; copies between host and device are explicit. Backends: gpu/cpu
// (real math in Go, runs everywhere, the reference) and gpu/cuda (NVIDIA
// GPUs through the driver API, NVRTC and cuBLAS). gpu/gputest is the
// conformance suite both pass, including the refusal of every bad argument.
//
// # The checked front end
//
// A backend makes one Front per device (NewFront). The Front holds the
// device's Budget and link counters (reported through Ledger, which the
// backend's Device embeds) and checks every argument against the contracts
// written on the interfaces before the backend sees it:
//
//   - Device: Alloc's size and kind and the budget charge (Front.Alloc,
//     Refund, Release, OutOfMemory), Free's buffer (not foreign, not on
//     another device, not a view, not freed twice), copies' streams,
//     buffers and byte ranges (CopyIn, CopyOut, CopyAcross), Slice's range
//     (Extent.Sub).
//   - Ops: CheckedOps wraps the backend's Kernels: dimensions, dtypes,
//     lengths, the device of every buffer and stream, and Adam's
//     hyper-parameters (AdamParams.Validate; a rejected set is an error on
//     the stream, through Kernels.Fail) are checked, then the backend's
//     kernel runs with its own stream and buffer types.
//   - Comm: CheckedComm checks each call (shapes, reducible dtypes, op,
//     root), numbers it (the n-th call of every rank belongs to round n)
//     and hands it to the backend's Issuer. Rounds is the round
//     bookkeeping: it gathers the ranks' calls of a round, checks that they
//     agree (kind, dtype, length, op, root) and gives the complete round to
//     the rank that completed it. RingBytes is the collective link count.
//
// Backends' buffers embed an Extent (device, allocation accounting, dtype,
// elements, view) and their streams say their device (Queue), which is all
// the front end reads (BufferOf, StreamOf resolve an interface value to the
// backend's type, or panic). A broken contract panics when the call is
// made, with the backend's name ("gpu/cpu: gemm c has 63 elements, want
// 64"), and enqueues nothing; operating errors (out of memory, bad token
// ids, calls that disagree) are returned or reported by Synchronize.
//
// Lifecycle: a backend constructor returns the devices and one Comm per
// device. Buffers from Device.Alloc are released with Device.Free after the
// streams that use them have completed. Memory is accounted per Tag (kind and
// purpose); MemStats and OutOfMemoryError say who uses what. AdamParams is
// internal/adam's Params, the type cpuadam takes too.
//
// Counters: besides the link counters, each device counts the calls that
// take memory from its driver or give it back (DriverCounters: gpu/cuda's
// cuMemAlloc, cuMemFree, cuMemAllocAsync, cuMemFreeAsync; gpu/cpu's
// allocations behind Alloc and its collectives' scratch), so that a
// training loop can check that its steps take none; a Comm of CheckedComm
// is a ScratchReserver, which lets the loop have the backend take its
// collectives' scratch ahead. A backend's HostRegistry records the host
// memory registered with it (a pinned.Registrar; gpu/cuda page-locks it
// too): the link counters count the bytes of copies of other host memory
// as pageable (LinkCounters.HostToDevicePageable, DeviceToHostPageable).
package gpu
