package model

import "github.com/strata-ai/strata/gpu"

// The Llama family's block (Hugging Face's LlamaDecoderLayer and its
// relatives): pre-RMSNorm, grouped-query attention with rotary positions,
// a gated MLP. B·T = bt rows, C the width, H query heads and KV key/value
// heads of D values (A = H·D, C unless head_dim says otherwise), Q = A +
// 2·KV·D the packed q|k|v width, F the MLP width. q_proj, k_proj and v_proj
// are adjacent in the chunk (one Q×C GEMM), and so are gate_proj and up_proj
// (one 2F×C GEMM). The members' variants (rope.go): Qwen2's q, k, v biases;
// Qwen3's and Gemma 3's q_norm and k_norm (an RMSNorm over each head before
// the rotation); the rope type, partial rotary and a sliding window per
// layer; Gemma's norms by 1 + weight (normGains), its norm after the
// attention and around the MLP, GeGLU, scale and soft cap.

// llamaBlockForward runs block l with its parameter chunk w from its input
// x, saving into la:
//
//	res2 = x + o_proj(attn(rope(norm_qk(qkv_proj(rmsnorm_1(x))))))
//	out  = res2 + down_proj(act(gate_proj(h)) · up_proj(h)), h = rmsnorm_2(res2)
//
// and Gemma's:
//
//	res2 = x + post_attention_norm(o_proj(attn(…)))
//	out  = res2 + post_feedforward_norm(down_proj(gelu(gate_proj(h)) · up_proj(h))), h = pre_feedforward_norm(res2)
//
// With recompute it stops after the gated activation (out is nil): the
// backward reads everything but out (Gemma's goes on to down_proj's output
// and its norm's statistics, which its backward reads).
func (m *Model) llamaBlockForward(s gpu.Stream, w, x, out gpu.Buffer, la *layerActs, recompute bool) {
	ops, o, sh, l := m.ops, m.lo, m.shape, m.layer
	bt, c, f, q, at := m.batch*m.seq, sh.Dim, sh.FFNDim(), qkvWidth(sh), sh.AttnDim()
	h, kv, d := sh.Heads, sh.KVHeadCount(), sh.HeadDim()
	eps := float32(sh.Eps())
	g := m.normGains(s, w)
	ops.RMSNormForward(s, x, g(o.ln1, c), la.ln1, la.ln1Rstd, bt, c, eps)               // ln1 (bt×C)
	linearForward(ops, s, la.ln1, w.Slice(o.qkvW, q*c), m.qkvBias(w), la.qkv, bt, c, q) // qkv (bt×Q)
	m.loraForward(s, siteQKV, la.ln1, la.qkv)                                           // + q, k, v adapters
	if sh.QKNorm() {
		m.qkNormForward(s, g, la)
	}
	ops.RopeForward(s, la.qkv, m.posBuffer(), m.batch, m.seq, h, kv, d, m.rope(l))                           // q, k rotated in place
	ops.AttentionForward(s, la.qkv, la.atty, la.lse, m.posBuffer(), m.batch, m.seq, h, kv, d, sh.AttnFor(l)) // atty (bt×A), lse (B×H×T)
	if sh.Gemma() {
		linearForward(ops, s, la.atty, w.Slice(o.oW, c*at), nil, la.attnOut, bt, at, c)
		m.loraForward(s, siteAttnOut, la.atty, la.attnOut)
		ops.RMSNormForward(s, la.attnOut, g(o.ln2, c), la.res2, la.attnRstd, bt, c, eps) // the post-attention norm, into res2; below: res2 += x
		ops.AddRMSNormForward(s, x, la.res2, la.res2, g(o.preFF, c), la.ln2, la.ln2Rstd, bt, c, eps)
	} else {
		linearForward(ops, s, la.atty, w.Slice(o.oW, c*at), nil, la.res2, bt, at, c) // res2 (bt×C); below: res2 += x, ln2 (bt×C)
		m.loraForward(s, siteAttnOut, la.atty, la.res2)
		ops.AddRMSNormForward(s, x, la.res2, la.res2, g(o.ln2, c), la.ln2, la.ln2Rstd, bt, c, eps)
	}
	if sh.SparseLayer(l) { // the router's logits; moeForward runs the experts and writes out
		ops.Gemm(s, false, true, bt, sh.Experts, c, 1, la.ln2, w.Slice(o.router, sh.Experts*c), 0, m.a.moeLogits)
		m.loraForward(s, siteRouter, la.ln2, m.a.moeLogits)
		return
	}
	linearForward(ops, s, la.ln2, w.Slice(o.gateUpW, 2*f*c), nil, la.fch, bt, c, 2*f) // gate|up (bt×2F)
	m.loraForward(s, siteUp, la.ln2, la.fch)
	ops.GLUForward(s, la.fch, la.fchAct, bt, f, mlpAct(sh)) // act(gate)·up (bt×F)
	if sh.Gemma() {
		linearForward(ops, s, la.fchAct, w.Slice(o.downW, c*f), nil, la.mlpOut, bt, f, c)
		m.loraForward(s, siteDown, la.fchAct, la.mlpOut)
		y := out
		if recompute {
			y = m.a.dtmp.Slice(0, bt*c) // only the statistics are kept
		}
		ops.RMSNormForward(s, la.mlpOut, g(o.postFF, c), y, la.mlpRstd, bt, c, eps)
		if !recompute {
			ops.Add(s, la.res2, out, out, bt*c)
		}
		return
	}
	if recompute {
		return
	}
	linearForward(ops, s, la.fchAct, w.Slice(o.downW, c*f), nil, out, bt, f, c) // out (bt×C)
	m.loraForward(s, siteDown, la.fchAct, out)
	ops.Add(s, la.res2, out, out, bt*c) // + res2
}

