package model

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
)

// LayerNormEps is GPT-2's layernorm epsilon.
const LayerNormEps = 1e-5

// Model is a GPT-2-style decoder bound to one device and one micro-batch
// shape (Batch sequences of Seq tokens). It owns its activations, allocated
// once by New (ActivationBytes says how much), and nothing else: parameters
// and gradients come from a Params for every pass.
//
// A micro-batch is Forward, then optionally Backward, then Loss; the model
// keeps the activations of the last Forward until the next one.
type Model struct {
	layout *Layout
	shape  Shape
	dev    gpu.Device
	ops    gpu.Ops
	batch  int
	seq    int
	bo     blockOffsets

	allocs []gpu.Buffer
	a      activations

	idsHost, targetsHost []byte    // staging for the uploads of ids and targets
	pending              [][]byte  // per-token losses of the Forwards not yet read, oldest first
	spare                [][]byte  // loss buffers already read, for reuse
	staged               gpu.Event // the last uploads from the staging bytes
	lastLoss             float64
	forwarded            bool
}

// activations are views into the model's allocations; see planActivations.
type activations struct {
	ids, targets gpu.Buffer // I32 (B·T)
	res          []gpu.Buffer
	layers       []layerActs
	lnf          gpu.Buffer // B·T·C
	lnfMean      gpu.Buffer // B·T
	lnfRstd      gpu.Buffer // B·T
	logits       gpu.Buffer // B·T·V
	dlogits      gpu.Buffer // B·T·V
	losses       gpu.Buffer // B·T
	dres         gpu.Buffer // B·T·C: gradient of the residual stream
	dtmp         gpu.Buffer // B·T·C
	dbig         gpu.Buffer // B·T·4C: gradient of qkv or of the MLP hidden layer
}

// layerActs are what one block saves for its backward.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd gpu.Buffer // B·T·C, B·T, B·T
	qkv                   gpu.Buffer // B·T·3C
	atty                  gpu.Buffer // B·T·C: attention output before c_proj
	att                   gpu.Buffer // B·H·T·T: softmax probabilities
	res2                  gpu.Buffer // B·T·C: residual after attention
	ln2, ln2Mean, ln2Rstd gpu.Buffer // B·T·C, B·T, B·T
	fch                   gpu.Buffer // B·T·4C: c_fc output
	fchGelu               gpu.Buffer // B·T·4C: gelu(fch); reused for d fch in backward
}

// segment is one named tensor inside an activation allocation.
type segment struct {
	name string
	n    int
	dst  *gpu.Buffer
}

// allocation is one device allocation holding several segments.
type allocation struct {
	purpose string
	dtype   gpu.DType
	segs    []segment
}

// segmentAlign keeps every activation tensor 256-byte aligned within its
// allocation, as a GPU kernel wants.
const segmentAlign = 64

func alignUp(n int) int { return (n + segmentAlign - 1) / segmentAlign * segmentAlign }

func (a allocation) elements() int {
	n := 0
	for _, s := range a.segs {
		n += alignUp(s.n)
	}
	return n
}

// planActivations lists the allocations of a model of shape s for batch×seq
// tokens; when a is not nil, each segment's dst points into it.
func planActivations(s Shape, batch, seq int, a *activations) []allocation {
	if a == nil {
		a = &activations{}
	}
	bt, c, v := batch*seq, s.Dim, s.Vocab
	a.res = make([]gpu.Buffer, s.Layers+1)
	a.layers = make([]layerActs, s.Layers)
	plan := []allocation{
		{"tokens", gpu.I32, []segment{{"ids", bt, &a.ids}, {"targets", bt, &a.targets}}},
		{"embedding out", gpu.F32, []segment{{"res0", bt * c, &a.res[0]}}},
	}
	for l := 0; l < s.Layers; l++ {
		la := &a.layers[l]
		plan = append(plan, allocation{fmt.Sprintf("block %d", l), gpu.F32, []segment{
			{"ln1", bt * c, &la.ln1}, {"ln1 mean", bt, &la.ln1Mean}, {"ln1 rstd", bt, &la.ln1Rstd},
			{"qkv", bt * 3 * c, &la.qkv}, {"atty", bt * c, &la.atty},
			{"att", batch * s.Heads * seq * seq, &la.att}, {"res2", bt * c, &la.res2},
			{"ln2", bt * c, &la.ln2}, {"ln2 mean", bt, &la.ln2Mean}, {"ln2 rstd", bt, &la.ln2Rstd},
			{"fch", bt * 4 * c, &la.fch}, {"fch gelu", bt * 4 * c, &la.fchGelu},
			{"out", bt * c, &a.res[l+1]},
		}})
	}
	plan = append(plan,
		allocation{"head", gpu.F32, []segment{
			{"lnf", bt * c, &a.lnf}, {"lnf mean", bt, &a.lnfMean}, {"lnf rstd", bt, &a.lnfRstd},
			{"logits", bt * v, &a.logits}, {"dlogits", bt * v, &a.dlogits}, {"losses", bt, &a.losses},
		}},
		allocation{"backward scratch", gpu.F32, []segment{
			{"dres", bt * c, &a.dres}, {"dtmp", bt * c, &a.dtmp}, {"dbig", bt * 4 * c, &a.dbig},
		}},
	)
	return plan
}

