package gpu

import (
	"math"

	"github.com/strata-ai/strata/dtype"
)

// Kernels is what a backend implements behind CheckedOps: every method of
// Ops, called only with arguments the front end has checked against the
// contract (dimensions, dtypes, lengths, device), with the stream and
// buffers resolved to the backend's types S and B. An optional buffer the
// caller passed as nil (pos, wpe, dwpe, AdamStep's out) is the zero B, and it is called only with
// hyper-parameters that Validate accepts; Fail puts the error of a
// rejected call on the stream, for its next Synchronize.
type Kernels[S, B any] interface {
	Gemm(s S, transA, transB bool, m, n, k int, alpha float32, a, b B, beta float32, c B)
	BiasAdd(s S, y, bias B, rows, cols int)
	BiasGrad(s S, dy, dbias B, rows, cols int)
	LayerNormForward(s S, x, gamma, beta, y, mean, rstd B, rows, cols int, eps float32)
	LayerNormBackward(s S, dy, x, gamma, mean, rstd, dx, dgamma, dbeta B, rows, cols int)
	AttentionForward(s S, qkv, out, lse, pos B, batch, seq, heads, kvHeads, headDim int, opt AttnOptions)
	AttentionBackward(s S, dout, qkv, out, lse, pos, dqkv B, batch, seq, heads, kvHeads, headDim int, opt AttnOptions)
	AttentionCached(s S, qkv, kCache, vCache, out B, start, n, heads, kvHeads, headDim int, opt AttnOptions)
	RMSNormForward(s S, x, gamma, y, rstd B, rows, cols int, eps float32)
	AddRMSNormForward(s S, a, b, sum, gamma, y, rstd B, rows, cols int, eps float32)
	AddLayerNormForward(s S, a, b, sum, gamma, beta, y, mean, rstd B, rows, cols int, eps float32)
	BiasGeluForward(s S, y, bias, act B, rows, cols int)
	RMSNormBackward(s S, dy, x, gamma, rstd, dx, dgamma B, rows, cols int)
	RopeForward(s S, qkv, pos B, batch, seq, heads, kvHeads, headDim int, r Rope)
	RopeBackward(s S, dqkv, pos B, batch, seq, heads, kvHeads, headDim int, r Rope)
	GLUForward(s S, gateUp, y B, rows, ffn int, act GLUAct)
	GLUBackward(s S, gateUp, dy, dgateUp B, rows, ffn int, act GLUAct)
	GeluForward(s S, x, y B, n int)
	GeluBackward(s S, x, dy, dx B, n int)
	Add(s S, a, b, out B, n int)
	AddColumns(s S, dst, src B, rows, cols, dstLd, dstOff, srcLd, srcOff int, beta float32)
	Dropout(s S, x, y B, n int, seed uint64, offset int64, threshold uint32, scale float32)
	Dequantize(s S, format DType, src, dst B, n int)
	CrossEntropyForward(s S, logits, targets, losses B, rows, vocab int, softCap float32)
	CrossEntropyBackward(s S, logits, targets, dlogits B, rows, vocab int, scale, softCap float32)
	EmbeddingForward(s S, ids, pos, wte, wpe, out B, batch, seq, dim int)
	EmbeddingBackward(s S, ids, pos, dout, dwte, dwpe B, batch, seq, dim int)
	Cast(s S, dst, src B)
	Fill(s S, x B, value float32)
	Scale(s S, x B, alpha float32)
	Axpy(s S, alpha float32, x, y B)
	ScaleRows(s S, x, scale B, rows, cols int)
	RowDots(s S, a, b, out B, rows, cols int)
	SumSquares(s S, x, out B, index int)
	AdamStep(s S, param, grad, m, v, out B, p AdamParams)
	Fail(s S, err error)
}

// CheckedOps returns the Ops of f's device: each call is checked against
// the contract of Ops (a violation panics when the op is enqueued, naming
// the backend and the argument) and then handed to k.
func CheckedOps[S Queue, B Resident](f *Front, k Kernels[S, B]) Ops {
	return &checkedOps[S, B]{f: f, k: k}
}

type checkedOps[S Queue, B Resident] struct {
	f *Front
	k Kernels[S, B]
}

func (o *checkedOps[S, B]) stream(s Stream) S { return StreamOf[S](o.f, s) }

func (o *checkedOps[S, B]) buf(b Buffer, what string) B { return BufferOf[B](o.f, b, what) }

