package gpu

import (
	"math"

	"github.com/strata-ai/strata/adam"
)

// ColumnBlockRows is the order of every sum of a column over the rows
// (BiasGrad, and the gamma and beta gradients of LayerNormBackward and
// RMSNormBackward), the same on every backend so that their bits agree:
// the rows of each block of ColumnBlockRows are added in order into a
// block sum starting from 0, then the block sums in order, all in fp32.
// A GPU sums the blocks of every column in parallel (a thread a column
// walking every row waits on one load after another); with at most
// ColumnBlockRows rows it is the plain sum in row order.
const ColumnBlockRows = 256

// Ops are the kernels the model and the engine run on a device. Every method
// enqueues work on stream s and returns at once; results are visible after
// the stream (or an event recorded after the op) has completed. Buffers must
// belong to the device whose Ops is called, except where noted.
//
// Float inputs and outputs may be F32, BF16 or F16 independently;
// arithmetic is done in fp32 and each output is rounded once when stored
// (bf16 and f16: round to nearest even; f16 past 65504 is infinite). Shapes are row-major; the comment on each method gives them.
// A contract violation (wrong length, wrong dtype, foreign buffer) panics when
// the op is enqueued.
//
// "writes" means the output is overwritten; "accumulates" means out += value.
// A buffer argument is never nil except where its method says it may be
// (pos, wpe, dwpe).
type Ops interface {
	// Gemm computes C = alpha*op(A)*op(B) + beta*C with fp32 accumulation.
	// op(A) is m×k (A is k×m when transA), op(B) is k×n (B is n×k when
	// transB), C is m×n. beta = 0 ignores C's old contents (even NaN).
	Gemm(s Stream, transA, transB bool, m, n, k int, alpha float32, a, b Buffer, beta float32, c Buffer)
	// BiasAdd: y[r,c] += bias[c] for y rows×cols.
	BiasAdd(s Stream, y, bias Buffer, rows, cols int)
	// BiasGrad accumulates dbias[c] += sum_r dy[r,c], in fp32 in
	// ColumnBlockRows order (as the norms' parameter gradients).
	BiasGrad(s Stream, dy, dbias Buffer, rows, cols int)

	// LayerNormForward writes y = (x-mean)*rstd*gamma + beta per row of x
	// (rows×cols), and the row statistics mean and rstd (F32, rows).
	LayerNormForward(s Stream, x, gamma, beta, y, mean, rstd Buffer, rows, cols int, eps float32)
	// AddLayerNormForward is Add then LayerNormForward in one pass over the
	// rows (GPT-2's residual connection and the norm after it): it writes
	// sum = a + b (rows×cols, rounded once to sum's dtype; sum may be a or
	// b) and then what LayerNormForward(sum, gamma, beta, y, mean, rstd)
	// writes, with the same bits as those two calls. y may not overlap a,
	// b or sum.
	AddLayerNormForward(s Stream, a, b, sum, gamma, beta, y, mean, rstd Buffer, rows, cols int, eps float32)
	// LayerNormBackward accumulates into dx, dgamma and dbeta.
	LayerNormBackward(s Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta Buffer, rows, cols int)

	// AttentionForward is causal grouped-query self-attention, computed
	// tile by tile with an online softmax (the flash-attention algorithm):
	// nothing of size seq×seq is stored anywhere. qkv is (batch, seq,
	// (heads+2·kvHeads)·headDim), each token's row holding its query heads
	// 0..heads-1, then its key heads 0..kvHeads-1, then its value heads
	// (GPT-2: kvHeads = heads, the layout of c_attn); query head h uses
	// key/value head h/(heads/kvHeads) (Hugging Face's repeat_kv grouping).
	// The softmax scale is opt.Scale (1/sqrt(headDim) when 0). pos (I32,
	// batch×seq) is each token's position within its example, or nil for
	// pos[b,t] = t: the query at (b,i) attends to the keys j of row b with
	// i-pos[b,i] <= j <= i (causal, and never across packed examples), and
	// with opt.Window > 0 only to those with i - j < opt.Window (sliding
	// window: a query sees at most Window keys, itself included, and the
	// cost is O(seq·Window)); a pos outside [0, t] is an error on the
	// stream. With opt.SoftCap > 0 each scaled score x becomes
	// SoftCap·tanh(x/SoftCap) before the softmax (Gemma 2). out is (batch, seq,
	// heads·headDim); lse (F32, batch×heads×seq) receives each query row's
	// log-sum-exp of its scaled scores (natural log), kept for the backward.
	// With qkv in a 16-bit type a backend may round the probabilities to
	// that type before they multiply V, and in the backward the
	// probabilities and dS before their products, as FlashAttention does
	// on tensor cores (the CUDA backend); the CPU backend keeps them fp32.
	AttentionForward(s Stream, qkv, out, lse, pos Buffer, batch, seq, heads, kvHeads, headDim int, opt AttnOptions)
	// AttentionBackward writes dqkv (packed as qkv) from dout, recomputing
	// the probabilities tile by tile from lse, with D_i = rowsum(dout_i ⊙
	// out_i) as in FlashAttention-2. Deterministic: the same inputs give
	// the same bits on every call (a fixed accumulation order). dqkv may not
	// alias qkv, dout or out. The CUDA backend takes headDim up to 256.
	// opt must be the forward's.
	AttentionBackward(s Stream, dout, qkv, out, lse, pos, dqkv Buffer, batch, seq, heads, kvHeads, headDim int, opt AttnOptions)
	// AttentionCached is the attention of generation with a key/value
	// cache: n new tokens of one sequence, at positions start..start+n-1,
	// attend to every token before them and to themselves causally. qkv
	// (n, (heads+2·kvHeads)·headDim) is packed as AttentionForward reads
	// it; kCache and vCache (F32 or BF16, capacity rows of kvHeads·headDim,
	// capacity >= start+n) hold the keys and values of positions
	// 0..start-1 from earlier calls. It first writes each new token's key
	// and value heads into row start+i of kCache and vCache, then the query
	// of token i attends to cache rows 0..start+i (the rows as stored:
	// rounded to bf16 in a bf16 cache; with opt.Window > 0 only the last
	// Window of them, rows start+i-Window+1..start+i), with query head h
	// on key/value head h/(heads/kvHeads), scale and soft cap as
	// AttentionForward's opt. out is (n, heads·headDim). With start = 0 it
	// computes what AttentionForward does for one row of n tokens (and
	// fills the cache).
	AttentionCached(s Stream, qkv, kCache, vCache, out Buffer, start, n, heads, kvHeads, headDim int, opt AttnOptions)

	// RMSNormForward writes rstd[r] = 1/sqrt(mean_c x[r,c]² + eps) (F32,
	// rows) and y = x·rstd·gamma per row of x (rows×cols): Llama's RMSNorm.
	RMSNormForward(s Stream, x, gamma, y, rstd Buffer, rows, cols int, eps float32)
	// AddRMSNormForward is Add then RMSNormForward in one pass over the
	// rows (the residual connection of a pre-norm block and the norm after
	// it): it writes sum = a + b (rows×cols, rounded once to sum's dtype;
	// sum may be a or b) and then what RMSNormForward(sum, gamma, y, rstd)
	// writes, with the same bits as those two calls. y may not overlap a,
	// b or sum.
	AddRMSNormForward(s Stream, a, b, sum, gamma, y, rstd Buffer, rows, cols int, eps float32)
	// RMSNormBackward accumulates into dx and dgamma.
	RMSNormBackward(s Stream, dy, x, gamma, rstd, dx, dgamma Buffer, rows, cols int)

	// RopeForward rotates, in place, the query and key heads of packed qkv
	// (as AttentionForward reads it) by Hugging Face's rotary convention
	// (rotate_half over the first r.Dims values of each head, in two
	// halves; the rest of the head is untouched, partial_rotary_factor):
	// for i < r.Dims/2, angle = pos·r.InvFreq[i] (in float64, from the
	// fp32 inverse frequency), c = cos(angle)·r.Scale, s = sin(angle)·r.Scale
	// (float64, rounded to fp32), and
	// (x_i, x_{i+Dims/2}) -> (x_i·c − x_{i+Dims/2}·s, x_{i+Dims/2}·c + x_i·s).
	// pos as in AttentionForward (nil: pos[b,t] = t), here any value
	// (generation rotates a token at its position in the whole sequence);
	// the value heads are untouched. r.Dims must be even, at most headDim
	// and at most MaxRopeDims; the op copies r.InvFreq when it is enqueued.
	RopeForward(s Stream, qkv, pos Buffer, batch, seq, heads, kvHeads, headDim int, r Rope)
	// RopeBackward applies the transpose of the rotation, in place, to the
	// query and key heads of dqkv: (d1, d2) -> (d1·c + d2·s, d2·c − d1·s)
	// (with r.Scale ≠ 1 the rotation is scaled, and so is its transpose).
	RopeBackward(s Stream, dqkv, pos Buffer, batch, seq, heads, kvHeads, headDim int, r Rope)

	// GLUForward writes y (rows×ffn) = act(gate)·up, where gateUp
	// (rows×2·ffn) holds gate in columns [0, ffn) and up in [ffn, 2·ffn)
	// (the fused gate|up GEMM's output): SwiGLU with act Silu (silu(x) =
	// x·sigmoid(x), the Llama family), GeGLU with act GeluTanh (Gemma).
	GLUForward(s Stream, gateUp, y Buffer, rows, ffn int, act GLUAct)
	// GLUBackward writes dgateUp (rows×2·ffn): d gate = dy·up·act'(gate),
	// d up = dy·act(gate). dgateUp may not alias gateUp.
	GLUBackward(s Stream, gateUp, dy, dgateUp Buffer, rows, ffn int, act GLUAct)

	// GeluForward writes y = gelu(x) (tanh approximation, as GPT-2) for n elements.
	GeluForward(s Stream, x, y Buffer, n int)
	// BiasGeluForward is BiasAdd then GeluForward in one pass (an MLP's
	// first projection and its activation): y[r,c] += bias[c] for y
	// rows×cols, rounded once to y's dtype, then act = gelu(y) of the
	// stored y, with the bits of those two calls. act may not overlap y or
	// bias.
	BiasGeluForward(s Stream, y, bias, act Buffer, rows, cols int)
	// GeluBackward writes dx = dy * gelu'(x).
	GeluBackward(s Stream, x, dy, dx Buffer, n int)
	// Add writes out = a + b for n elements (the residual connection).
	// out may alias a or b.
	Add(s Stream, a, b, out Buffer, n int)
	// AddColumns writes cols columns of src (rows×srcLd, from column
	// srcOff) into dst (rows×dstLd, from column dstOff): dst = src when beta
	// is 0 (dst's old values are not read), else dst = beta·dst + src. A
	// LoRA adapter of one of the projections a fused GEMM computes (q, k,
	// v; gate, up) reads and adds its columns this way. dst and src must not
	// overlap.
	AddColumns(s Stream, dst, src Buffer, rows, cols, dstLd, dstOff, srcLd, srcOff int, beta float32)
	// Dropout writes y[i] = x[i]·scale where DropoutKeep(seed, offset+i,
	// threshold), else 0, for n elements (y may be x): the same seed and
	// element index keep the same elements on every backend, whatever the
	// split of a tensor into calls (offset).
	Dropout(s Stream, x, y Buffer, n int, seed uint64, offset int64, threshold uint32, scale float32)
	// Dequantize decodes n values stored in format (src: a U8 buffer of
	// format.Bytes(n) bytes) into dst, rounded to dst's dtype: NF4 as
	// internal/nf4 lays it out (the NF4 table's entry times the block's
	// absmax, rounded once to float32), INT8 as internal/absmax8 does
	// (the code times the block's step, rounded once). A frozen base's
	// weights, streamed coded and used in bf16.
	Dequantize(s Stream, format DType, src, dst Buffer, n int)

	// CrossEntropyForward writes losses[r] = -log softmax(z[r])[targets[r]]
	// for logits rows×vocab and targets (I32, rows), where z = logits, or
	// with softCap > 0 z = softCap·tanh(logits/softCap) (Gemma 2's final
	// logit soft-capping, computed in fp32 from the logits as stored). A
	// target < 0 (model.IgnoreTarget) gives loss 0; a target >= vocab is
	// an error on the stream.
	CrossEntropyForward(s Stream, logits, targets, losses Buffer, rows, vocab int, softCap float32)
	// CrossEntropyBackward writes dlogits = (softmax(z) - onehot(targets)) * scale,
	// times 1 - (z/softCap)² with softCap > 0 (z as in the forward), and
	// dlogits = 0 for a row whose target is < 0. dlogits may be logits.
	CrossEntropyBackward(s Stream, logits, targets, dlogits Buffer, rows, vocab int, scale, softCap float32)

	// EmbeddingForward writes out[b,t,:] = wte[ids[b,t],:] (+ wpe[pos[b,t],:]
	// when wpe is not nil) for ids (I32, batch×seq), wte (vocab×dim), wpe
	// (at least seq rows of dim), out (batch×seq×dim). pos as in
	// AttentionForward (nil: pos[b,t] = t); the Llama family passes no wpe.
	// An id or position outside its table is an error on the stream.
	EmbeddingForward(s Stream, ids, pos, wte, wpe, out Buffer, batch, seq, dim int)
	// EmbeddingBackward accumulates dwte[ids[b,t],:] += dout[b,t,:] (and
	// dwpe[pos[b,t],:] += dout[b,t,:] when dwpe is not nil), in the fixed
	// order b, then t.
	EmbeddingBackward(s Stream, ids, pos, dout, dwte, dwpe Buffer, batch, seq, dim int)

	// Cast writes dst = src converted to dst's dtype; lengths must match.
	Cast(s Stream, dst, src Buffer)
	// Fill writes value into every element of x.
	Fill(s Stream, x Buffer, value float32)
	// Scale writes x *= alpha.
	Scale(s Stream, x Buffer, alpha float32)
	// Axpy accumulates y += alpha*x; lengths must match.
	Axpy(s Stream, alpha float32, x, y Buffer)
	// ScaleRows writes x[r,:] *= scale[r] for x rows×cols and scale F32
	// (rows), in fp32, rounded once to x's dtype: a mixture-of-experts
	// layer weights each expert's output rows by their routing weights.
	ScaleRows(s Stream, x, scale Buffer, rows, cols int)
	// RowDots writes out[r] = Σ_c a[r,c]·b[r,c] for a and b rows×cols and
	// out F32 (rows): each product exact in float64, summed in float64 in
	// column order and rounded once, so every backend gives the same bits
	// (the gradient of a routing weight).
	RowDots(s Stream, a, b, out Buffer, rows, cols int)
	// SumSquares writes sum(x[i]^2), accumulated in float64 in index order,
	// into out[index] (out is F64). A non-finite x makes the sum non-finite.
	SumSquares(s Stream, x, out Buffer, index int)

	// AdamStep updates param (F32), m and v (F32) from grad (F32, BF16 or
	// F16) in place, and writes the new parameters rounded to bf16 (f16 with
	// an F16 grad) into out when out is not nil. The formula is cpuadam's; on the CPU backend it calls
	// cpuadam, so device and host optimizers give identical bits.
	AdamStep(s Stream, param, grad, m, v, out Buffer, p AdamParams)
}

