package cuda

import (
	"fmt"
	"math"
)

// rowThreads is NT of kernels.cu: the block size of row-wise kernels.
const rowThreads = 256

// LayerNormForward: one block per row; mean and variance summed in double
// over a fixed tree; rstd = 1/sqrt(var+eps); y in fp32 from the stored
// mean and rstd.
func (o *kernels) LayerNormForward(s *Stream, x, gamma, beta, y, mean, rstd *Buffer, rows, cols int, eps float32) {
	s.launch("layernorm_fwd", uint32(rows), rowThreads, x.p(), dt(x), gamma.p(), dt(gamma), beta.p(), dt(beta),
		y.p(), dt(y), mean.p(), rstd.p(), int64(cols), eps)
}

// LayerNormBackward accumulates dx (one block per row, double sums) and
// dgamma, dbeta (one thread per column, fp32 in row order).
func (o *kernels) LayerNormBackward(s *Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta *Buffer, rows, cols int) {
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
func (o *kernels) AttentionForward(s *Stream, qkv, out, att *Buffer, batch, seq, heads, headDim int) {
	checkGrid("attention", batch*heads*seq)
	scale := float32(1 / math.Sqrt(float64(headDim)))
	s.launch("attn_fwd", uint32(batch*heads*seq), rowThreads, qkv.p(), dt(qkv), out.p(), dt(out), att.p(),
		int32(seq), int32(heads), int32(headDim), scale)
}

// AttentionBackward writes dqkv: dS = P ⊙ (dO·Vᵀ - rowsum(P ⊙ dO·Vᵀ)) *
// scale into scratch (batch×heads×seq×seq fp32, outside the budget), then
// dQ = dS·K, dK = dSᵀ·Q, dV = Pᵀ·dO, each element summed in a fixed order.
func (o *kernels) AttentionBackward(s *Stream, dout, qkv, att, dqkv *Buffer, batch, seq, heads, headDim int) {
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
func (o *kernels) CrossEntropyForward(s *Stream, logits, targets, losses *Buffer, rows, vocab int) {
	s.checkIDs(targets, rows, vocab, codeTarget)
	s.launch("xent_fwd", uint32(rows), rowThreads, logits.p(), dt(logits), targets.p(), losses.p(), dt(losses), int64(vocab), s.badFlag())
}

// CrossEntropyBackward: dlogits = (softmax(logits) - onehot(target)) *
// scale; dlogits may be the logits buffer itself.
func (o *kernels) CrossEntropyBackward(s *Stream, logits, targets, dlogits *Buffer, rows, vocab int, scale float32) {
	s.checkIDs(targets, rows, vocab, codeTarget)
	s.launch("xent_bwd", uint32(rows), rowThreads, logits.p(), dt(logits), targets.p(), dlogits.p(), dt(dlogits),
		int64(vocab), scale, s.badFlag())
}

// EmbeddingForward: out[b,t,:] = wte[ids[b,t],:] + wpe[t,:]. An id outside
// the vocabulary is an error on the stream and leaves out unchanged.
func (o *kernels) EmbeddingForward(s *Stream, ids, wte, wpe, out *Buffer, batch, seq, dim int) {
	s.checkIDs(ids, batch*seq, wte.Len()/max(1, dim), codeEmbeddingID)
	s.launchN("emb_fwd", int64(batch*seq*dim), ids.p(), wte.p(), dt(wte), wpe.p(), dt(wpe), out.p(), dt(out),
		int64(batch*seq), int32(seq), int64(dim), s.badFlag())
}

// EmbeddingBackward accumulates dwte[ids[b,t],:] += dout[b,t,:] and
// dwpe[t,:] += dout[b,t,:]: each touched row is summed in fp32 in the order
// b, then t, from its old value, and rounded once — the bits of gpu/cpu.
// Positions holding the same id are linked (emb_links), and one thread
// per (first position, column) walks its list.
func (o *kernels) EmbeddingBackward(s *Stream, ids, dout, dwte, dwpe *Buffer, batch, seq, dim int) {
	bt := batch * seq
	s.checkIDs(ids, bt, dwte.Len()/max(1, dim), codeEmbeddingID)
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