// float checks that b is an F32, BF16 or F16 buffer of n elements.
func (o *checkedOps[S, B]) float(b Buffer, what string, n int) B {
	rb := o.buf(b, what)
	if dt := rb.DType(); dt != F32 && !dt.Half() {
		o.f.Panicf("%s is %s, want f32, bf16 or f16", what, dt)
	}
	if rb.Len() != n {
		o.f.Panicf("%s has %d elements, want %d", what, rb.Len(), n)
	}
	return rb
}

// typed checks that b is a buffer of n elements of dt.
func (o *checkedOps[S, B]) typed(b Buffer, what string, dt DType, n int) B {
	rb := o.buf(b, what)
	if rb.DType() != dt || rb.Len() != n {
		o.f.Panicf("%s is %d×%s, want %d×%s", what, rb.Len(), rb.DType(), n, dt)
	}
	return rb
}

// table checks a rows×dim F32, BF16 or F16 table with at least minRows rows.
func (o *checkedOps[S, B]) table(b Buffer, what string, dim, minRows int) B {
	rb := o.buf(b, what)
	if dt := rb.DType(); dt != F32 && !dt.Half() {
		o.f.Panicf("%s is %s, want f32, bf16 or f16", what, dt)
	}
	if n := rb.Len(); dim > 0 && (n%dim != 0 || n/dim < minRows) {
		o.f.Panicf("%s has %d elements, want a multiple of dim %d with at least %d rows", what, n, dim, minRows)
	}
	return rb
}

func (o *checkedOps[S, B]) dims(op string, dims ...int) {
	for _, v := range dims {
		if v < 0 {
			o.f.Panicf("%s: negative dimension in %v", op, dims)
		}
	}
}

func (o *checkedOps[S, B]) Gemm(s Stream, transA, transB bool, m, n, k int, alpha float32, a, b Buffer, beta float32, c Buffer) {
	o.dims("gemm", m, n, k)
	rs := o.stream(s)
	o.k.Gemm(rs, transA, transB, m, n, k, alpha, o.float(a, "gemm a", m*k), o.float(b, "gemm b", k*n), beta, o.float(c, "gemm c", m*n))
}

func (o *checkedOps[S, B]) BiasAdd(s Stream, y, bias Buffer, rows, cols int) {
	o.dims("bias-add", rows, cols)
	o.k.BiasAdd(o.stream(s), o.float(y, "bias-add y", rows*cols), o.float(bias, "bias-add bias", cols), rows, cols)
}

func (o *checkedOps[S, B]) BiasGrad(s Stream, dy, dbias Buffer, rows, cols int) {
	o.dims("bias-grad", rows, cols)
	o.k.BiasGrad(o.stream(s), o.float(dy, "bias-grad dy", rows*cols), o.float(dbias, "bias-grad dbias", cols), rows, cols)
}

func (o *checkedOps[S, B]) LayerNormForward(s Stream, x, gamma, beta, y, mean, rstd Buffer, rows, cols int, eps float32) {
	o.dims("layernorm", rows, cols)
	rs := o.stream(s)
	rx, ry := o.float(x, "layernorm x", rows*cols), o.float(y, "layernorm y", rows*cols)
	rg, rb := o.float(gamma, "layernorm gamma", cols), o.float(beta, "layernorm beta", cols)
	rm, rr := o.typed(mean, "layernorm mean", F32, rows), o.typed(rstd, "layernorm rstd", F32, rows)
	o.k.LayerNormForward(rs, rx, rg, rb, ry, rm, rr, rows, cols, eps)
}

func (o *checkedOps[S, B]) LayerNormBackward(s Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta Buffer, rows, cols int) {
	o.dims("layernorm-backward", rows, cols)
	rs := o.stream(s)
	rdy, rx, rdx := o.float(dy, "layernorm dy", rows*cols), o.float(x, "layernorm x", rows*cols), o.float(dx, "layernorm dx", rows*cols)
	rg := o.float(gamma, "layernorm gamma", cols)
	rdg, rdb := o.float(dgamma, "layernorm dgamma", cols), o.float(dbeta, "layernorm dbeta", cols)
	rm, rr := o.typed(mean, "layernorm mean", F32, rows), o.typed(rstd, "layernorm rstd", F32, rows)
	o.k.LayerNormBackward(rs, rdy, rx, rg, rm, rr, rdx, rdg, rdb, rows, cols)
}