// ActivationBytes is the device memory a Model of shape s allocates for
// micro-batches of batch sequences of seq tokens: every block's saved
// activations (per token 16·C + 4 floats, plus H·T attention
// probabilities), the head (logits and their gradient, 2·V per token) and
// the backward scratch (6·C per token), each tensor padded to 256 bytes.
// It does not include the device's allocation granularity.
func ActivationBytes(s Shape, batch, seq int) int64 {
	var n int64
	for _, a := range planActivations(s, batch, seq, nil) {
		n += int64(a.elements()) * int64(a.dtype.Size())
	}
	return n
}

// New allocates the activations of a model laid out by layout for
// micro-batches of batch sequences of seq tokens on dev. The allocations
// are tagged gpu.Activation; an *gpu.OutOfMemoryError comes back wrapped.
func New(dev gpu.Device, layout *Layout, batch, seq int) (*Model, error) {
	s := layout.Shape
	if batch < 1 || seq < 1 {
		return nil, fmt.Errorf("model: batch %d and seq %d must be >= 1", batch, seq)
	}
	if seq > s.MaxSeq {
		return nil, fmt.Errorf("model: seq %d exceeds max_seq_len %d", seq, s.MaxSeq)
	}
	if s.IsLlama() {
		return nil, fmt.Errorf("model: arch %s: the forward and backward passes are not built yet", s.Arch)
	}
	m := &Model{layout: layout, shape: s, dev: dev, ops: dev.Ops(), batch: batch, seq: seq, bo: layout.block()}
	for _, al := range planActivations(s, batch, seq, &m.a) {
		buf, err := dev.Alloc(al.elements(), al.dtype, gpu.Tag{Kind: gpu.Activation, Purpose: "activations " + al.purpose})
		if err != nil {
			m.Free()
			return nil, fmt.Errorf("model: activations of %s: %w", al.purpose, err)
		}
		m.allocs = append(m.allocs, buf)
		off := 0
		for _, sg := range al.segs {
			*sg.dst = buf.Slice(off, sg.n)
			off += alignUp(sg.n)
		}
	}
	bt := batch * seq
	m.idsHost, m.targetsHost = make([]byte, 4*bt), make([]byte, 4*bt)
	m.staged = dev.NewEvent()
	return m, nil
}

// Free releases the activations; the streams that used them must have
// completed.
func (m *Model) Free() {
	for _, b := range m.allocs {
		m.dev.Free(b)
	}
	m.allocs = nil
}

// Layout returns the model's parameter layout.
func (m *Model) Layout() *Layout { return m.layout }

// Batch returns the number of sequences per micro-batch.
func (m *Model) Batch() int { return m.batch }

// Seq returns the tokens per sequence.
func (m *Model) Seq() int { return m.seq }

