package model

import "github.com/strata-ai/strata/gpu"

// GPT-2's block: pre-LN, causal self-attention with c_attn's packed q|k|v
// (heads = key/value heads), GELU MLP. B·T = bt rows, C the width, F the
// MLP width, H heads of D = C/H.

// gpt2BlockForward runs a block with its parameter chunk w from its input
// x, saving into la:
//
//	res2 = x + c_proj(attn(c_attn(ln_1(x))))
//	out  = res2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(res2))))
//
// With recompute it stops after gelu (out is nil): the backward reads
// everything but out.
func (m *Model) gpt2BlockForward(s gpu.Stream, w, x, out gpu.Buffer, la *layerActs, recompute bool) {
	ops, o := m.ops, m.bo
	bt, c, f, h := m.batch*m.seq, m.shape.Dim, m.shape.FFNDim(), m.shape.Heads
	eps := float32(m.shape.Eps())
	ops.LayerNormForward(s, x, w.Slice(o.ln1g, c), w.Slice(o.ln1b, c), la.ln1, la.ln1Mean, la.ln1Rstd, bt, c, eps) // ln1 (bt×C)
	linearForward(ops, s, la.ln1, w.Slice(o.qkvW, 3*c*c), w.Slice(o.qkvB, 3*c), la.qkv, bt, c, 3*c)                // qkv (bt×3C)
	ops.AttentionForward(s, la.qkv, la.atty, la.lse, m.posBuffer(), m.batch, m.seq, h, h, m.shape.HeadDim())       // atty (bt×C), lse (B×H×T)
	linearForward(ops, s, la.atty, w.Slice(o.projW, c*c), w.Slice(o.projB, c), la.res2, bt, c, c)                  // res2 (bt×C)
	ops.Add(s, x, la.res2, la.res2, bt*c)
	ops.LayerNormForward(s, la.res2, w.Slice(o.ln2g, c), w.Slice(o.ln2b, c), la.ln2, la.ln2Mean, la.ln2Rstd, bt, c, eps) // ln2 (bt×C)
	linearForward(ops, s, la.ln2, w.Slice(o.fcW, f*c), w.Slice(o.fcB, f), la.fch, bt, c, f)                              // fch (bt×F)
	ops.GeluForward(s, la.fch, la.fchAct, bt*f)                                                                          // gelu (bt×F)
	if recompute {
		return
	}
	linearForward(ops, s, la.fchAct, w.Slice(o.fcpW, c*f), w.Slice(o.fcpB, c), out, bt, f, c) // out (bt×C)
	ops.Add(s, la.res2, out, out, bt*c)
}

// gpt2BlockBackward turns dres, the gradient with respect to a block's
// output, into the gradient with respect to its input x, from what the
// block saved in la, accumulating its parameter gradients into g.
func (m *Model) gpt2BlockBackward(s gpu.Stream, w, g, x gpu.Buffer, la *layerActs) {
	ops, o, a := m.ops, m.bo, &m.a
	bt, c, f, h := m.batch*m.seq, m.shape.Dim, m.shape.FFNDim(), m.shape.Heads
	dres, dtmp := a.dres, a.dtmp

	// out = res2 + c_proj(gelu(fch)): dres flows to res2 unchanged.
	dgelu := a.dbig.Slice(0, bt*f)
	linearBackward(ops, s, dres, la.fchAct, w.Slice(o.fcpW, c*f), dgelu, g.Slice(o.fcpW, c*f), g.Slice(o.fcpB, c), bt, f, c)
	dfch := la.fchAct // gelu(fch) is no longer needed
	ops.GeluBackward(s, la.fch, dgelu, dfch, bt*f)
	linearBackward(ops, s, dfch, la.ln2, w.Slice(o.fcW, f*c), dtmp, g.Slice(o.fcW, f*c), g.Slice(o.fcB, f), bt, c, f)
	ops.LayerNormBackward(s, dtmp, la.res2, w.Slice(o.ln2g, c), la.ln2Mean, la.ln2Rstd, dres, g.Slice(o.ln2g, c), g.Slice(o.ln2b, c), bt, c)

	// res2 = x + c_proj(atty): dres flows to x unchanged.
	linearBackward(ops, s, dres, la.atty, w.Slice(o.projW, c*c), dtmp, g.Slice(o.projW, c*c), g.Slice(o.projB, c), bt, c, c)
	dqkv := a.dbig.Slice(0, bt*3*c)
	ops.AttentionBackward(s, dtmp, la.qkv, la.atty, la.lse, m.posBuffer(), dqkv, m.batch, m.seq, h, h, m.shape.HeadDim())
	linearBackward(ops, s, dqkv, la.ln1, w.Slice(o.qkvW, 3*c*c), dtmp, g.Slice(o.qkvW, 3*c*c), g.Slice(o.qkvB, 3*c), bt, c, 3*c)
	ops.LayerNormBackward(s, dtmp, x, w.Slice(o.ln1g, c), la.ln1Mean, la.ln1Rstd, dres, g.Slice(o.ln1g, c), g.Slice(o.ln1b, c), bt, c)
}
