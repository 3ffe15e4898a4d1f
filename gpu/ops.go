package gpu

import "github.com/strata-ai/strata/internal/adam"

// Ops are the kernels the model and the engine run on a device. Every method
// enqueues work on stream s and returns at once; results are visible after
// the stream (or an event recorded after the op) has completed. Buffers must
// belong to the device whose Ops is called, except where noted.
//
// Float inputs and outputs may be F32 or BF16 independently; arithmetic is
// done in fp32 and each output is rounded once when stored (bf16: round to
// nearest even). Shapes are row-major; the comment on each method gives them.
// A contract violation (wrong length, wrong dtype, foreign buffer) panics when
// the op is enqueued.
//
// "writes" means the output is overwritten; "accumulates" means out += value.
type Ops interface {
	// Gemm computes C = alpha*op(A)*op(B) + beta*C with fp32 accumulation.
	// op(A) is m×k (A is k×m when transA), op(B) is k×n (B is n×k when
	// transB), C is m×n. beta = 0 ignores C's old contents (even NaN).
	Gemm(s Stream, transA, transB bool, m, n, k int, alpha float32, a, b Buffer, beta float32, c Buffer)
	// BiasAdd: y[r,c] += bias[c] for y rows×cols.
	BiasAdd(s Stream, y, bias Buffer, rows, cols int)
	// BiasGrad accumulates dbias[c] += sum_r dy[r,c].
	BiasGrad(s Stream, dy, dbias Buffer, rows, cols int)

	// LayerNormForward writes y = (x-mean)*rstd*gamma + beta per row of x
	// (rows×cols), and the row statistics mean and rstd (F32, rows).
	LayerNormForward(s Stream, x, gamma, beta, y, mean, rstd Buffer, rows, cols int, eps float32)
	// LayerNormBackward accumulates into dx, dgamma and dbeta.
	LayerNormBackward(s Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta Buffer, rows, cols int)

	// RMSNormForward writes rstd[r] = 1/sqrt(mean_c x[r,c]^2 + eps) (F32,
	// rows) and y = x * rstd * gamma per row of x (rows×cols): Llama's
	// RMSNorm.
	RMSNormForward(s Stream, x, gamma, y, rstd Buffer, rows, cols int, eps float32)
	// RMSNormBackward accumulates into dx and dgamma.
	RMSNormBackward(s Stream, dy, x, gamma, rstd, dx, dgamma Buffer, rows, cols int)

	// AttentionForward is causal grouped-query self-attention with softmax
	// scale 1/sqrt(headDim), computed tile by tile with an online softmax
	// (the flash-attention algorithm): no batch×heads×seq×seq storage.
	// qkv is (batch, seq, (heads+2*kvHeads)*headDim): for each token the q
	// heads, then the k heads, then the v heads; query head h uses
	// key/value head h/(heads/kvHeads). out is (batch, seq, heads*headDim);
	// lse (F32, batch×heads×seq) receives each query row's log-sum-exp of
	// the scaled scores (natural log), kept for the backward. pos (I32,
	// batch×seq: each token's position within its example) may be nil,
	// meaning pos[b,t] = t; query (b,i) attends to keys j of row b with
	// i-pos[b,i] <= j <= i.
	AttentionForward(s Stream, qkv, out, lse, pos Buffer, batch, seq, heads, kvHeads, headDim int)
	// AttentionBackward writes dqkv (packed as qkv) from dout, recomputing
	// the probabilities tile by tile from lse (with D_i = rowsum(dout_i *
	// out_i), as FlashAttention-2). Deterministic: the same inputs give the
	// same bits on every call.
	AttentionBackward(s Stream, dout, qkv, out, lse, pos, dqkv Buffer, batch, seq, heads, kvHeads, headDim int)

	// RopeForward rotates, in place, the q and k heads of packed qkv (as
	// AttentionForward's) by Hugging Face's convention: for i < D/2,
	// freq_i = theta^(-2i/D), angle = pos*freq_i, (x_i, x_{i+D/2}) ->
	// (x_i*cos - x_{i+D/2}*sin, x_{i+D/2}*cos + x_i*sin), cos and sin
	// computed in float64 and rounded to fp32. v is untouched; pos as
	// AttentionForward's.
	RopeForward(s Stream, qkv, pos Buffer, batch, seq, heads, kvHeads, headDim int, theta float32)
	// RopeBackward applies the transpose (inverse) rotation in place to the
	// q and k parts of dqkv.
	RopeBackward(s Stream, dqkv, pos Buffer, batch, seq, heads, kvHeads, headDim int, theta float32)

	// SwiGLUForward writes y (rows×ffn) = silu(gate) * up, silu(x) =
	// x*sigmoid(x), where gateUp is rows×2ffn: gate in columns [0,ffn), up
	// in [ffn,2ffn).
	SwiGLUForward(s Stream, gateUp, y Buffer, rows, ffn int)
	// SwiGLUBackward writes dgateUp (rows×2ffn): d gate = dy*up*silu'(gate),
	// d up = dy*silu(gate). dgateUp may not alias gateUp.
	SwiGLUBackward(s Stream, gateUp, dy, dgateUp Buffer, rows, ffn int)

	// GeluForward writes y = gelu(x) (tanh approximation, as GPT-2) for n elements.
	GeluForward(s Stream, x, y Buffer, n int)
	// GeluBackward writes dx = dy * gelu'(x).
	GeluBackward(s Stream, x, dy, dx Buffer, n int)
	// Add writes out = a + b for n elements (the residual connection).
	// out may alias a or b.
	Add(s Stream, a, b, out Buffer, n int)

	// CrossEntropyForward writes losses[r] = -log softmax(logits[r])[targets[r]]
	// for logits rows×vocab and targets (I32, rows); a target < 0
	// (model.IgnoreTarget) gives loss 0.
	CrossEntropyForward(s Stream, logits, targets, losses Buffer, rows, vocab int)
	// CrossEntropyBackward writes dlogits = (softmax(logits) - onehot(targets)) * scale;
	// a row whose target is < 0 gets dlogits = 0.
	CrossEntropyBackward(s Stream, logits, targets, dlogits Buffer, rows, vocab int, scale float32)

	// EmbeddingForward writes out[b,t,:] = wte[ids[b,t],:] (+ wpe[pos[b,t],:]
	// when wpe is not nil; the Llama family passes nil) for ids (I32,
	// batch×seq), wte (vocab×dim), wpe (maxPos×dim), out (batch×seq×dim);
	// pos as AttentionForward's.
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
	// SumSquares writes sum(x[i]^2), accumulated in float64 in index order,
	// into out[index] (out is F64). A non-finite x makes the sum non-finite.
	SumSquares(s Stream, x, out Buffer, index int)

	// AdamStep updates param (F32), m and v (F32) from grad (F32 or BF16) in
	// place, and writes the new parameters rounded to bf16 into out when out
	// is not nil. The formula is cpuadam's; on the CPU backend it calls
	// cpuadam, so device and host optimizers give identical bits.
	AdamStep(s Stream, param, grad, m, v, out Buffer, p AdamParams)
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
// identical on every rank.
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
