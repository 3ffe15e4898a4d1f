package model

import "github.com/strata-ai/strata/gpu"

// The Llama family's block (Hugging Face's LlamaDecoderLayer; Qwen2 adds
// q, k and v biases): pre-RMSNorm, grouped-query attention with rotary
// positions, SwiGLU MLP. B·T = bt rows, C the width, H query heads and KV
// key/value heads of D = C/H, Q = (H + 2·KV)·D the packed q|k|v width, F
// the MLP width. q_proj, k_proj and v_proj are adjacent in the chunk (one
// Q×C GEMM), and so are gate_proj and up_proj (one 2F×C GEMM).

// llamaBlockForward runs a block with its parameter chunk w from its
// input x, saving into la:
//
//	res2 = x + o_proj(attn(rope(qkv_proj(rmsnorm_1(x)))))
//	out  = res2 + down_proj(silu(gate_proj(h)) · up_proj(h)), h = rmsnorm_2(res2)
//
// With recompute it stops after SwiGLU (out is nil): the backward reads
// everything but out.
func (m *Model) llamaBlockForward(s gpu.Stream, w, x, out gpu.Buffer, la *layerActs, recompute bool) {
	ops, o := m.ops, m.lo
	bt, c, f, q := m.batch*m.seq, m.shape.Dim, m.shape.FFNDim(), qkvWidth(m.shape)
	h, kv, d := m.shape.Heads, m.shape.KVHeadCount(), m.shape.HeadDim()
	eps, theta := float32(m.shape.Eps()), float32(m.shape.Theta())
	ops.RMSNormForward(s, x, w.Slice(o.ln1, c), la.ln1, la.ln1Rstd, bt, c, eps)               // ln1 (bt×C)
	linearForward(ops, s, la.ln1, w.Slice(o.qkvW, q*c), m.qkvBias(w), la.qkv, bt, c, q)       // qkv (bt×Q)
	m.loraForward(s, siteQKV, la.ln1, la.qkv)                                                 // + q, k, v adapters
	ops.RopeForward(s, la.qkv, m.posBuffer(), m.batch, m.seq, h, kv, d, theta)                // q, k rotated in place
	ops.AttentionForward(s, la.qkv, la.atty, la.lse, m.posBuffer(), m.batch, m.seq, h, kv, d) // atty (bt×C), lse (B×H×T)
	linearForward(ops, s, la.atty, w.Slice(o.oW, c*c), nil, la.res2, bt, c, c)                // res2 (bt×C); below: res2 += x, ln2 (bt×C)
	m.loraForward(s, siteAttnOut, la.atty, la.res2)
	ops.AddRMSNormForward(s, x, la.res2, la.res2, w.Slice(o.ln2, c), la.ln2, la.ln2Rstd, bt, c, eps)
	linearForward(ops, s, la.ln2, w.Slice(o.gateUpW, 2*f*c), nil, la.fch, bt, c, 2*f) // gate|up (bt×2F)
	m.loraForward(s, siteUp, la.ln2, la.fch)
	ops.SwiGLUForward(s, la.fch, la.fchAct, bt, f) // silu(gate)·up (bt×F)
	if recompute {
		return
	}
	linearForward(ops, s, la.fchAct, w.Slice(o.downW, c*f), nil, out, bt, f, c) // out (bt×C)
	m.loraForward(s, siteDown, la.fchAct, out)
	ops.Add(s, la.res2, out, out, bt*c) // + res2
}

// qkvBias is the fused q|k|v bias of block chunk w (Qwen2), or nil.
func (m *Model) qkvBias(w gpu.Buffer) gpu.Buffer {
	if m.lo.qkvB < 0 {
		return nil
	}
	return w.Slice(m.lo.qkvB, qkvWidth(m.shape))
}

// llamaBlockBackward turns dres, the gradient with respect to a block's
// output, into the gradient with respect to its input x, from what the
// block saved in la, accumulating its parameter gradients into g (the
// weights' and biases' through wg, nil when the block is frozen) and its
// adapters' (loraBackward).
func (m *Model) llamaBlockBackward(s gpu.Stream, w, g, x gpu.Buffer, la *layerActs, wg func(off, n int) gpu.Buffer) {
	ops, o, a := m.ops, m.lo, &m.a
	bt, c, f, q := m.batch*m.seq, m.shape.Dim, m.shape.FFNDim(), qkvWidth(m.shape)
	h, kv, d := m.shape.Heads, m.shape.KVHeadCount(), m.shape.HeadDim()
	theta := float32(m.shape.Theta())
	dres, dtmp := a.dres, a.dtmp

	// out = res2 + down_proj(act): dres flows to res2 unchanged. The down
	// projection's weight gradient reads act first; then d act overwrites
	// it (act is no longer needed).
	if dw := wg(o.downW, c*f); dw != nil {
		ops.Gemm(s, true, false, c, f, bt, 1, dres, la.fchAct, 1, dw) // d down += dresᵀ·act
	}
	m.loraBackward(s, siteDown, dres, la.fchAct, nil) // reads act before it becomes d act
	dact := la.fchAct
	ops.Gemm(s, false, false, bt, f, c, 1, dres, w.Slice(o.downW, c*f), 0, dact) // d act (bt×F) = dres·down
	m.loraInputGrad(s, siteDown, dact)
	dgu := a.dbig.Slice(0, bt*2*f)
	ops.SwiGLUBackward(s, la.fch, dact, dgu, bt, f) // d gate|up (bt×2F)
	linearBackward(ops, s, dgu, la.ln2, w.Slice(o.gateUpW, 2*f*c), dtmp, wg(o.gateUpW, 2*f*c), nil, bt, c, 2*f)
	m.loraBackward(s, siteUp, dgu, la.ln2, dtmp)
	ops.RMSNormBackward(s, dtmp, la.res2, w.Slice(o.ln2, c), la.ln2Rstd, dres, g.Slice(o.ln2, c), bt, c)

	// res2 = x + o_proj(atty): dres flows to x unchanged.
	linearBackward(ops, s, dres, la.atty, w.Slice(o.oW, c*c), dtmp, wg(o.oW, c*c), nil, bt, c, c) // d atty (bt×C)
	m.loraBackward(s, siteAttnOut, dres, la.atty, dtmp)
	dqkv := a.dbig.Slice(0, bt*q)
	ops.AttentionBackward(s, dtmp, la.qkv, la.atty, la.lse, m.posBuffer(), dqkv, m.batch, m.seq, h, kv, d) // d rotated qkv (bt×Q)
	ops.RopeBackward(s, dqkv, m.posBuffer(), m.batch, m.seq, h, kv, d, theta)                              // d qkv
	var dbias gpu.Buffer
	if o.qkvB >= 0 {
		dbias = wg(o.qkvB, q)
	}
	linearBackward(ops, s, dqkv, la.ln1, w.Slice(o.qkvW, q*c), dtmp, wg(o.qkvW, q*c), dbias, bt, c, q) // d ln1 (bt×C)
	m.loraBackward(s, siteQKV, dqkv, la.ln1, dtmp)
	ops.RMSNormBackward(s, dtmp, x, w.Slice(o.ln1, c), la.ln1Rstd, dres, g.Slice(o.ln1, c), bt, c)
}