// heads checks the head counts of the attention and rotary ops: kvHeads
// divides heads (grouped-query attention), and rotary needs an even
// headDim.
func (o *checkedOps[S, B]) heads(op string, heads, kvHeads, headDim int, rotary bool) {
	switch {
	case kvHeads < 1 && heads > 0 || kvHeads > 0 && heads%kvHeads != 0:
		o.f.Panicf("%s: %d heads are not a multiple of %d key/value heads", op, heads, kvHeads)
	case rotary && headDim%2 != 0:
		o.f.Panicf("%s: head dimension %d is odd", op, headDim)
	}
}

// optPos checks pos (I32, batch×seq) when it is not nil.
func (o *checkedOps[S, B]) optPos(pos Buffer, what string, n int) B {
	var none B
	if pos == nil {
		return none
	}
	return o.typed(pos, what, I32, n)
}

func (o *checkedOps[S, B]) AttentionForward(s Stream, qkv, out, lse, pos Buffer, batch, seq, heads, kvHeads, headDim int, opt AttnOptions) {
	o.dims("attention", batch, seq, heads, kvHeads, headDim)
	o.heads("attention", heads, kvHeads, headDim, false)
	o.attnOptions("attention", opt)
	rs := o.stream(s)
	bt := batch * seq
	rq := o.float(qkv, "attention qkv", bt*(heads+2*kvHeads)*headDim)
	ro := o.float(out, "attention out", bt*heads*headDim)
	rl := o.typed(lse, "attention lse", F32, batch*heads*seq)
	o.k.AttentionForward(rs, rq, ro, rl, o.optPos(pos, "attention pos", bt), batch, seq, heads, kvHeads, headDim, opt)
}

func (o *checkedOps[S, B]) AttentionBackward(s Stream, dout, qkv, out, lse, pos, dqkv Buffer, batch, seq, heads, kvHeads, headDim int, opt AttnOptions) {
	o.dims("attention-backward", batch, seq, heads, kvHeads, headDim)
	o.heads("attention-backward", heads, kvHeads, headDim, false)
	o.attnOptions("attention-backward", opt)
	rs := o.stream(s)
	bt, w := batch*seq, (heads+2*kvHeads)*headDim
	rq, rdq := o.float(qkv, "attention qkv", bt*w), o.float(dqkv, "attention dqkv", bt*w)
	rdo, ro := o.float(dout, "attention dout", bt*heads*headDim), o.float(out, "attention out", bt*heads*headDim)
	rl := o.typed(lse, "attention lse", F32, batch*heads*seq)
	if overlap(rdq, rq) || overlap(rdq, rdo) || overlap(rdq, ro) {
		o.f.Panicf("attention-backward: dqkv aliases qkv, dout or out")
	}
	o.k.AttentionBackward(rs, rdo, rq, ro, rl, o.optPos(pos, "attention pos", bt), rdq, batch, seq, heads, kvHeads, headDim, opt)
}

func (o *checkedOps[S, B]) AttentionCached(s Stream, qkv, kCache, vCache, out Buffer, start, n, heads, kvHeads, headDim int, opt AttnOptions) {
	o.dims("attention-cached", start, n, heads, kvHeads, headDim)
	o.heads("attention-cached", heads, kvHeads, headDim, false)
	o.attnOptions("attention-cached", opt)
	rs := o.stream(s)
	rq := o.float(qkv, "attention-cached qkv", n*(heads+2*kvHeads)*headDim)
	rk := o.table(kCache, "attention-cached k cache", kvHeads*headDim, start+n)
	rv := o.table(vCache, "attention-cached v cache", kvHeads*headDim, start+n)
	ro := o.float(out, "attention-cached out", n*heads*headDim)
	if overlap(rk, rv) || overlap(rq, rk) || overlap(rq, rv) || overlap(ro, rk) || overlap(ro, rv) || overlap(ro, rq) {
		o.f.Panicf("attention-cached: qkv, the caches and out overlap")
	}
	o.k.AttentionCached(rs, rq, rk, rv, ro, start, n, heads, kvHeads, headDim, opt)
}

