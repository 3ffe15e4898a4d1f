// Package cuda is the gpu backend for NVIDIA GPUs. It loads the CUDA
// libraries at run time with purego (github.com/ebitengine/purego), so it
// builds and runs with CGO_ENABLED=0 and builds on machines without a GPU;
// New returns an error wrapping ErrNoDriver there.
//
// What it owns: the driver API calls (contexts, memory, copies, streams,
// events, modules, launches), the kernels of gpu.Ops as CUDA C
// (kernels.cu, embedded in the binary and compiled by NVRTC), GEMM through
// cuBLASLt (bf16 operands, tensor cores, fp32 accumulation; cublaslt.go) or
// cuBLAS (cublasGemmEx, everything else and the fallback), and collectives over the devices of the process.
//
// Library search (lib.go), for libcuda.so.1, libnvrtc.so.13/12,
// libcublas.so.13/12 (with libcublasLt from the same folder, and NVRTC's
// builtins library from NVRTC's folder) and, when Options.NCCL asks for
// it, libnccl.so.2: first the folders of
// $STRATA_CUDA_LIB_DIR (':'-separated), then the system CUDA and driver
// folders (/usr/local/cuda/lib64, /usr/local/cuda/targets/x86_64-linux/lib,
// /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, ...), then the bare
// sonames (LD_LIBRARY_PATH and the ldconfig cache), then the nvidia/*/lib
// folders of Python installations (/usr/lib/python3*/, /usr/local/lib/python3*/,
// /opt/*/.venv/lib/python3*/site-packages, ...; nvidia/cu13/lib first). A
// failed load lists what was tried and names the override.
//
// Kernels: kernels.cu is compiled once per process per architecture for
// exactly the device's compute capability (--gpu-architecture=sm_XX from
// cuDeviceGetAttribute), with --fmad=false, IEEE division and square root
// and denormals kept, and loaded as a cubin into each GPU's primary
// context. Compiled modules are cached in memory and on disk
// (kernelcache.go, os.UserCacheDir()/strata/kernels or $STRATA_KERNEL_CACHE,
// "off" to disable), keyed by a hash of source, options, architecture,
// NVRTC and driver version (kernelKey); entries are written atomically and
// checked by length and sha256 when read, a bad one rebuilt, so a warm
// start compiles nothing (compilation takes about 2.5 s on an H200). Attention is the flash-attention
// algorithm (ops_attn.go: causal grouped-query attention over packed
// examples, fp32 tiles through shared memory, online softmax, lse kept;
// the backward recomputes P from lse, dK/dV by the block owning each key
// tile and dQ by the block owning each query tile, so no atomics and no
// batch×heads×seq×seq storage); head dimensions up to 128, and from 129
// to 256 (Gemma 2 and 3) by the _wide builds of the same fp32 kernels
// (attn_fwd_wide, attn_bwd_dkv_wide, attn_bwd_dq_wide: tiles of 16 and 8
// rows, so that rows of 257 floats stay within 48 KiB of static shared
// memory); a larger one is an error at Synchronize. The tensor-core
// kernels take head dimensions up to 128: a wider 16-bit head runs the
// wide fp32 kernels. attn_cached takes up to 256. gpu.AttnOptions:
// the scale is a kernel argument; a sliding window narrows each query's
// first key, and the loops skip the key tiles before it (forward, dQ) and
// the query tiles past its end (dK/dV), so a call costs O(seq·window);
// the soft cap applies tanhf to each scaled score and multiplies dS by
// 1 - (s/cap)²; the zero options give the plain attention's bits.
// AttentionCached (generation) appends the new keys and values to the
// caches (kv_append) and, for one new token, runs attn_cached, one block
// per (token, head) over the cache in tiles of 256 keys, from the
// window's first row with a sliding window; a first call (start 0) runs
// attn_fwd on the new tokens. RoPE takes the Rope's inverse frequencies
// by value, a kernel argument of 256 floats (1 KiB of the 4 KiB a launch
// may pass): no upload, no scratch. RMSNorm (with or without
// the residual add before it: AddRMSNormForward) and the GLU (SwiGLU,
// GeGLU: glu_fwd, glu_bwd) work on chunks
// of 8 elements, moved as 16-byte vectors where a bf16 chunk is aligned and
// element by element elsewhere, with the same bits either way. The Llama
// kernels (RMSNorm, RoPE with cos/sin from double math in the kernel,
// GLU) and this attention were checked without a GPU (NVRTC compile,
// a CPU model of the kernels under sanitizers; README.md) and have not
// yet run on one.
//
// Front end: every Device, Ops and Comm call goes through package gpu's
// checked front end (gpu.Front, gpu.CheckedOps, gpu.CheckedComm,
// gpu.Rounds), as gpu/cpu's do, so both refuse the same calls with the
// same messages; this package implements what follows the checks.
//
// Lifecycle: the first New (or Probe) loads the libraries, retains each
// GPU's primary context, compiles and loads the kernels; this process-wide
// state stays until the process exits, so later backends start in
// milliseconds. New(Options) returns a *Backend with its logical devices
// and one Comm per device; Close synchronizes and destroys the backend's
// streams and collective state. Logical device i runs on GPU i % GPUs: more
// devices than GPUs share a GPU, each with its own budget, streams and
// counters (that is how the conformance suite's 2- and 4-rank tests run on
// one H200). Every driver call runs on a locked OS thread with the
// device's context made current (cuCtxSetCurrent), so any goroutine may
// call any method. Events are destroyed when garbage collected.
//
// Memory: Alloc takes cuMemAlloc memory, zeroed, accounted in multiples of
// 256 bytes against the device's budget (Options.HBMBytes; default the
// GPU's free memory less Options.ReserveBytes, split among the logical
// devices on it) per Tag, with peaks, by the same gpu.Front as gpu/cpu; a
// request past the budget returns *gpu.OutOfMemoryError without calling
// the driver, and a driver out-of-memory is returned the same way.
// Temporaries (attention backward's row dots, mixed-type GEMM operands,
// cuBLASLt's workspace, sum-of-squares partials, embedding links) come
// from a block of the stream-ordered pool (cuMemAllocAsync) per stream (scratch.go), outside
// the budget, as gpu/cpu's temporaries live on the Go heap; ReserveBytes
// leaves room for them and for NCCL's own buffers. The block is handed out
// front to back and reused once every piece is back (stream order makes
// that safe); a request it cannot hold gets a block of its own and raises
// the next block's size, so once the largest round of ops has run nothing
// is allocated again. The rank-order collectives' scratch is pool memory
// charged to the budget (workspace, "collective scratch"), one buffer per
// rank held until Close: a Comm's ReserveScratch (gpu.ScratchReserver)
// takes it ahead, sized for the largest collective of each kind, and a
// round that needs more grows it once. Every cuMemAlloc, cuMemFree,
// cuMemAllocAsync and cuMemFreeAsync is counted (gpu.DriverCounters). Free
// runs cuMemFree, which waits for the whole GPU: never call it holding a
// lock another rank may need. Host memory handed to copies should be
// pinned (pinned.Pool with HostRegistrar, which page-locks it and records
// it in the backend's gpu.HostRegistry, so that the link counters count
// copies of other memory as pageable) for copies to overlap; it must stay
// valid until the copy completes.
//
// Streams and errors: every Stream is a non-blocking CUDA stream with an
// error slot in device memory. Kernels that check runtime data (token ids,
// targets, embedding and attention positions: check_ids, check_pos)
// write the first bad value and its position there and make the op's
// compute kernels skip, so bad data leaves the outputs unchanged;
// Synchronize returns that error once, worded like gpu/cpu's. Failed enqueues
// (driver errors) and rejected Adam hyper-parameters are also returned by
// the next Synchronize; broken contracts panic when the op is enqueued
// (in the front end).
//
// Collectives (comm.go) are rounds: each rank's stream records its
// arrival and waits on a flag in mapped host memory
// (cuStreamWaitValue32, or spin kernels where the driver lacks stream
// memory operations or STRATA_CUDA_SPIN_WAIT is set); the rank that
// completes a round (gpu.Rounds hands it the round, checked) drives it on
// the group's own streams and sets the flags. Two transports: the
// rank-order path (comm_rank.go, the default: peer copies in rotated
// order, with peer access enabled between GPUs at New (peer.go), and a
// rank-order reduction kernel; AllReduce in two phases) and NCCL
// (comm_nccl.go, nccl.go: Options.NCCL, one communicator per backend from
// ncclGetUniqueId and ncclCommInitRank, every rank's call issued from one
// thread between ncclGroupStart and ncclGroupEnd), used where libnccl
// loads and every rank has a GPU of its own; Backend.Collectives says
// which runs and why. NCCL's binding is checked against nccl.h without a
// GPU; the peer access, the rotated reads, the two-phase AllReduce and
// NCCL itself have not run on a GPU yet (device_check.sh multirank runs
// them).
//
// Determinism: every kernel reduces in a fixed order (fixed block sizes,
// fixed trees, loops in index order), so results are bit-identical run to
// run. BiasGrad, LayerNorm's parameter gradients, EmbeddingBackward (with
// or without pos) and Cast give gpu/cpu's bits; AdamStep gives cpuadam's bits (both take
// their scalars from adam.Params.Scalars, and the kernel fuses exactly
// where cpuadam does); row statistics and softmax normalisers are summed
// in double by a tree, so they differ from gpu/cpu only by float64
// rounding. GEMM is cuBLAS(Lt) with fp32 compute (no TF32; bf16 operands
// on tensor cores with fp32 accumulation, split-K never reduced in place):
// reproducible on one GPU model and cuBLAS version, not bit-equal to gpu/cpu. The rank-order
// collectives add in rank order 0..N-1 in fp32 (float64 for F64) and round
// once; NCCL's (Options.NCCL) add in its algorithm's order, identical on
// every rank but not the rank-order bits.
package cuda