// mlpAct is the gated MLP's activation of s: GeGLU for Gemma, else SwiGLU.
func mlpAct(s Shape) gpu.GLUAct {
	if s.Gemma() {
		return gpu.GeluTanh
	}
	return gpu.Silu
}

// rope is block l's rotary embedding for the last Forward's positions.
func (m *Model) rope(l int) gpu.Rope { return m.shape.RopeFor(l, m.ropeLen) }

// qkvBias is the fused q|k|v bias of block chunk w (Qwen2), or nil.
func (m *Model) qkvBias(w gpu.Buffer) gpu.Buffer {
	if m.lo.qkvB < 0 {
		return nil
	}
	return w.Slice(m.lo.qkvB, qkvWidth(m.shape))
}

// normGains returns the gain of each norm of block chunk w, by the
// norm's offset and width: the weight itself, or for Gemma 1 + weight
// (fp32, in the gains scratch, computed now for every norm of the block,
// as Gemma's RMSNorm computes it).
func (m *Model) normGains(s gpu.Stream, w gpu.Buffer) func(off, n int) gpu.Buffer {
	return gemmaGains(m.ops, s, m.shape, w, m.a.gains, m.lo)
}

// gemmaGains is normGains for any block chunk w and scratch gains.
func gemmaGains(ops gpu.Ops, s gpu.Stream, sh Shape, w, gains gpu.Buffer, o llamaOffsets) func(off, n int) gpu.Buffer {
	if !sh.Gemma() {
		return func(off, n int) gpu.Buffer { return w.Slice(off, n) }
	}
	at := map[int]gpu.Buffer{}
	next := 0
	for _, nm := range []struct{ off, n int }{{o.ln1, sh.Dim}, {o.ln2, sh.Dim}, {o.preFF, sh.Dim}, {o.postFF, sh.Dim}, {o.qNorm, sh.HeadDim()}, {o.kNorm, sh.HeadDim()}} {
		if nm.off < 0 {
			continue
		}
		gb := gains.Slice(next, nm.n)
		next += nm.n
		ops.Fill(s, gb, 1)
		ops.Axpy(s, 1, w.Slice(nm.off, nm.n), gb)
		at[nm.off] = gb
	}
	return func(off, n int) gpu.Buffer { return at[off] }
}

