package cuda

// The ops of this round's gpu.Ops contract (the repository's OPS.md) that
// this branch does not build for CUDA: each panics when enqueued. The
// branch that implements them replaces this file.

func (o *kernels) AttentionForward(s *Stream, qkv, out, lse, pos *Buffer, batch, seq, heads, kvHeads, headDim int) {
	panic("cuda: attention not built in this branch")
}

func (o *kernels) AttentionBackward(s *Stream, dout, qkv, out, lse, pos, dqkv *Buffer, batch, seq, heads, kvHeads, headDim int) {
	panic("cuda: attention-backward not built in this branch")
}

func (o *kernels) RMSNormForward(s *Stream, x, gamma, y, rstd *Buffer, rows, cols int, eps float32) {
	panic("cuda: rmsnorm not built in this branch")
}

func (o *kernels) RMSNormBackward(s *Stream, dy, x, gamma, rstd, dx, dgamma *Buffer, rows, cols int) {
	panic("cuda: rmsnorm-backward not built in this branch")
}

func (o *kernels) RopeForward(s *Stream, qkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, theta float32) {
	panic("cuda: rope not built in this branch")
}

func (o *kernels) RopeBackward(s *Stream, dqkv, pos *Buffer, batch, seq, heads, kvHeads, headDim int, theta float32) {
	panic("cuda: rope-backward not built in this branch")
}

func (o *kernels) SwiGLUForward(s *Stream, gateUp, y *Buffer, rows, ffn int) {
	panic("cuda: swiglu not built in this branch")
}

func (o *kernels) SwiGLUBackward(s *Stream, gateUp, dy, dgateUp *Buffer, rows, ffn int) {
	panic("cuda: swiglu-backward not built in this branch")
}

func (o *kernels) CrossEntropyForward(s *Stream, logits, targets, losses *Buffer, rows, vocab int) {
	panic("cuda: cross-entropy not built in this branch")
}

func (o *kernels) CrossEntropyBackward(s *Stream, logits, targets, dlogits *Buffer, rows, vocab int, scale float32) {
	panic("cuda: cross-entropy-backward not built in this branch")
}

func (o *kernels) EmbeddingForward(s *Stream, ids, pos, wte, wpe, out *Buffer, batch, seq, dim int) {
	panic("cuda: embedding not built in this branch")
}

func (o *kernels) EmbeddingBackward(s *Stream, ids, pos, dout, dwte, dwpe *Buffer, batch, seq, dim int) {
	panic("cuda: embedding-backward not built in this branch")
}
