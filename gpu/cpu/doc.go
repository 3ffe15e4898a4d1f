// Package cpu is the reference gpu backend, in Go, for any host.
//
// Its N in-process devices' "HBM" is host memory behind a per-device byte
// budget, their streams are goroutines and their kernels are Go. It runs
// everywhere (CI included) and defines the numbers other backends are
// compared with. With Options.Net the devices of several processes are one
// communicator, the collectives exchanged through the processes' MPI and
// computed in global rank order (comm_net.go): a job of P processes × L
// devices gives one process of P·L devices' bits.
//
// Front end: every Device, Ops and Comm call goes through package gpu's
// checked front end (gpu.Front, gpu.CheckedOps, gpu.CheckedComm,
// gpu.Rounds), as gpu/cuda's do, so both refuse the same calls; this
// package implements what follows the checks (kernels, comm).
//
// Lifecycle: New returns the devices and one Comm per device. Nothing needs
// closing: a stream starts a goroutine when work arrives and the goroutine
// exits when the queue is empty. Buffers from Alloc are freed with Free once
// the streams that use them have been synchronized.
//
// Memory: Alloc takes zeroed Go memory, 64-byte aligned, accounted in
// multiples of 64 bytes against Options.HBMBytes per Tag (kind and
// purpose), with peaks; a request that does not fit returns
// *gpu.OutOfMemoryError. Buffers are typed views (unsafe.Slice) of that
// memory. Freed memory is returned to the Go heap. The kernels'
// temporaries (widened rows, GEMM panels, attention tiles) are not device
// memory: each device keeps them from call to call (pool.go), so that a
// training step after the first allocates next to nothing on the Go heap.
//
// Streams and events: each stream runs its queue in order on one goroutine.
// Record enqueues the closing of a channel; Wait enqueues a receive from the
// channel of the latest Record, so streams of any device can wait on each
// other. An op that finds bad runtime data (a token id out of range,
// collective calls that disagree, Adam hyper-parameters gpu.AdamParams
// rejects) returns an error that the next Synchronize of its stream
// reports; a broken contract (wrong length, dtype, device) panics when
// the op is enqueued, in the front end.
//
// Numerics: fp32 arithmetic, bf16 storage widened exactly and rounded once
// (nearest even) on store. Row reductions and transcendentals are evaluated
// in float64 and rounded to fp32. Heavy ops are split over Options.Workers
// goroutines, but every output element is computed by one goroutine in a
// fixed order, so results are bit-identical run to run and for any worker
// count: GEMM cuts C into fixed tiles (the packed AVX-512 kernel: 384×512
// tiles, k in blocks of 256, 6×32 FMA register blocks; the gonum kernel:
// 64×128 tiles, each a serial Sgemm over the whole k); column sums (bias
// and the norms' parameter gradients) add the rows of each block of
// gpu.ColumnBlockRows, then the blocks, as gpu/cuda's kernels do;
// embedding gradients add rows in order; collectives add in rank order
// (see comm.go).
//
// Attention (attention.go) is the flash-attention algorithm on fp32 tiles
// of 128 queries × 128 keys, each product the device's GEMM kernel run on
// panels packed once per head (attn_packed.go: K, V, Q and dO packed once,
// only P and dS per product; the gonum kernel goes through sgemm), the
// exponentials from attnExp (attn_exp.go: float64, within 4e-15 of
// math.Exp), with gpu.AttnOptions' scale, soft cap and sliding window (the
// key tiles outside a window are skipped: O(seq·window)): the
// forward runs per (batch, query head) with an online softmax (running
// maximum, float64 running sum) and stores out and the row log-sum-exp;
// the backward (FlashAttention-2) runs per (batch, key/value head), which
// owns that head's dK and dV and adds its query heads' contributions in
// head order, recomputing the probabilities from the log-sum-exp. Nothing
// of size seq×seq is allocated (a test bounds the scratch).
// AttentionCached (attention_cached.go) appends the new tokens' keys and
// values to the caches and runs the same forward tiles over the cache,
// query row i seeing cache rows up to start+i (with start 0, the bits of
// AttentionForward on one row). RMSNorm,
// rotary embeddings (gpu.Rope: cos and sin from float64, times its scale,
// over its rotated dims) and the gated MLP (SwiGLU, GeGLU) are in
// ops_llama.go. AdamStep calls
// cpuadam with the same gpu.AdamParams value (internal/adam's Params), so
// device and host optimizers give identical bits; cpu_test checks it
// against a float64 transcription of PyTorch's AdamW.
//
// GEMM kernels (Options.Kernel): "avx512", a packed kernel in Go assembly
// (sgemm_amd64.s, about 10× gonum here; packing widens bf16 and resolves
// transposes), is the default where the CPU has AVX-512F and the build
// lacks the noasm and purego tags; "gonum" (gonum.org/v1/gonum/blas/gonum
// Sgemm) is the fallback. The two agree within fp32 rounding, not bit for
// bit (the packed kernel fuses multiply-adds and blocks k).
//
// Counters: bytes moved host→device, device→host, between devices (counted
// on the device whose stream runs the copy) and by collectives (the bytes a
// ring algorithm would send from the rank).
package cpu
