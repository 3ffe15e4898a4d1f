package cuda

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
)

// rowThreads is NT of kernels.cu: the block size of row-wise kernels.
const rowThreads = 256

// LayerNormForward: one block per row; mean and variance summed in double
// over a fixed tree; rstd = 1/sqrt(var+eps); y in fp32 from the stored
// mean and rstd.
func (o *Ops) LayerNormForward(gs gpu.Stream, gx, ggamma, gbeta, gy, gmean, grstd gpu.Buffer, rows, cols int, eps float32) {
	nonNeg("layernorm", rows, cols)
	s := o.stream(gs)
	x, y := o.float(gx, "layernorm x", rows*cols), o.float(gy, "layernorm y", rows*cols)
	gamma, beta := o.float(ggamma, "layernorm gamma", cols), o.float(gbeta, "layernorm beta", cols)
	mean, rstd := o.typed(gmean, "layernorm mean", gpu.F32, rows), o.typed(grstd, "layernorm rstd", gpu.F32, rows)
	s.launch("layernorm_fwd", uint32(rows), rowThreads, x.p(), dt(x), gamma.p(), dt(gamma), beta.p(), dt(beta),
		y.p(), dt(y), mean.p(), rstd.p(), int64(cols), eps)
}

// LayerNormBackward accumulates dx (one block per row, double sums) and
// dgamma, dbeta (one thread per column, fp32 in row order).
func (o *Ops) LayerNormBackward(gs gpu.Stream, gdy, gx, ggamma, gmean, grstd, gdx, gdgamma, gdbeta gpu.Buffer, rows, cols int) {
	nonNeg("layernorm-backward", rows, cols)
	s := o.stream(gs)
	dy, x, dx := o.float(gdy, "layernorm dy", rows*cols), o.float(gx, "layernorm x", rows*cols), o.float(gdx, "layernorm dx", rows*cols)
	gamma := o.float(ggamma, "layernorm gamma", cols)
	dgamma, dbeta := o.float(gdgamma, "layernorm dgamma", cols), o.float(gdbeta, "layernorm dbeta", cols)
	mean, rstd := o.typed(gmean, "layernorm mean", gpu.F32, rows), o.typed(grstd, "layernorm rstd", gpu.F32, rows)
	s.launch("layernorm_bwd_dx", uint32(rows), rowThreads, dy.p(), dt(dy), x.p(), dt(x), gamma.p(), dt(gamma),
		mean.p(), rstd.p(), dx.p(), dt(dx), int64(cols))
	s.launchN("layernorm_bwd_params", int64(cols), dy.p(), dt(dy), x.p(), dt(x), mean.p(), rstd.p(),
		dgamma.p(), dt(dgamma), dbeta.p(), dt(dbeta), int64(rows), int64(cols))
}

func checkGrid(op string, blocks int) {
	if blocks > math.MaxInt32 {
		panic(fmt.Sprintf("gpu/cuda: %s: %d blocks", op, blocks))
	}
}

// AttentionForward: causal softmax(q·k/sqrt(headDim))·v, one block per
// (batch, head, query row): scores in fp32, max-subtracted exponentials
// and their sum in double, probabilities written to att (zeros above the
// diagonal), the output summed in fp32 in key order.
func (o *Ops) AttentionForward(gs gpu.Stream, gqkv, gout, gatt gpu.Buffer, batch, seq, heads, headDim int) {
	nonNeg("attention", batch, seq, heads, headDim)
	s := o.stream(gs)
	C := heads * headDim
	qkv, out := o.float(gqkv, "attention qkv", batch*seq*3*C), o.float(gout, "attention out", batch*seq*C)
	att := o.typed(gatt, "attention att", gpu.F32, batch*heads*seq*seq)
	checkGrid("attention", batch*heads*seq)
	scale := float32(1 / math.Sqrt(float64(headDim)))
	s.launch("attn_fwd", uint32(batch*heads*seq), rowThreads, qkv.p(), dt(qkv), out.p(), dt(out), att.p(),
		int32(seq), int32(heads), int32(headDim), scale)
}

