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
func (o *kernels) LayerNormForward(s *Stream, x, gamma, beta, y, mean, rstd *Buffer, rows, cols int, eps float32) {
	checkGrid("layernorm", rows)
	s.launch("layernorm_fwd", uint32(rows), rowThreads, x.p(), dt(x), devPtr(0), int32(0), devPtr(0), int32(0),
		gamma.p(), dt(gamma), beta.p(), dt(beta), y.p(), dt(y), mean.p(), rstd.p(), int64(cols), eps)
}

// AddLayerNormForward: layernorm_fwd with the residual, as
// AddRMSNormForward: each chunk of a + b is added in fp32, stored once into
// sum and normalised from the stored value, so sum, y, mean and rstd have
// the bits of Add and LayerNormForward (the same kernel, chunks and trees).
func (o *kernels) AddLayerNormForward(s *Stream, a, b, sum, gamma, beta, y, mean, rstd *Buffer, rows, cols int, eps float32) {
	checkGrid("add-layernorm", rows)
	s.launch("layernorm_fwd", uint32(rows), rowThreads, a.p(), dt(a), b.p(), dt(b), sum.p(), dt(sum),
		gamma.p(), dt(gamma), beta.p(), dt(beta), y.p(), dt(y), mean.p(), rstd.p(), int64(cols), eps)
}

// LayerNormBackward accumulates dx (one block per row, double sums) and
// dgamma, dbeta (column sums in fp32 in gpu.ColumnBlockRows order: a
// thread per block of rows and column, then colsum_final).
func (o *kernels) LayerNormBackward(s *Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta *Buffer, rows, cols int) {
	s.launch("layernorm_bwd_dx", uint32(rows), rowThreads, dy.p(), dt(dy), x.p(), dt(x), gamma.p(), dt(gamma),
		mean.p(), rstd.p(), dx.p(), dt(dx), int64(cols))
	g := o.d.g
	s.columnSums(rows, cols, func(parts []devPtr, grid uint32) error {
		return g.launch(s.h, "layernorm_bwd_params_part", grid, 256, 0, dy.p(), dt(dy), x.p(), dt(x), mean.p(), rstd.p(),
			parts[0], parts[1], int64(rows), int64(cols))
	}, dgamma, dbeta)
}

func checkGrid(op string, blocks int) {
	if blocks > math.MaxInt32 {
		panic(fmt.Sprintf("gpu/cuda: %s: %d blocks", op, blocks))
	}
}

// RMSNormForward: one block per row in chunks of 8 columns (16-byte
// vectors of bf16 where aligned); the sum of squares in double, chunks in
// order, then a fixed tree; rstd = 1/sqrt(mean(x²)+eps); y = x*rstd*gamma
// in fp32.
func (o *kernels) RMSNormForward(s *Stream, x, gamma, y, rstd *Buffer, rows, cols int, eps float32) {
	checkGrid("rmsnorm", rows)
	s.launch("rmsnorm_fwd", uint32(rows), rowThreads, x.p(), dt(x), devPtr(0), int32(0), devPtr(0), int32(0),
		gamma.p(), dt(gamma), y.p(), dt(y), rstd.p(), int64(cols), eps)
}

// AddRMSNormForward: rmsnorm_fwd with the residual: each chunk of a + b is
// added in fp32, stored once into sum and normalised from the stored
// value, so sum, y and rstd have the bits of Add and RMSNormForward (the
// same kernel, chunks and tree) while the row crosses DRAM once less.
func (o *kernels) AddRMSNormForward(s *Stream, a, b, sum, gamma, y, rstd *Buffer, rows, cols int, eps float32) {
	checkGrid("add-rmsnorm", rows)
	s.launch("rmsnorm_fwd", uint32(rows), rowThreads, a.p(), dt(a), b.p(), dt(b), sum.p(), dt(sum),
		gamma.p(), dt(gamma), y.p(), dt(y), rstd.p(), int64(cols), eps)
}