// Forward enqueues the forward pass of one micro-batch on s: b.IDs and
// b.Targets are batch×seq token ids in [0, Vocab), row-major (see Batch);
// b.Targets[i] is the token that follows b.IDs[i]. It computes the per-token
// cross-entropy whose mean Loss returns. Forward copies what it needs of b
// before it returns.
// An error of p stops the pass at once and is returned as it is (see
// Params); the micro-batch has no loss then, and Backward and Loss need a
// new Forward.
func (m *Model) Forward(s gpu.Stream, p Params, b Batch) error {
	ids, targets := b.IDs, b.Targets
	bt, c, v := m.batch*m.seq, m.shape.Dim, m.shape.Vocab
	if b.Pos != nil {
		panic("model: Forward: packed rows (Batch.Pos) are not built yet")
	}
	if len(ids) != bt || len(targets) != bt {
		panic(fmt.Sprintf("model: Forward got %d ids and %d targets, want batch*seq = %d", len(ids), len(targets), bt))
	}
	for i := range ids {
		if uint32(ids[i]) >= uint32(v) || uint32(targets[i]) >= uint32(v) {
			panic(fmt.Sprintf("model: token %d (id %d, target %d) outside the vocabulary [0, %d)", i, ids[i], targets[i], v))
		}
	}
	m.forwarded = false
	// The staging bytes may still be read by the previous upload.
	m.staged.Synchronize()
	copy(i32View(m.idsHost), ids)
	copy(i32View(m.targetsHost), targets)
	m.dev.CopyHostToDevice(s, m.a.ids, 0, m.idsHost)
	m.dev.CopyHostToDevice(s, m.a.targets, 0, m.targetsHost)
	s.Record(m.staged)

	ops, a := m.ops, &m.a
	emb, err := p.Acquire(s, EmbeddingChunk, PassForward)
	if err != nil {
		return err
	}
	wte, wpe := emb.Slice(0, v*c), emb.Slice(v*c, m.seq*c)
	ops.EmbeddingForward(s, a.ids, wte, wpe, a.res[0], m.batch, m.seq, c)
	p.Release(s, EmbeddingChunk, PassForward)

	for l := 0; l < m.shape.Layers; l++ {
		w, err := p.Acquire(s, BlockChunk(l), PassForward)
		if err != nil {
			return err
		}
		m.blockForward(s, l, w)
		p.Release(s, BlockChunk(l), PassForward)
	}

	fc := m.layout.FinalNormChunk()
	fin, err := p.Acquire(s, fc, PassForward)
	if err != nil {
		return err
	}
	ops.LayerNormForward(s, a.res[m.shape.Layers], fin.Slice(0, c), fin.Slice(c, c), a.lnf, a.lnfMean, a.lnfRstd, bt, c, LayerNormEps)
	p.Release(s, fc, PassForward)

	if emb, err = p.Acquire(s, EmbeddingChunk, PassForward); err != nil {
		return err
	}
	// logits (BT×V) = lnf (BT×C) · wteᵀ
	ops.Gemm(s, false, true, bt, v, c, 1, a.lnf, emb.Slice(0, v*c), 0, a.logits)
	ops.CrossEntropyForward(s, a.logits, a.targets, a.losses, bt, v)
	p.Release(s, EmbeddingChunk, PassForward)
	var lossHost []byte
	if n := len(m.spare); n > 0 {
		lossHost, m.spare = m.spare[n-1], m.spare[:n-1]
	} else {
		lossHost = make([]byte, 4*bt)
	}
	m.dev.CopyDeviceToHost(s, lossHost, a.losses, 0)
	m.pending = append(m.pending, lossHost)
	m.forwarded = true
	return nil
}

// blockForward runs block l with its parameter chunk w:
//
//	res2 = x + c_proj(attn(c_attn(ln_1(x))))
//	out  = res2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(res2))))
func (m *Model) blockForward(s gpu.Stream, l int, w gpu.Buffer) {
	ops, o, la := m.ops, m.bo, &m.a.layers[l]
	bt, c := m.batch*m.seq, m.shape.Dim
	x, out := m.a.res[l], m.a.res[l+1]
	ops.LayerNormForward(s, x, w.Slice(o.ln1g, c), w.Slice(o.ln1b, c), la.ln1, la.ln1Mean, la.ln1Rstd, bt, c, LayerNormEps)
	linearForward(ops, s, la.ln1, w.Slice(o.qkvW, 3*c*c), w.Slice(o.qkvB, 3*c), la.qkv, bt, c, 3*c)
	ops.AttentionForward(s, la.qkv, la.atty, la.att, m.batch, m.seq, m.shape.Heads, m.shape.HeadDim())
	linearForward(ops, s, la.atty, w.Slice(o.projW, c*c), w.Slice(o.projB, c), la.res2, bt, c, c)
	ops.Add(s, x, la.res2, la.res2, bt*c)
	ops.LayerNormForward(s, la.res2, w.Slice(o.ln2g, c), w.Slice(o.ln2b, c), la.ln2, la.ln2Mean, la.ln2Rstd, bt, c, LayerNormEps)
	linearForward(ops, s, la.ln2, w.Slice(o.fcW, 4*c*c), w.Slice(o.fcB, 4*c), la.fch, bt, c, 4*c)
	ops.GeluForward(s, la.fch, la.fchGelu, bt*4*c)
	linearForward(ops, s, la.fchGelu, w.Slice(o.fcpW, 4*c*c), w.Slice(o.fcpB, c), out, bt, 4*c, c)
	ops.Add(s, la.res2, out, out, bt*c)
}

