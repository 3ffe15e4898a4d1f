package model

import "github.com/strata-ai/strata/gpu"

// The output head and the cross-entropy, a slice of tokens at a time, so
// that the B·T·V logits are never held whole: the loss chunk (a.logits,
// fp32) holds the logits of lossRows tokens. The forward computes each
// slice's logits and losses and keeps nothing of them; the backward
// computes each slice's logits again (the head GEMM runs twice), turns them
// into their gradient in place, and from it the slice's rows of d lnf and
// its share of the head's weight gradient. The slices go in token order,
// so the head's gradient is accumulated in one fixed order: the results do
// not depend on anything but the inputs. B·T·V fp32 logits are 411 MB at
// GPT-2's vocabulary for 2048 tokens (and were held twice, with their
// gradient); the chunk is at most lossChunkMaxBytes.

// lossSlices calls fn for each slice of the micro-batch's bt tokens, in
// order: its first token and its token count.
func (m *Model) lossSlices(fn func(r0, n int)) {
	bt := m.batch * m.seq
	rows := lossRows(bt, m.shape.Vocab)
	for r0 := 0; r0 < bt; r0 += rows {
		fn(r0, min(rows, bt-r0))
	}
}

// logitsOf enqueues the fp32 logits (n×V) of tokens [r0, r0+n) into the
// loss chunk: lnf[r0:r0+n] (n×C) · hwᵀ, hw the head (V×C).
func (m *Model) logitsOf(s gpu.Stream, hw gpu.Buffer, r0, n int) gpu.Buffer {
	c, v := m.shape.Dim, m.shape.Vocab
	logits := m.a.logits.Slice(0, n*v)
	m.ops.Gemm(s, false, true, n, v, c, 1, m.a.lnf.Slice(r0*c, n*c), hw, 0, logits)
	return logits
}

// lossForward writes every token's cross-entropy into losses from the
// final norm's output and the head hw.
func (m *Model) lossForward(s gpu.Stream, hw gpu.Buffer) {
	a, v := &m.a, m.shape.Vocab
	m.lossSlices(func(r0, n int) {
		logits := m.logitsOf(s, hw, r0, n)
		m.ops.CrossEntropyForward(s, logits, a.targets.Slice(r0, n), a.losses.Slice(r0, n), n, v, float32(m.shape.FinalSoftCap))
	})
}

// lossBackward writes d lnf into dtmp and accumulates the head's weight
// gradient into hg (V×C), with each token's dlogits scaled by scale.
func (m *Model) lossBackward(s gpu.Stream, hw, hg gpu.Buffer, scale float32) {
	a, c, v := &m.a, m.shape.Dim, m.shape.Vocab
	m.lossSlices(func(r0, n int) {
		logits := m.logitsOf(s, hw, r0, n)
		m.ops.CrossEntropyBackward(s, logits, a.targets.Slice(r0, n), logits, n, v, scale, float32(m.shape.FinalSoftCap)) // dlogits, in place
		m.ops.Gemm(s, false, false, n, c, v, 1, logits, hw, 0, a.dtmp.Slice(r0*c, n*c))                                   // d lnf = dlogits·W
		if hg != nil {
			m.ops.Gemm(s, true, false, v, c, n, 1, logits, a.lnf.Slice(r0*c, n*c), 1, hg) // dW += dlogitsᵀ·lnf
		}
	})
}