// RMSNormBackward accumulates dx (one block per row, double sums) and
// dgamma (column sums as LayerNormBackward's parameter gradients:
// deterministic, no atomics).
func (o *kernels) RMSNormBackward(s *Stream, dy, x, gamma, rstd, dx, dgamma *Buffer, rows, cols int) {
	checkGrid("rmsnorm-backward", rows)
	s.launch("rmsnorm_bwd_dx", uint32(rows), rowThreads, dy.p(), dt(dy), x.p(), dt(x), gamma.p(), dt(gamma), rstd.p(),
		dx.p(), dt(dx), int64(cols))
	g := o.d.g
	s.columnSums(rows, cols, func(parts []devPtr, grid uint32) error {
		return g.launch(s.h, "rmsnorm_bwd_gamma_part", grid, 256, 0, dy.p(), dt(dy), x.p(), dt(x), rstd.p(),
			parts[0], int64(rows), int64(cols))
	}, dgamma)
}

// vecElems is VEC of kernels.cu: the elements of a chunk (16 bytes of bf16).
const vecElems = 8

// gluChunks is the threads of the GLU kernels: one per chunk of 8
// columns of gate (the last of a row may be short).
func gluChunks(rows, ffn int) int64 {
	return int64(rows) * ((int64(ffn) + vecElems - 1) / vecElems)
}

// gluActs maps each gpu.GLUAct to kernels.cu's code (GLU_SILU,
// GLU_GELU_TANH); the front end refuses any other act.
var gluActs = map[gpu.GLUAct]int32{gpu.Silu: 0, gpu.GeluTanh: 1}

func gluAct(act gpu.GLUAct) int32 {
	c, ok := gluActs[act]
	if !ok {
		panic(fmt.Sprintf("gpu/cuda: GLU activation %v has no kernel", act))
	}
	return c
}

// GLUForward: y = act(gate) * up in double (SwiGLU: silu; GeGLU: GELU's
// tanh form), rounded once; one thread per chunk of 8 columns (16-byte
// vectors of bf16 where aligned).
func (o *kernels) GLUForward(s *Stream, gateUp, y *Buffer, rows, ffn int, act gpu.GLUAct) {
	n := gluChunks(rows, ffn)
	s.launchN("glu_fwd", n, gateUp.p(), dt(gateUp), y.p(), dt(y), int64(ffn), gluAct(act), n)
}

// GLUBackward writes dgateUp: d gate = dy*up*act'(gate), d up =
// dy*act(gate), one thread per chunk of 8 columns of gate.
func (o *kernels) GLUBackward(s *Stream, gateUp, dy, dgateUp *Buffer, rows, ffn int, act gpu.GLUAct) {
	n := gluChunks(rows, ffn)
	s.launchN("glu_bwd", n, gateUp.p(), dt(gateUp), dy.p(), dt(dy), dgateUp.p(), dt(dgateUp), int64(ffn), gluAct(act), n)
}

// CrossEntropyForward: one block per row; losses[r] = log(sum exp(z-max))
// + max - z[target] with the sum in double, z the logits or, with softCap
// > 0, softCap·tanh(logits/softCap) (double, rounded to fp32, recomputed
// from the stored logits), or 0 where the target is < 0 (ignored). A
// target >= vocab is an error on the stream and leaves losses unchanged.
func (o *kernels) CrossEntropyForward(s *Stream, logits, targets, losses *Buffer, rows, vocab int, softCap float32) {
	checkGrid("cross-entropy", rows)
	s.checkIDs(targets, rows, math.MinInt32, vocab, codeTarget, false)
	s.launch("xent_fwd", uint32(rows), rowThreads, logits.p(), dt(logits), targets.p(), losses.p(), dt(losses), int64(vocab),
		softCap, s.badFlag())
}