// AttentionBackward writes dqkv: dS = P ⊙ (dO·Vᵀ - rowsum(P ⊙ dO·Vᵀ)) *
// scale into scratch (batch×heads×seq×seq fp32, outside the budget), then
// dQ = dS·K, dK = dSᵀ·Q, dV = Pᵀ·dO, each element summed in a fixed order.
func (o *Ops) AttentionBackward(gs gpu.Stream, gdout, gqkv, gatt, gdqkv gpu.Buffer, batch, seq, heads, headDim int) {
	nonNeg("attention-backward", batch, seq, heads, headDim)
	s := o.stream(gs)
	C := heads * headDim
	qkv, dqkv := o.float(gqkv, "attention qkv", batch*seq*3*C), o.float(gdqkv, "attention dqkv", batch*seq*3*C)
	dout := o.float(gdout, "attention dout", batch*seq*C)
	att := o.typed(gatt, "attention att", gpu.F32, batch*heads*seq*seq)
	checkGrid("attention-backward", batch*heads*seq)
	if batch*heads*seq == 0 {
		return
	}
	scale := float32(1 / math.Sqrt(float64(headDim)))
	g := o.d.g
	s.run(func() error {
		ds, free, err := s.scratch(int64(batch*heads*seq) * int64(seq) * 4)
		if err != nil {
			return err
		}
		defer free()
		if err := g.launch(s.h, "attn_bwd_ds", uint32(batch*heads*seq), rowThreads, 0, dout.p(), dt(dout), qkv.p(), dt(qkv),
			att.p(), devPtr(ds), int32(seq), int32(heads), int32(headDim), scale); err != nil {
			return err
		}
		n := int64(batch*heads*seq) * int64(headDim)
		if err := g.launch(s.h, "attn_bwd_dq", g.gridFor(n, 256), 256, 0, qkv.p(), dt(qkv), devPtr(ds), dqkv.p(), dt(dqkv),
			int32(batch), int32(seq), int32(heads), int32(headDim)); err != nil {
			return err
		}
		return g.launch(s.h, "attn_bwd_dkv", g.gridFor(n, 256), 256, 0, dout.p(), dt(dout), qkv.p(), dt(qkv), att.p(),
			devPtr(ds), dqkv.p(), dt(dqkv), int32(batch), int32(seq), int32(heads), int32(headDim))
	})
}

// CrossEntropyForward: one block per row; losses[r] = log(sum exp(l-max))
// + max - l[target] with the sum in double. A target outside [0, vocab)
// is an error on the stream and leaves losses unchanged.
func (o *Ops) CrossEntropyForward(gs gpu.Stream, glogits, gtargets, glosses gpu.Buffer, rows, vocab int) {
	nonNeg("cross-entropy", rows, vocab)
	s := o.stream(gs)
	logits, losses := o.float(glogits, "cross-entropy logits", rows*vocab), o.float(glosses, "cross-entropy losses", rows)
	targets := o.typed(gtargets, "cross-entropy targets", gpu.I32, rows)
	s.checkIDs(targets, rows, vocab, codeTarget)
	s.launch("xent_fwd", uint32(rows), rowThreads, logits.p(), dt(logits), targets.p(), losses.p(), dt(losses), int64(vocab), s.badFlag())
}

// CrossEntropyBackward: dlogits = (softmax(logits) - onehot(target)) *
// scale; dlogits may be the logits buffer itself.
func (o *Ops) CrossEntropyBackward(gs gpu.Stream, glogits, gtargets, gdlogits gpu.Buffer, rows, vocab int, scale float32) {
	nonNeg("cross-entropy-backward", rows, vocab)
	s := o.stream(gs)
	logits, dlogits := o.float(glogits, "cross-entropy logits", rows*vocab), o.float(gdlogits, "cross-entropy dlogits", rows*vocab)
	targets := o.typed(gtargets, "cross-entropy targets", gpu.I32, rows)
	s.checkIDs(targets, rows, vocab, codeTarget)
	s.launch("xent_bwd", uint32(rows), rowThreads, logits.p(), dt(logits), targets.p(), dlogits.p(), dt(dlogits),
		int64(vocab), scale, s.badFlag())
}