// DropoutKeep says whether dropout keeps element i of the stream seed:
// the top 24 bits of SplitMix64's finaliser of seed + (i+1)·φ (φ =
// 0x9e3779b97f4a7c15), as an integer u in [0, 2^24), compared with
// threshold (DropoutThreshold: p·2^24 rounded): kept when u >= threshold,
// so with probability 1 - threshold/2^24. Counter-based: any element's
// decision is computed alone, by every backend alike.
func DropoutKeep(seed uint64, i int64, threshold uint32) bool {
	z := seed + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return uint32(z>>40) >= threshold
}

// DropoutThreshold is Dropout's threshold and scale for a drop
// probability p in [0, 1): round(p·2^24), and 1/(1-p) rounded once to
// float32.
func DropoutThreshold(p float64) (uint32, float32) {
	return uint32(math.Round(p * (1 << 24))), float32(1 / (1 - p))
}

// AdamParams are the hyper-parameters of one Adam step: internal/adam's
// Params, the same type as cpuadam.Params, so host and device optimizers
// take one value (no conversion). The formula is the one documented in
// package cpuadam; Validate says what is wrong with them.
type AdamParams = adam.Params

// AdamMode selects how weight decay enters: AdamW or AdamL2.
type AdamMode = adam.Mode

const (
	AdamW  = adam.W  // decoupled weight decay (torch.optim.AdamW)
	AdamL2 = adam.L2 // classic Adam with L2: decay added to the gradient
)