// qkNormForward normalises each query and key head of la.qkv in place
// (q_norm, k_norm), keeping the heads before it (la.qkPre: the B·T·H·D
// queries, then the B·T·KV·D keys) and each head's rstd (la.qkRstd).
func (m *Model) qkNormForward(s gpu.Stream, g func(off, n int) gpu.Buffer, la *layerActs) {
	ops, sh, o := m.ops, m.shape, m.lo
	bt, q, d := m.batch*m.seq, qkvWidth(sh), sh.HeadDim()
	h, kv := sh.Heads, sh.KVHeadCount()
	eps := float32(sh.Eps())
	for _, p := range qkParts(h, kv, d) {
		pre := la.qkPre.Slice(bt*p.col, bt*p.width)
		tmp := m.a.dbig.Slice(0, bt*p.width)
		ops.AddColumns(s, pre, la.qkv, bt, p.width, p.width, 0, q, p.col, 0)
		gain := g(o.qNorm, d)
		if p.key {
			gain = g(o.kNorm, d)
		}
		ops.RMSNormForward(s, pre, gain, tmp, la.qkRstd.Slice(bt*p.col/d, bt*p.heads), bt*p.heads, d, eps)
		ops.AddColumns(s, la.qkv, tmp, bt, p.width, q, p.col, p.width, 0, 0)
	}
}

// qkPart is the queries' or the keys' columns of a packed qkv row.
type qkPart struct {
	col, width, heads int
	key               bool
}

func qkParts(h, kv, d int) []qkPart {
	return []qkPart{{0, h * d, h, false}, {h * d, kv * d, kv, true}}
}

// qkNormBackward turns the gradient with respect to the normalised query
// and key heads in dqkv into the gradient with respect to them before the
// norms, in place, accumulating q_norm's and k_norm's gradients into gb
// (the block's gradient). dy and dx are scratch of B·T·H·D values each.
func (m *Model) qkNormBackward(s gpu.Stream, g func(off, n int) gpu.Buffer, gb, dqkv, dy, dx gpu.Buffer, la *layerActs) {
	ops, sh, o := m.ops, m.shape, m.lo
	bt, q, d := m.batch*m.seq, qkvWidth(sh), sh.HeadDim()
	for _, p := range qkParts(sh.Heads, sh.KVHeadCount(), d) {
		off := o.qNorm
		if p.key {
			off = o.kNorm
		}
		y, x := dy.Slice(0, bt*p.width), dx.Slice(0, bt*p.width)
		ops.AddColumns(s, y, dqkv, bt, p.width, p.width, 0, q, p.col, 0)
		ops.Fill(s, x, 0)
		ops.RMSNormBackward(s, y, la.qkPre.Slice(bt*p.col, bt*p.width), g(off, d), la.qkRstd.Slice(bt*p.col/d, bt*p.heads), x, gb.Slice(off, d), bt*p.heads, d)
		ops.AddColumns(s, dqkv, x, bt, p.width, q, p.col, p.width, 0, 0)
	}
}

// llamaBlockBackward turns dres, the gradient with respect to a block's
// output, into the gradient with respect to its input x, from what the
// block saved in la, accumulating its parameter gradients into g (the
// weights' and biases' through wg, nil when the block is frozen) and its
// adapters' (loraBackward).
func (m *Model) llamaBlockBackward(s gpu.Stream, w, g, x gpu.Buffer, la *layerActs, wg func(off, n int) gpu.Buffer) {
	ops, o, sh := m.ops, m.lo, m.shape
	bt, c := m.batch*m.seq, sh.Dim
	gain := m.normGains(s, w)

	// out = res2 + down_proj(act) (Gemma: + post_ff_norm(down_proj(act))):
	// dres flows to res2 unchanged; dmlp is the gradient of down_proj's
	// output. The down projection's weight gradient reads act first; then
	// d act overwrites it (act is no longer needed).
	if sh.SparseLayer(m.layer) { // moeBackward ran the experts: the router's part, then the norm
		ops.RMSNormBackward(s, m.routerBackward(s, w, la, wg), la.res2, gain(o.ln2, c), la.ln2Rstd, m.a.dres, g.Slice(o.ln2, c), bt, c)
	} else {
		m.mlpBackward(s, w, g, la, gain, wg)
	}

	// res2 = x + o_proj(atty) (Gemma: + post_attention_norm(o_proj(atty))):
	// dres flows to x unchanged.
	m.attnBackward(s, w, g, x, la, gain, wg)
}

