// Package cpuadam is Adam and AdamW on the CPU at the speed of memory: the
// optimizer step of offloaded fp32 master weights and moments, with the
// new params written as bf16 in the same pass, plus the gradient sum of
// squares and non-finite check that clipping and loss scaling need.
//
// # What it owns
//
// The update formula (this doc; ref.go is its executable form and the
// oracle), the kernels that compute it (AVX-512 and AVX2+FMA in Go
// assembly, adam_amd64.s; pure Go elsewhere), their dispatch, and a pool
// of worker goroutines (Optimizer). Its Params (hyper-parameters,
// validation and the per-step scalars) are internal/adam's, the same type
// as gpu.AdamParams. It imports nothing of Strata but internal/bf16 and
// internal/adam.
//
// # The formula
//
// Hyper-parameters follow PyTorch (torch.optim.AdamW, and torch.optim.Adam
// with weight_decay for Mode AdamL2). Per step, in float64, then each
// rounded once to float32:
//
//	gs      = GradScale                  (1/loss-scale × clip coefficient)
//	b1, b2  = Beta1, Beta2;  omb1 = 1-Beta1;  omb2 = 1-Beta2
//	negStep = -LR / (1 - Beta1^Step)     (bias correction 1, from the step count)
//	inv     = 1 / sqrt(1 - Beta2^Step)   (bias correction 2)
//	eps     = Eps
//	decay   = 1 - LR×WeightDecay (AdamW) or 1 (AdamL2)
//	l2      = WeightDecay (AdamL2) or unused (AdamW)
//
// Per element, in float32, each line rounded once (fma: one rounding of
// a×b+c):
//
//	g = grad × gs                        (grad widened exactly from bf16 if bf16)
//	g = fma(l2, param, g)                (AdamL2 only)
//	m = fma(b1, m, omb1×g)
//	v = fma(b2, v, (omb2×g)×g)
//	d = fma(sqrt(v), inv, eps)           (sqrt correctly rounded: VSQRTPS)
//	param = fma(negStep, m/d, param×decay)   (m/d correctly rounded: VDIVPS)
//	out = bf16(param)                    (when out != nil)
//
// This is PyTorch's order (decay first, then m, v, the bias-corrected
// denominator and addcdiv) with two differences of at most an ulp each:
// PyTorch divides sqrt(v) by sqrt(bias correction 2) where we multiply by
// its reciprocal, and its lerp for m rounds differently. Over 1000 steps
// the reference stays within 2e-4×max(1,|p|) of a float64 transcription
// of PyTorch (TestReferenceAgainstPyTorch states why). bf16(x) rounds to
// nearest, ties to even, NaN stays a NaN with its sign, as
// internal/bf16.FromFloat32 and PyTorch; subnormals are kept (which is
// why the kernels use the integer rounding trick and not AVX512_BF16's
// VCVTNEPS2BF16, which flushes subnormal inputs to zero).
//
// # Same bits everywhere
//
// Every ISA gives the same bits as the Go reference (0 ULP), for any
// thread count and tiling: the update is elementwise, the kernels use an
// FMA exactly where the reference calls fma32 (a correctly rounded
// float32 fused multiply-add in Go) and separate roundings elsewhere (the
// reference writes float32() around products so the compiler cannot fuse
// them), and sqrt and division are IEEE on both sides. Only NaN payloads
// may differ. The tests check every ISA against the reference bit for bit.
//
// SumSquares sums in float64, in an order fixed by the index alone: the
// input is cut into blocks of 16384 elements from its start; within a
// block, element i goes to lane i%16 (16 float64 lanes, each a sequential
// sum of exact squares); the 16 lanes are added as a tree (lane j += lane
// j+8, then j+4, j+2, j+1); block sums are added sequentially. The sum is
// ±Inf or NaN exactly when some input is (a float32 square cannot
// overflow a float64 sum). NonFinite is the cheaper check: the largest
// |x| bit pattern is at least that of +Inf.
//
// # Kernels and dispatch
//
// The dispatch variable (Best) is chosen once in init from
// golang.org/x/sys/cpu, which honours GODEBUG (cpu.avx512f=off selects
// AVX2): AVX-512F (zmm, the last partial vector under a K-register mask,
// so no access past the end), else AVX2+FMA (ymm; the last n%8 elements
// through the Go loop, which gives the same bits), else Go. The noasm and
// purego build tags, and other architectures, build only the Go path.
// Optimizer takes an ISA so tests and benchmarks switch levels in one
// process. Each assembly routine is documented by the Go loop it
// computes.
//
// # Lifecycle and memory
//
// The plain functions (StepF32, StepBF16, SumSquares, NonFinite, ...)
// run on the calling goroutine and allocate nothing. New starts an
// Optimizer with Threads-1 persistent workers; each call cuts its slices
// into at most Threads contiguous tiles whose boundaries fall on 64-byte
// addresses of param (SumSquares: on its 16384-element blocks), runs the
// first tile on the caller, waits for the rest, and returns; calls are
// serialized. Close stops the workers. The kernels never keep a slice
// after returning; param, m, v and out are written in place and must not
// overlap each other or grad.
package cpuadam