// ReduceOp combines values across ranks.
type ReduceOp uint8

const (
	Sum ReduceOp = iota // x_0 + x_1 + ... + x_{N-1}, added in rank order
	Avg                 // Sum, then divided by N
)

// Comm is one rank's handle on a communicator over the local devices, like
// an NCCL communicator: every rank calls the same collectives in the same
// order, each on a stream of its own device, and each call completes when
// all ranks have joined it. Reductions add in fixed rank order (0, 1, ...,
// N-1) in fp32 and round once on store, so results are deterministic and
// identical on every rank. (gpu/cuda's NCCL communicator, opt-in, is the
// exception: identical on every rank, in NCCL's order.)
type Comm interface {
	Rank() int
	Size() int
	// AllGather: recv.Len() == Size()*send.Len(); rank r's send lands in
	// recv[r*n : (r+1)*n] on every rank.
	AllGather(s Stream, send, recv Buffer)
	// ReduceScatter: send.Len() == Size()*recv.Len(); rank r receives the
	// reduction over ranks of send[r*n : (r+1)*n].
	ReduceScatter(s Stream, send, recv Buffer, op ReduceOp)
	// AllReduce reduces buf over ranks in place.
	AllReduce(s Stream, buf Buffer, op ReduceOp)
	// Broadcast copies root's buf into every rank's buf.
	Broadcast(s Stream, buf Buffer, root int)
	// Barrier completes when every rank has reached it.
	Barrier(s Stream)
}