func (o *Ops) embTable(gb gpu.Buffer, what string, dim, minRows int) *Buffer {
	b := o.d.buf(gb, what)
	if b.dt != gpu.F32 && b.dt != gpu.BF16 {
		panic(fmt.Sprintf("gpu/cuda: %s is %s, want f32 or bf16", what, b.dt))
	}
	if dim > 0 && (b.n%dim != 0 || b.n/dim < minRows) {
		panic(fmt.Sprintf("gpu/cuda: %s has %d elements, want a multiple of dim %d with at least %d rows", what, b.n, dim, minRows))
	}
	return b
}

// EmbeddingForward: out[b,t,:] = wte[ids[b,t],:] + wpe[t,:]. An id outside
// the vocabulary is an error on the stream and leaves out unchanged.
func (o *Ops) EmbeddingForward(gs gpu.Stream, gids, gwte, gwpe, gout gpu.Buffer, batch, seq, dim int) {
	nonNeg("embedding", batch, seq, dim)
	s := o.stream(gs)
	ids := o.typed(gids, "embedding ids", gpu.I32, batch*seq)
	wte, wpe := o.embTable(gwte, "embedding wte", dim, 1), o.embTable(gwpe, "embedding wpe", dim, seq)
	out := o.float(gout, "embedding out", batch*seq*dim)
	s.checkIDs(ids, batch*seq, wte.n/max(1, dim), codeEmbeddingID)
	s.launchN("emb_fwd", int64(batch*seq*dim), ids.p(), wte.p(), dt(wte), wpe.p(), dt(wpe), out.p(), dt(out),
		int64(batch*seq), int32(seq), int64(dim), s.badFlag())
}

// EmbeddingBackward accumulates dwte[ids[b,t],:] += dout[b,t,:] and
// dwpe[t,:] += dout[b,t,:]: each touched row is summed in fp32 in the order
// b, then t, from its old value, and rounded once — the bits of gpu/cpu.
// Positions holding the same id are linked (emb_links), and one thread
// per (first position, column) walks its list.
func (o *Ops) EmbeddingBackward(gs gpu.Stream, gids, gdout, gdwte, gdwpe gpu.Buffer, batch, seq, dim int) {
	nonNeg("embedding-backward", batch, seq, dim)
	s := o.stream(gs)
	ids := o.typed(gids, "embedding ids", gpu.I32, batch*seq)
	dwte, dwpe := o.embTable(gdwte, "embedding dwte", dim, 1), o.embTable(gdwpe, "embedding dwpe", dim, seq)
	dout := o.float(gdout, "embedding dout", batch*seq*dim)
	bt := batch * seq
	s.checkIDs(ids, bt, dwte.n/max(1, dim), codeEmbeddingID)
	if bt == 0 || dim == 0 {
		return
	}
	g := o.d.g
	s.run(func() error {
		links, free, err := s.scratch(int64(bt) * 8)
		if err != nil {
			return err
		}
		defer free()
		next, first := devPtr(links), devPtr(links+uint64(bt)*4)
		if err := g.launch(s.h, "emb_links", g.gridFor(int64(bt), 256), 256, 0, ids.p(), int64(bt), next, first, s.badFlag()); err != nil {
			return err
		}
		if err := g.launch(s.h, "emb_bwd_wte", g.gridFor(int64(bt*dim), 256), 256, 0, ids.p(), dout.p(), dt(dout), dwte.p(), dt(dwte),
			next, first, int64(bt), int64(dim), s.badFlag()); err != nil {
			return err
		}
		return g.launch(s.h, "emb_bwd_wpe", g.gridFor(int64(seq*dim), 256), 256, 0, dout.p(), dt(dout), dwpe.p(), dt(dwpe),
			int32(batch), int32(seq), int64(dim), s.badFlag())
	})
}
