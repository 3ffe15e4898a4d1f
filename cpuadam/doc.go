// Package cpuadam is Adam and AdamW on the CPU at the speed of memory.
//
// It is the optimizer step of offloaded fp32 master weights and moments,
// with the new params written as bf16 in the same pass, plus the gradient
// sum of squares and non-finite check that clipping and loss scaling need.
//
// # What it owns
//
// The update formula (this doc; ref.go is its executable form and the
// oracle), the narrow formats of offloaded moments (moments.go), the
// kernels that compute them (AVX-512 and AVX2+FMA in Go assembly,
// adam_amd64.s and moments_amd64.s; pure Go elsewhere), their dispatch,
// and a pool of worker goroutines (Optimizer). Its Params (hyper-parameters,
// validation and the per-step scalars) are package adam's, the same type
// as gpu.AdamParams. It imports nothing of Strata but internal/bf16, dtype
// (the Q8 size) and adam.
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
// may differ (and with int8 moments the sign of the code of a NaN, in a
// block whose scale is a NaN). The tests check every ISA against the reference bit for bit.
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
// # Narrow moments
//
// An offloaded shard may store m and v in bf16 or int8 instead of fp32
// (Moments, Shard, Step). The update is the fp32 formula above: each step
// decodes the stored moments to fp32, updates, and encodes the new ones,
// so a store's rounding is made once per step and never inside one.
//
// bf16: each moment rounded to nearest even as the bf16 output is (NaN
// stays a NaN with its sign, subnormals kept); decoding widens exactly.
//
// int8: the shard is cut into blocks of QuantBlock = 256 elements from its
// start (the last may be shorter); each block of each moment has one fp32
// scale, stored before the codes: the largest |x| of the block's new
// values by bit pattern (so an Inf or NaN becomes the scale, and a block
// of zeros has scale 0 and is divided by 1). A code holds r = x/scale, a
// correctly rounded float32 division with |r| <= 1, in a base-2 format
// with 3 fraction bits; its value times the scale, rounded once to
// float32, is the decoded moment:
//
//	m: bit 7 sign, bits 6..3 exponent field e (bias 15), bits 2..0 fraction f
//	   e >= 1: ±2^(e-15)·(1+f/8)   from 2^-14 to 1.0 (code 0x78)
//	   e == 0: ±f·2^-17            subnormal, down to 2^-17
//	v: bits 7..3 exponent field e (bias 31), bits 2..0 fraction f, no sign
//	   e >= 1: 2^(e-31)·(1+f/8)    from 2^-30 to 1.0 (code 0xf8)
//	   e == 0: f·2^-33
//
// Encoding rounds |r| to the nearest code value, ties to the even code: a
// normal |r| by rounding its fp32 bits to 3 fraction bits with the integer
// trick of the bf16 rounding (add 0x7ffff plus the last kept bit, shift by
// 20), a smaller one by rounding |r|·2^17 (m) or |r|·2^33 (v), which is
// exact, to the nearest even integer (8 is the smallest normal code, so
// the two ranges meet). A NaN ratio (a NaN in the block) gets the largest
// code, 0x7f or 0xff with m's sign (its block's scale is that NaN, so it
// decodes to a NaN); no other code above 1.0 is written; -0 keeps its sign
// in m. Shards under MinQuantElems = 4096 elements keep
// fp32 moments (Moments.For).
//
// Sources: block-wise quantization with a per-block absmax is Dettmers et
// al. 2022, "8-bit Optimizers via Block-wise Quantization" (blocks of 2048
// there; 256 here, so that one outlier costs fewer neighbours their
// precision), as are the 4096-element rule and the decode, update in fp32,
// encode cycle. m's layout is the E4M3 format of Micikevicius et al. 2022,
// "FP8 Formats for Deep Learning", with its exponent bias moved so that
// the top of the range, |r| = 1, is exponent 2^0 (0x7f, E4M3's NaN, is
// the code of a NaN here too); v, never negative, spends the sign bit
// on a fifth exponent bit, as its values span the square of m's range. The
// paper's dynamic tree map is base-10 and irregular: encoding it needs a
// search of a 256-entry table and its rounding is defined by that search.
// A base-2 format with fixed fraction bits is rounded exactly, to nearest
// even, by integer arithmetic on the float32 bits, so every ISA computes
// the same codes with a few vector instructions and no table.
//
// The kernels (AVX-512, AVX2, Go) give the same bits for narrow moments
// too: refNarrow in moments.go is their oracle. Per block, the vector
// kernels update and keep the new moments in a scratch buffer while the
// block's largest magnitudes are reduced, then divide (VDIVPS, correctly
// rounded like Go's float32 division) and encode both branches at once, by
// exponent: with E' the larger of r's exponent and the smallest normal's,
// r·2^(3-E') is exact and lies in [8, 16] for a normal code (1.fff, or the
// next binade's 1.000 when it rounds up) and in [0, 8] for a subnormal
// one, so VCVTPS2DQ, which rounds to nearest even like math.RoundToEven,
// rounds it, and the code is 8·(E' - the smallest normal's exponent) plus
// that integer. Decoding looks a subnormal code's value up by its fraction
// (VPERMPS). AVX2 runs whole blocks and leaves a last, shorter block to the
// Go loop.
//
// # The master as a remainder
//
// With bf16 params, an offloaded shard may keep its fp32 master as the
// bf16 param plus a Remainder (strata.optimizer_state.master
// "bf16+remainder"): per element the master's low 16 bits and one bit,
// up, set when the param (the master rounded to nearest even) was rounded
// up, so that the master's high 16 bits are the param's bits minus one:
//
//	master = (param − up) << 16 | lo     (2.125 B beside the param, not 4)
//
// Sixteen bits alone cannot: 65,537 masters round to each even bf16 value,
// the 65,535 between its two ties and both ties, whose low halves are the
// same (0x8000); up tells them apart. (A param truncated instead of
// rounded would need no bit, but it is not the fp32 master's run.) Rounding
// up in magnitude adds one to the bits whatever the sign, and to the
// largest finite value it gives the infinity, so the join is exact for
// every master but a signalling NaN, which arithmetic never makes (it
// comes back a NaN). A Shard with Rem set is stepped a block of remBlock
// elements at a time: joined into fp32 from the remainder and Out (the
// params the last step wrote), updated by the fp32-master kernel, which
// writes the new params into Out, and split again against them: the bits
// of the fp32 master's step. Join and split are AVX-512 (the up bits of
// 16 elements are a mask register) and AVX2 loops; the extra pass over
// the block (16 KiB) stays in the cache (the fused single pass, a flag of
// the kernels' loads and stores, is not written).
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