func (o *checkedOps[S, B]) RMSNormForward(s Stream, x, gamma, y, rstd Buffer, rows, cols int, eps float32) {
	o.dims("rmsnorm", rows, cols)
	rs := o.stream(s)
	rx, ry := o.float(x, "rmsnorm x", rows*cols), o.float(y, "rmsnorm y", rows*cols)
	rg, rr := o.float(gamma, "rmsnorm gamma", cols), o.typed(rstd, "rmsnorm rstd", F32, rows)
	o.k.RMSNormForward(rs, rx, rg, ry, rr, rows, cols, eps)
}

func (o *checkedOps[S, B]) AddRMSNormForward(s Stream, a, b, sum, gamma, y, rstd Buffer, rows, cols int, eps float32) {
	o.dims("add-rmsnorm", rows, cols)
	rs, n := o.stream(s), rows*cols
	ra, rb, rsum := o.float(a, "add-rmsnorm a", n), o.float(b, "add-rmsnorm b", n), o.float(sum, "add-rmsnorm sum", n)
	rg, ry := o.float(gamma, "add-rmsnorm gamma", cols), o.float(y, "add-rmsnorm y", n)
	rr := o.typed(rstd, "add-rmsnorm rstd", F32, rows)
	if (overlap(rsum, ra) && !same(rsum, ra)) || (overlap(rsum, rb) && !same(rsum, rb)) {
		o.f.Panicf("add-rmsnorm: sum overlaps a or b other than in place")
	}
	if overlap(ry, ra) || overlap(ry, rb) || overlap(ry, rsum) {
		o.f.Panicf("add-rmsnorm: y overlaps a, b or sum")
	}
	o.k.AddRMSNormForward(rs, ra, rb, rsum, rg, ry, rr, rows, cols, eps)
}

func (o *checkedOps[S, B]) AddLayerNormForward(s Stream, a, b, sum, gamma, beta, y, mean, rstd Buffer, rows, cols int, eps float32) {
	o.dims("add-layernorm", rows, cols)
	rs, n := o.stream(s), rows*cols
	ra, rb, rsum := o.float(a, "add-layernorm a", n), o.float(b, "add-layernorm b", n), o.float(sum, "add-layernorm sum", n)
	rg, rbt, ry := o.float(gamma, "add-layernorm gamma", cols), o.float(beta, "add-layernorm beta", cols), o.float(y, "add-layernorm y", n)
	rm, rr := o.typed(mean, "add-layernorm mean", F32, rows), o.typed(rstd, "add-layernorm rstd", F32, rows)
	if (overlap(rsum, ra) && !same(rsum, ra)) || (overlap(rsum, rb) && !same(rsum, rb)) {
		o.f.Panicf("add-layernorm: sum overlaps a or b other than in place")
	}
	if overlap(ry, ra) || overlap(ry, rb) || overlap(ry, rsum) {
		o.f.Panicf("add-layernorm: y overlaps a, b or sum")
	}
	o.k.AddLayerNormForward(rs, ra, rb, rsum, rg, rbt, ry, rm, rr, rows, cols, eps)
}

func (o *checkedOps[S, B]) BiasGeluForward(s Stream, y, bias, act Buffer, rows, cols int) {
	o.dims("bias-gelu", rows, cols)
	ry, rb, ra := o.float(y, "bias-gelu y", rows*cols), o.float(bias, "bias-gelu bias", cols), o.float(act, "bias-gelu act", rows*cols)
	if overlap(ra, ry) || overlap(ra, rb) {
		o.f.Panicf("bias-gelu: act overlaps y or bias")
	}
	o.k.BiasGeluForward(o.stream(s), ry, rb, ra, rows, cols)
}

func (o *checkedOps[S, B]) RMSNormBackward(s Stream, dy, x, gamma, rstd, dx, dgamma Buffer, rows, cols int) {
	o.dims("rmsnorm-backward", rows, cols)
	rs := o.stream(s)
	rdy, rx, rdx := o.float(dy, "rmsnorm dy", rows*cols), o.float(x, "rmsnorm x", rows*cols), o.float(dx, "rmsnorm dx", rows*cols)
	rg, rdg := o.float(gamma, "rmsnorm gamma", cols), o.float(dgamma, "rmsnorm dgamma", cols)
	o.k.RMSNormBackward(rs, rdy, rx, rg, o.typed(rstd, "rmsnorm rstd", F32, rows), rdx, rdg, rows, cols)
}

