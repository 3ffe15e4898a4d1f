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
	ops.LayerNormForward(s, x, w.Slice(o.ln1g, c), w.Slice(o.ln1b, c), la.ln1, la.ln1Mean, la.ln1Rstd, bt, c, eps)              // ln1 (bt×C)
	linearForward(ops, s, la.ln1, w.Slice(o.qkvW, 3*c*c), w.Slice(o.qkvB, 3*c), la.qkv, bt, c, 3*c)                             // qkv (bt×3C)
	m.loraForward(s, siteQKV, la.ln1, la.qkv)                                                                                   // + c_attn's adapter
	ops.AttentionForward(s, la.qkv, la.atty, la.lse, m.posBuffer(), m.batch, m.seq, h, h, m.shape.HeadDim(), gpu.AttnOptions{}) // atty (bt×C), lse (B×H×T)
	linearForward(ops, s, la.atty, w.Slice(o.projW, c*c), w.Slice(o.projB, c), la.res2, bt, c, c)                               // res2 (bt×C)
	m.loraForward(s, siteAttnOut, la.atty, la.res2)
	ops.AddLayerNormForward(s, x, la.res2, la.res2, w.Slice(o.ln2g, c), w.Slice(o.ln2b, c), la.ln2, la.ln2Mean, la.ln2Rstd, bt, c, eps) // res2 += x; ln2 (bt×C)
	ops.Gemm(s, false, true, bt, f, c, 1, la.ln2, w.Slice(o.fcW, f*c), 0, la.fch)                                                       // fch (bt×F), its bias below
	m.loraForward(s, siteUp, la.ln2, la.fch)
	ops.BiasGeluForward(s, la.fch, w.Slice(o.fcB, f), la.fchAct, bt, f) // fch += bias; gelu (bt×F)
	if recompute {
		return
	}
	linearForward(ops, s, la.fchAct, w.Slice(o.fcpW, c*f), w.Slice(o.fcpB, c), out, bt, f, c) // out (bt×C)
	m.loraForward(s, siteDown, la.fchAct, out)
	ops.Add(s, la.res2, out, out, bt*c)
}

// gpt2BlockBackward turns dres, the gradient with respect to a block's
// output, into the gradient with respect to its input x, from what the
// block saved in la, accumulating its parameter gradients into g (the
// weights' and biases' through wg, nil when the block is frozen) and its
// adapters' (loraBackward).
func (m *Model) gpt2BlockBackward(s gpu.Stream, w, g, x gpu.Buffer, la *layerActs, wg func(off, n int) gpu.Buffer) {
	ops, o, a := m.ops, m.bo, &m.a
	bt, c, f, h := m.batch*m.seq, m.shape.Dim, m.shape.FFNDim(), m.shape.Heads
	dres, dtmp := a.dres, a.dtmp

	// out = res2 + c_proj(gelu(fch)): dres flows to res2 unchanged.
	dgelu := a.dbig.Slice(0, bt*f)
	linearBackward(ops, s, dres, la.fchAct, w.Slice(o.fcpW, c*f), dgelu, wg(o.fcpW, c*f), wg(o.fcpB, c), bt, f, c)
	m.loraBackward(s, siteDown, dres, la.fchAct, dgelu)
	dfch := la.fchAct // gelu(fch) is no longer needed
	ops.GeluBackward(s, la.fch, dgelu, dfch, bt*f)
	linearBackward(ops, s, dfch, la.ln2, w.Slice(o.fcW, f*c), dtmp, wg(o.fcW, f*c), wg(o.fcB, f), bt, c, f)
	m.loraBackward(s, siteUp, dfch, la.ln2, dtmp)
	ops.LayerNormBackward(s, dtmp, la.res2, w.Slice(o.ln2g, c), la.ln2Mean, la.ln2Rstd, dres, g.Slice(o.ln2g, c), g.Slice(o.ln2b, c), bt, c)

	// res2 = x + c_proj(atty): dres flows to x unchanged.
	linearBackward(ops, s, dres, la.atty, w.Slice(o.projW, c*c), dtmp, wg(o.projW, c*c), wg(o.projB, c), bt, c, c)
	m.loraBackward(s, siteAttnOut, dres, la.atty, dtmp)
	dqkv := a.dbig.Slice(0, bt*3*c)
	ops.AttentionBackward(s, dtmp, la.qkv, la.atty, la.lse, m.posBuffer(), dqkv, m.batch, m.seq, h, h, m.shape.HeadDim(), gpu.AttnOptions{})
	linearBackward(ops, s, dqkv, la.ln1, w.Slice(o.qkvW, 3*c*c), dtmp, wg(o.qkvW, 3*c*c), wg(o.qkvB, 3*c), bt, c, 3*c)
	m.loraBackward(s, siteQKV, dqkv, la.ln1, dtmp)
	ops.LayerNormBackward(s, dtmp, x, w.Slice(o.ln1g, c), la.ln1Mean, la.ln1Rstd, dres, g.Slice(o.ln1g, c), g.Slice(o.ln1b, c), bt, c)
}