// mlpBackward is a dense block's MLP backward and its norm's, from dres
// (accumulating the gradient of res2 into it).
func (m *Model) mlpBackward(s gpu.Stream, w, g gpu.Buffer, la *layerActs, gain func(off, n int) gpu.Buffer, wg func(off, n int) gpu.Buffer) {
	ops, o, a, sh := m.ops, m.lo, &m.a, m.shape
	bt, c, f := m.batch*m.seq, sh.Dim, sh.FFNDim()
	dres, dtmp := a.dres, a.dtmp.Slice(0, bt*c)
	dmlp := dres
	if sh.Gemma() {
		dmlp = a.dtmp2.Slice(0, bt*c)
		ops.Fill(s, dmlp, 0)
		ops.RMSNormBackward(s, dres, la.mlpOut, gain(o.postFF, c), la.mlpRstd, dmlp, g.Slice(o.postFF, c), bt, c)
	}
	if dw := wg(o.downW, c*f); dw != nil {
		ops.Gemm(s, true, false, c, f, bt, 1, dmlp, la.fchAct, 1, dw) // d down += dmlpᵀ·act
	}
	m.loraBackward(s, siteDown, dmlp, la.fchAct, nil) // reads act before it becomes d act
	dact := la.fchAct
	ops.Gemm(s, false, false, bt, f, c, 1, dmlp, w.Slice(o.downW, c*f), 0, dact) // d act (bt×F) = dmlp·down
	m.loraInputGrad(s, siteDown, dact)
	dgu := a.dbig.Slice(0, bt*2*f)
	ops.GLUBackward(s, la.fch, dact, dgu, bt, f, mlpAct(sh)) // d gate|up (bt×2F)
	linearBackward(ops, s, dgu, la.ln2, w.Slice(o.gateUpW, 2*f*c), dtmp, wg(o.gateUpW, 2*f*c), nil, bt, c, 2*f)
	m.loraBackward(s, siteUp, dgu, la.ln2, dtmp)
	preFF := o.ln2
	if sh.Gemma() {
		preFF = o.preFF
	}
	ops.RMSNormBackward(s, dtmp, la.res2, gain(preFF, c), la.ln2Rstd, dres, g.Slice(preFF, c), bt, c)
}

// attnBackward is a block's attention backward and its input norm's, from
// dres (accumulating the gradient of the block's input x into it).
func (m *Model) attnBackward(s gpu.Stream, w, g, x gpu.Buffer, la *layerActs, gain func(off, n int) gpu.Buffer, wg func(off, n int) gpu.Buffer) {
	ops, o, a, sh, l := m.ops, m.lo, &m.a, m.shape, m.layer
	bt, c, q, at := m.batch*m.seq, sh.Dim, qkvWidth(sh), sh.AttnDim()
	h, kv, d := sh.Heads, sh.KVHeadCount(), sh.HeadDim()
	dres, dtmp := a.dres, a.dtmp.Slice(0, bt*c)
	dattn := dres
	if sh.Gemma() {
		dattn = a.dtmp2.Slice(0, bt*c)
		ops.Fill(s, dattn, 0)
		ops.RMSNormBackward(s, dres, la.attnOut, gain(o.ln2, c), la.attnRstd, dattn, g.Slice(o.ln2, c), bt, c)
	}
	datty := a.dtmp.Slice(0, bt*at)
	linearBackward(ops, s, dattn, la.atty, w.Slice(o.oW, c*at), datty, wg(o.oW, c*at), nil, bt, at, c) // d atty (bt×A)
	m.loraBackward(s, siteAttnOut, dattn, la.atty, datty)
	dqkv := a.dbig.Slice(0, bt*q)
	ops.AttentionBackward(s, datty, la.qkv, la.atty, la.lse, m.posBuffer(), dqkv, m.batch, m.seq, h, kv, d, sh.AttnFor(l)) // d rotated qkv (bt×Q)
	ops.RopeBackward(s, dqkv, m.posBuffer(), m.batch, m.seq, h, kv, d, m.rope(l))                                          // d normalised qkv
	if sh.QKNorm() {
		m.qkNormBackward(s, gain, g, dqkv, a.dtmp, la.atty, la) // atty is read no more
	}
	var dbias gpu.Buffer
	if o.qkvB >= 0 {
		dbias = wg(o.qkvB, q)
	}
	linearBackward(ops, s, dqkv, la.ln1, w.Slice(o.qkvW, q*c), dtmp, wg(o.qkvW, q*c), dbias, bt, c, q) // d ln1 (bt×C)
	m.loraBackward(s, siteQKV, dqkv, la.ln1, dtmp)
	ops.RMSNormBackward(s, dtmp, x, gain(o.ln1, c), la.ln1Rstd, dres, g.Slice(o.ln1, c), bt, c)
}