// linearForward writes y (rows×out) = x (rows×in) · Wᵀ + b, W out×in.
func linearForward(ops gpu.Ops, s gpu.Stream, x, w, b, y gpu.Buffer, rows, in, out int) {
	ops.Gemm(s, false, true, rows, out, in, 1, x, w, 0, y)
	ops.BiasAdd(s, y, b, rows, out)
}

// linearBackward, for y = x·Wᵀ + b, writes dx = dy·W and accumulates
// dW += dyᵀ·x and db += Σ_rows dy.
func linearBackward(ops gpu.Ops, s gpu.Stream, dy, x, w, dx, dw, db gpu.Buffer, rows, in, out int) {
	ops.Gemm(s, false, false, rows, in, out, 1, dy, w, 0, dx)
	ops.Gemm(s, true, false, out, in, rows, 1, dy, x, 1, dw)
	ops.BiasGrad(s, dy, db, rows, out)
}

// Backward enqueues the backward pass of the last Forward on s and
// accumulates gradScale × the gradient of its mean loss into the Params'
// gradient buffers. The trainer passes 1/micro-batches-per-step so that the
// accumulated gradient is that of the step's mean loss. An error of p stops
// the pass at once and is returned as it is (see Params); the gradients are
// then partial.
func (m *Model) Backward(s gpu.Stream, p Params, gradScale float32) error {
	if !m.forwarded {
		panic("model: Backward without a Forward")
	}
	ops, a := m.ops, &m.a
	bt, c, v, nl := m.batch*m.seq, m.shape.Dim, m.shape.Vocab, m.shape.Layers

	// Head: dlogits, then d lnf into dtmp and dwte += dlogitsᵀ·lnf.
	emb, gemb, err := acquireWithGrad(s, p, EmbeddingChunk)
	if err != nil {
		return err
	}
	dwte, dwpe := gemb.Slice(0, v*c), gemb.Slice(v*c, m.seq*c)
	ops.CrossEntropyBackward(s, a.logits, a.targets, a.dlogits, bt, v, float32(float64(gradScale)/float64(bt)))
	ops.Gemm(s, false, false, bt, c, v, 1, a.dlogits, emb.Slice(0, v*c), 0, a.dtmp)
	ops.Gemm(s, true, false, v, c, bt, 1, a.dlogits, a.lnf, 1, dwte)
	p.Release(s, EmbeddingChunk, PassBackward)

	fc := m.layout.FinalNormChunk()
	fin, gfin, err := acquireWithGrad(s, p, fc)
	if err != nil {
		return err
	}
	ops.Fill(s, a.dres, 0)
	ops.LayerNormBackward(s, a.dtmp, a.res[nl], fin.Slice(0, c), a.lnfMean, a.lnfRstd, a.dres, gfin.Slice(0, c), gfin.Slice(c, c), bt, c)
	p.Release(s, fc, PassBackward)
	if err := p.GradReady(s, fc); err != nil {
		return err
	}

	for l := nl - 1; l >= 0; l-- {
		w, g, err := acquireWithGrad(s, p, BlockChunk(l))
		if err != nil {
			return err
		}
		m.blockBackward(s, l, w, g)
		p.Release(s, BlockChunk(l), PassBackward)
		if err := p.GradReady(s, BlockChunk(l)); err != nil {
			return err
		}
	}

	ops.EmbeddingBackward(s, a.ids, a.dres, dwte, dwpe, m.batch, m.seq, c)
	return p.GradReady(s, EmbeddingChunk)
}