func (o *checkedOps[S, B]) RopeForward(s Stream, qkv, pos Buffer, batch, seq, heads, kvHeads, headDim int, r Rope) {
	o.dims("rope", batch, seq, heads, kvHeads, headDim)
	o.heads("rope", heads, kvHeads, headDim, true)
	o.rope("rope", r, headDim)
	rs, bt := o.stream(s), batch*seq
	rq := o.float(qkv, "rope qkv", bt*(heads+2*kvHeads)*headDim)
	o.k.RopeForward(rs, rq, o.optPos(pos, "rope pos", bt), batch, seq, heads, kvHeads, headDim, r.copy())
}

func (o *checkedOps[S, B]) RopeBackward(s Stream, dqkv, pos Buffer, batch, seq, heads, kvHeads, headDim int, r Rope) {
	o.dims("rope-backward", batch, seq, heads, kvHeads, headDim)
	o.heads("rope-backward", heads, kvHeads, headDim, true)
	o.rope("rope-backward", r, headDim)
	rs, bt := o.stream(s), batch*seq
	rq := o.float(dqkv, "rope dqkv", bt*(heads+2*kvHeads)*headDim)
	o.k.RopeBackward(rs, rq, o.optPos(pos, "rope pos", bt), batch, seq, heads, kvHeads, headDim, r.copy())
}

// rope checks a Rope against the contract of RopeForward.
func (o *checkedOps[S, B]) rope(what string, r Rope, headDim int) {
	if err := r.Check(headDim); err != nil {
		o.f.Panicf("%s: %v", what, err)
	}
}

// copy is r with its own InvFreq, so that the caller may reuse its slice
// as soon as the op is enqueued.
func (r Rope) copy() Rope {
	r.InvFreq = append([]float32(nil), r.InvFreq...)
	return r
}

// attnOptions checks an attention call's variants.
func (o *checkedOps[S, B]) attnOptions(what string, opt AttnOptions) {
	if err := opt.Check(); err != nil {
		o.f.Panicf("%s: %v", what, err)
	}
}

func (o *checkedOps[S, B]) activation(what string, act GLUAct) {
	if act != Silu && act != GeluTanh {
		o.f.Panicf("%s: activation %v is not one of silu, gelu_pytorch_tanh", what, act)
	}
}

func (o *checkedOps[S, B]) GLUForward(s Stream, gateUp, y Buffer, rows, ffn int, act GLUAct) {
	o.dims("glu", rows, ffn)
	o.activation("glu", act)
	rs := o.stream(s)
	o.k.GLUForward(rs, o.float(gateUp, "glu gate|up", rows*2*ffn), o.float(y, "glu y", rows*ffn), rows, ffn, act)
}

func (o *checkedOps[S, B]) GLUBackward(s Stream, gateUp, dy, dgateUp Buffer, rows, ffn int, act GLUAct) {
	o.dims("glu-backward", rows, ffn)
	o.activation("glu-backward", act)
	rs := o.stream(s)
	rg, rdy := o.float(gateUp, "glu gate|up", rows*2*ffn), o.float(dy, "glu dy", rows*ffn)
	rdg := o.float(dgateUp, "glu d gate|up", rows*2*ffn)
	if overlap(rg, rdg) {
		o.f.Panicf("glu-backward: d gate|up aliases gate|up")
	}
	o.k.GLUBackward(rs, rg, rdy, rdg, rows, ffn, act)
}

// overlap says whether two buffers share elements of one allocation.
func overlap[B Resident](a, b B) bool {
	ao, bo := a.Offset(), b.Offset()
	return a.Allocation() == b.Allocation() && ao < bo+b.Len() && bo < ao+a.Len()
}

// same says whether two buffers are the same elements of one allocation.
func same[B Resident](a, b B) bool {
	return a.Allocation() == b.Allocation() && a.Offset() == b.Offset() && a.Len() == b.Len()
}

func (o *checkedOps[S, B]) GeluForward(s Stream, x, y Buffer, n int) {
	o.dims("gelu", n)
	o.k.GeluForward(o.stream(s), o.float(x, "gelu x", n), o.float(y, "gelu y", n), n)
}

func (o *checkedOps[S, B]) GeluBackward(s Stream, x, dy, dx Buffer, n int) {
	o.dims("gelu-backward", n)
	o.k.GeluBackward(o.stream(s), o.float(x, "gelu x", n), o.float(dy, "gelu dy", n), o.float(dx, "gelu dx", n), n)
}