// CrossEntropyBackward: dlogits = (softmax(z) - onehot(target)) * scale,
// times 1 - (z/softCap)² with softCap > 0 (z as in the forward), or 0 for
// a row whose target is < 0; dlogits may be the logits buffer itself.
func (o *kernels) CrossEntropyBackward(s *Stream, logits, targets, dlogits *Buffer, rows, vocab int, scale, softCap float32) {
	checkGrid("cross-entropy-backward", rows)
	s.checkIDs(targets, rows, math.MinInt32, vocab, codeTarget, false)
	s.launch("xent_bwd", uint32(rows), rowThreads, logits.p(), dt(logits), targets.p(), dlogits.p(), dt(dlogits),
		int64(vocab), scale, softCap, s.badFlag())
}

// optP is b's device address, or 0 (a null pointer in the kernel) for an
// absent optional buffer; optDT its dtype code, 0 when absent.
func optP(b *Buffer) devPtr {
	if b == nil {
		return 0
	}
	return b.p()
}

func optDT(b *Buffer) int32 {
	if b == nil {
		return 0
	}
	return dt(b)
}

// checkEmbedding enqueues the runtime checks of an embedding op: ids in
// [0, vocab) and, with a position table, pos in [0, its rows).
func (s *Stream) checkEmbedding(ids, pos, table, wpe *Buffer, n, dim int) {
	s.checkIDs(ids, n, 0, table.Len()/max(1, dim), codeEmbeddingID, false)
	if wpe != nil && pos != nil {
		s.checkIDs(pos, n, 0, wpe.Len()/max(1, dim), codePos, true)
	}
}

// EmbeddingForward: out[b,t,:] = wte[ids[b,t],:] (+ wpe[pos[b,t],:], pos
// nil meaning t, when wpe is not nil). An id outside the vocabulary or a
// position outside wpe is an error on the stream and leaves out
// unchanged.
func (o *kernels) EmbeddingForward(s *Stream, ids, pos, wte, wpe, out *Buffer, batch, seq, dim int) {
	s.checkEmbedding(ids, pos, wte, wpe, batch*seq, dim)
	s.launchN("emb_fwd", int64(batch*seq*dim), ids.p(), optP(pos), wte.p(), dt(wte), optP(wpe), optDT(wpe), out.p(), dt(out),
		int64(batch*seq), int32(seq), int64(dim), s.badFlag())
}

// EmbeddingBackward accumulates dwte[ids[b,t],:] += dout[b,t,:] and, when
// dwpe is not nil, dwpe[pos[b,t],:] += dout[b,t,:]: each touched row is
// summed in fp32 in the order b, then t, from its old value, and rounded
// once — the bits of gpu/cpu. Positions holding the same key (id, or
// position with pos) are linked (emb_links), and one thread per (first
// position, column) walks its list; without pos, dwpe's row t is summed
// over b by one thread per (t, column).
func (o *kernels) EmbeddingBackward(s *Stream, ids, pos, dout, dwte, dwpe *Buffer, batch, seq, dim int) {
	bt := batch * seq
	s.checkEmbedding(ids, pos, dwte, dwpe, bt, dim)
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
		rows := func(keys, table *Buffer) error {
			if err := g.launch(s.h, "emb_links", g.gridFor(int64(bt), 256), 256, 0, keys.p(), int64(bt), next, first, s.badFlag()); err != nil {
				return err
			}
			return g.launch(s.h, "emb_bwd_rows", g.gridFor(int64(bt*dim), 256), 256, 0, keys.p(), dout.p(), dt(dout), table.p(), dt(table),
				next, first, int64(bt), int64(dim), s.badFlag())
		}
		if err := rows(ids, dwte); err != nil || dwpe == nil {
			return err
		}
		if pos != nil { // the links of the positions reuse the scratch, in stream order
			return rows(pos, dwpe)
		}
		return g.launch(s.h, "emb_bwd_wpe", g.gridFor(int64(seq*dim), 256), 256, 0, dout.p(), dt(dout), dwpe.p(), dt(dwpe),
			int32(batch), int32(seq), int64(dim), s.badFlag())
	})
}