// acquireWithGrad is the backward's Acquire then Grad of chunk c.
func acquireWithGrad(s gpu.Stream, p Params, c int) (w, g gpu.Buffer, err error) {
	if w, err = p.Acquire(s, c, PassBackward); err != nil {
		return nil, nil, err
	}
	if g, err = p.Grad(s, c); err != nil {
		return nil, nil, err
	}
	return w, g, nil
}

// blockBackward turns dres, the gradient with respect to block l's output,
// into the gradient with respect to its input, accumulating the block's
// parameter gradients into g.
func (m *Model) blockBackward(s gpu.Stream, l int, w, g gpu.Buffer) {
	ops, o, la, a := m.ops, m.bo, &m.a.layers[l], &m.a
	bt, c := m.batch*m.seq, m.shape.Dim
	dres, dtmp := a.dres, a.dtmp

	// out = res2 + c_proj(gelu(fch)): dres flows to res2 unchanged.
	dgelu := a.dbig
	linearBackward(ops, s, dres, la.fchGelu, w.Slice(o.fcpW, 4*c*c), dgelu, g.Slice(o.fcpW, 4*c*c), g.Slice(o.fcpB, c), bt, 4*c, c)
	dfch := la.fchGelu // gelu(fch) is no longer needed
	ops.GeluBackward(s, la.fch, dgelu, dfch, bt*4*c)
	linearBackward(ops, s, dfch, la.ln2, w.Slice(o.fcW, 4*c*c), dtmp, g.Slice(o.fcW, 4*c*c), g.Slice(o.fcB, 4*c), bt, c, 4*c)
	ops.LayerNormBackward(s, dtmp, la.res2, w.Slice(o.ln2g, c), la.ln2Mean, la.ln2Rstd, dres, g.Slice(o.ln2g, c), g.Slice(o.ln2b, c), bt, c)

	// res2 = x + c_proj(atty): dres flows to x unchanged.
	linearBackward(ops, s, dres, la.atty, w.Slice(o.projW, c*c), dtmp, g.Slice(o.projW, c*c), g.Slice(o.projB, c), bt, c, c)
	dqkv := a.dbig.Slice(0, bt*3*c)
	ops.AttentionBackward(s, dtmp, la.qkv, la.att, dqkv, m.batch, m.seq, m.shape.Heads, m.shape.HeadDim())
	linearBackward(ops, s, dqkv, la.ln1, w.Slice(o.qkvW, 3*c*c), dtmp, g.Slice(o.qkvW, 3*c*c), g.Slice(o.qkvB, 3*c), bt, c, 3*c)
	ops.LayerNormBackward(s, dtmp, a.res[l], w.Slice(o.ln1g, c), la.ln1Mean, la.ln1Rstd, dres, g.Slice(o.ln1g, c), g.Slice(o.ln1b, c), bt, c)
}

// Loss synchronizes s and returns the mean cross-entropy (nats per token)
// of the last Forward, summed in float64 in token order. A diverged model
// returns NaN or +Inf without an error. It drops the losses of earlier
// Forwards that Losses did not read.
func (m *Model) Loss(s gpu.Stream) (float64, error) {
	if !m.forwarded {
		panic("model: Loss without a Forward")
	}
	if _, err := m.Losses(s); err != nil {
		return 0, err
	}
	return m.lastLoss, nil
}

// Losses synchronizes s and returns the mean loss of every Forward since
// the last Loss or Losses, oldest first: a caller that enqueues several
// micro-batches before waiting reads all their losses with one
// synchronization.
func (m *Model) Losses(s gpu.Stream) ([]float64, error) {
	if err := s.Synchronize(); err != nil {
		return nil, fmt.Errorf("model: forward: %w", err)
	}
	out := make([]float64, len(m.pending))
	for i, b := range m.pending {
		var sum float64
		for _, l := range f32View(b) {
			sum += float64(l)
		}
		out[i] = sum / float64(m.batch*m.seq)
	}
	if len(out) > 0 {
		m.lastLoss = out[len(out)-1]
	}
	m.spare = append(m.spare, m.pending...)
	m.pending = m.pending[:0]
	return out, nil
}