func (o *checkedOps[S, B]) Add(s Stream, a, b, out Buffer, n int) {
	o.dims("add", n)
	o.k.Add(o.stream(s), o.float(a, "add a", n), o.float(b, "add b", n), o.float(out, "add out", n), n)
}

func (o *checkedOps[S, B]) AddColumns(s Stream, dst, src Buffer, rows, cols, dstLd, dstOff, srcLd, srcOff int, beta float32) {
	o.dims("add-columns", rows, cols, dstLd, dstOff, srcLd, srcOff)
	if dstOff+cols > dstLd || srcOff+cols > srcLd {
		o.f.Panicf("add-columns: columns [%d, %d) of dst (%d wide) or [%d, %d) of src (%d wide) past the row", dstOff, dstOff+cols, dstLd, srcOff, srcOff+cols, srcLd)
	}
	rs := o.stream(s)
	o.k.AddColumns(rs, o.float(dst, "add-columns dst", rows*dstLd), o.float(src, "add-columns src", rows*srcLd), rows, cols, dstLd, dstOff, srcLd, srcOff, beta)
}

func (o *checkedOps[S, B]) Dropout(s Stream, x, y Buffer, n int, seed uint64, offset int64, threshold uint32, scale float32) {
	o.dims("dropout", n)
	if offset < 0 || threshold >= 1<<24 {
		o.f.Panicf("dropout: offset %d must be >= 0 and threshold %d below 2^24", offset, threshold)
	}
	rs := o.stream(s)
	o.k.Dropout(rs, o.float(x, "dropout x", n), o.float(y, "dropout y", n), n, seed, offset, threshold, scale)
}

func (o *checkedOps[S, B]) Dequantize(s Stream, format DType, src, dst Buffer, n int) {
	o.dims("dequantize", n)
	if _, err := dtype.CodecOf(format); err != nil {
		o.f.Panicf("dequantize: %v", err)
	}
	rs := o.stream(s)
	o.k.Dequantize(rs, format, o.typed(src, "dequantize src", U8, int(format.Bytes(n))), o.float(dst, "dequantize dst", n), n)
}

func (o *checkedOps[S, B]) CrossEntropyForward(s Stream, logits, targets, losses Buffer, rows, vocab int, softCap float32) {
	o.dims("cross-entropy", rows, vocab)
	o.softCap("cross-entropy", softCap)
	rs := o.stream(s)
	rl, rloss := o.float(logits, "cross-entropy logits", rows*vocab), o.float(losses, "cross-entropy losses", rows)
	o.k.CrossEntropyForward(rs, rl, o.typed(targets, "cross-entropy targets", I32, rows), rloss, rows, vocab, softCap)
}

// softCap checks a final-logit soft cap (0: none).
func (o *checkedOps[S, B]) softCap(what string, c float32) {
	if !(c >= 0) || math.IsInf(float64(c), 0) {
		o.f.Panicf("%s: soft cap %v must be finite and >= 0", what, c)
	}
}

func (o *checkedOps[S, B]) CrossEntropyBackward(s Stream, logits, targets, dlogits Buffer, rows, vocab int, scale, softCap float32) {
	o.dims("cross-entropy-backward", rows, vocab)
	o.softCap("cross-entropy-backward", softCap)
	rs := o.stream(s)
	rl, rd := o.float(logits, "cross-entropy logits", rows*vocab), o.float(dlogits, "cross-entropy dlogits", rows*vocab)
	o.k.CrossEntropyBackward(rs, rl, o.typed(targets, "cross-entropy targets", I32, rows), rd, rows, vocab, scale, softCap)
}

// optTable is table for a buffer that may be nil (the position table).
func (o *checkedOps[S, B]) optTable(b Buffer, what string, dim, minRows int) B {
	var none B
	if b == nil {
		return none
	}
	return o.table(b, what, dim, minRows)
}

func (o *checkedOps[S, B]) EmbeddingForward(s Stream, ids, pos, wte, wpe, out Buffer, batch, seq, dim int) {
	o.dims("embedding", batch, seq, dim)
	rs := o.stream(s)
	ri, rp := o.typed(ids, "embedding ids", I32, batch*seq), o.optPos(pos, "embedding pos", batch*seq)
	rte, rpe := o.table(wte, "embedding wte", dim, 1), o.optTable(wpe, "embedding wpe", dim, seq)
	o.k.EmbeddingForward(rs, ri, rp, rte, rpe, o.float(out, "embedding out", batch*seq*dim), batch, seq, dim)
}

func (o *checkedOps[S, B]) EmbeddingBackward(s Stream, ids, pos, dout, dwte, dwpe Buffer, batch, seq, dim int) {
	o.dims("embedding-backward", batch, seq, dim)
	rs := o.stream(s)
	ri, rp := o.typed(ids, "embedding ids", I32, batch*seq), o.optPos(pos, "embedding pos", batch*seq)
	rte, rpe := o.table(dwte, "embedding dwte", dim, 1), o.optTable(dwpe, "embedding dwpe", dim, seq)
	o.k.EmbeddingBackward(rs, ri, rp, o.float(dout, "embedding dout", batch*seq*dim), rte, rpe, batch, seq, dim)
}

func (o *checkedOps[S, B]) Cast(s Stream, dst, src Buffer) {
	rs, rd, rsrc := o.stream(s), o.buf(dst, "cast dst"), o.buf(src, "cast src")
	if rd.Len() != rsrc.Len() {
		o.f.Panicf("cast: dst has %d elements, src %d", rd.Len(), rsrc.Len())
	}
	o.k.Cast(rs, rd, rsrc)
}

func (o *checkedOps[S, B]) Fill(s Stream, x Buffer, value float32) {
	o.k.Fill(o.stream(s), o.buf(x, "fill x"), value)
}

func (o *checkedOps[S, B]) Scale(s Stream, x Buffer, alpha float32) {
	rs, rx := o.stream(s), o.buf(x, "scale x")
	if rx.DType() == I32 {
		o.f.Panicf("scale of an i32 buffer")
	}
	o.k.Scale(rs, rx, alpha)
}

func (o *checkedOps[S, B]) Axpy(s Stream, alpha float32, x, y Buffer) {
	rs, rx, ry := o.stream(s), o.buf(x, "axpy x"), o.buf(y, "axpy y")
	if rx.Len() != ry.Len() || rx.DType() == I32 || ry.DType() == I32 {
		o.f.Panicf("axpy: x %d×%s, y %d×%s", rx.Len(), rx.DType(), ry.Len(), ry.DType())
	}
	o.k.Axpy(rs, alpha, rx, ry)
}

func (o *checkedOps[S, B]) ScaleRows(s Stream, x, scale Buffer, rows, cols int) {
	o.dims("scale-rows", rows, cols)
	rs := o.stream(s)
	o.k.ScaleRows(rs, o.float(x, "scale-rows x", rows*cols), o.typed(scale, "scale-rows scale", F32, rows), rows, cols)
}

func (o *checkedOps[S, B]) RowDots(s Stream, a, b, out Buffer, rows, cols int) {
	o.dims("row-dots", rows, cols)
	rs := o.stream(s)
	o.k.RowDots(rs, o.float(a, "row-dots a", rows*cols), o.float(b, "row-dots b", rows*cols), o.typed(out, "row-dots out", F32, rows), rows, cols)
}

func (o *checkedOps[S, B]) SumSquares(s Stream, x, out Buffer, index int) {
	rs, rx, ro := o.stream(s), o.buf(x, "sum-squares x"), o.buf(out, "sum-squares out")
	if ro.DType() != F64 || index < 0 || index >= ro.Len() {
		o.f.Panicf("sum-squares: out %d×%s, index %d", ro.Len(), ro.DType(), index)
	}
	o.k.SumSquares(rs, rx, ro, index)
}

// AdamStep checks the buffers (a contract: panics) and the
// hyper-parameters (data: a rejected set is an error on the stream, and
// nothing is updated).
func (o *checkedOps[S, B]) AdamStep(s Stream, param, grad, m, v, out Buffer, p AdamParams) {
	rs := o.stream(s)
	n := o.buf(param, "adam param").Len()
	rp := o.typed(param, "adam param", F32, n)
	rg := o.float(grad, "adam grad", n)
	rm, rv := o.typed(m, "adam m", F32, n), o.typed(v, "adam v", F32, n)
	var ro B
	if out != nil {
		want := BF16 // the params' dtype: bf16, or f16 with f16 gradients
		if rg.DType() == F16 {
			want = F16
		}
		ro = o.typed(out, "adam out", want, n)
	}
	if err := p.Validate(); err != nil {
		o.k.Fail(rs, o.f.Errorf("adam step: %w", err))
		return
	}
	o.k.AdamStep(rs, rp, rg, rm, rv, ro, p)
}
