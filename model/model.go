package model

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/fp16"
	"github.com/strata-ai/strata/shard"
)

// Model is a decoder (GPT-2 or the Llama family, Shape.Arch) bound to one
// device and one micro-batch shape (Batch sequences of Seq tokens). It owns
// its activations, allocated once by New (ActivationBytesWith says how
// much), and nothing else: parameters and gradients come from a Params for
// every pass.
//
// A micro-batch is Forward, then optionally Backward, then Loss; the model
// keeps the activations of the last Forward until the next one.
//
// The passes are plain functions per layer, as in llm.c: this file drives
// them chunk by chunk (embedding, blocks, final norm and head), loss.go
// holds the chunked loss, gpt2.go and llama.go each architecture's block.
type Model struct {
	layout *Layout
	shape  Shape
	dev    gpu.Device
	ops    gpu.Ops
	batch  int
	seq    int
	act    ActivationOptions
	bo     blockOffsets // GPT-2
	lo     llamaOffsets // the Llama family

	allocs []gpu.Buffer
	a      activations
	lora   *loraState   // nil without LoRA
	moe    *moeState    // nil unless a mixture of experts
	frozen FrozenParams // the Backward's Params, when they freeze chunks
	drop   *DropoutKey  // the last Forward's Batch.Dropout (a copy)
	layer  int          // the block being run: its adapters' dropout streams

	idsHost, targetsHost, posHost []byte    // staging for the uploads of ids, targets and positions
	pending                       []pending // the Forwards whose losses are not read yet, oldest first
	spare                         [][]byte  // loss buffers already read, for reuse
	staged                        gpu.Event // the last uploads from the staging bytes
	lastLoss                      float64
	forwarded                     bool
	packed                        bool    // the last Forward had Batch.Pos
	ropeLen                       int     // the last Forward's longest position + 1 (rope types that depend on it)
	embScale                      float32 // Gemma: the last Forward's embedding scale (EmbedScale)
	counted                       int     // tokens with a target in the last Forward
}

// pending is one Forward's per-token losses on their way to the host and
// the number of tokens that have a target.
type pending struct {
	losses  []byte
	counted int
	aux     float64 // a mixture of experts' load-balancing loss
}

// New is NewWith fp32 activations and no checkpointing.
func New(dev gpu.Device, layout *Layout, batch, seq int) (*Model, error) {
	return NewWith(dev, layout, batch, seq, ActivationOptions{})
}

// NewWith allocates the activations of a model laid out by layout for
// micro-batches of batch sequences of seq tokens on dev, kept as o says.
// The allocations are tagged gpu.Activation; an *gpu.OutOfMemoryError
// comes back wrapped.
func NewWith(dev gpu.Device, layout *Layout, batch, seq int, o ActivationOptions) (*Model, error) {
	s := layout.Shape
	if batch < 1 || seq < 1 {
		return nil, fmt.Errorf("model: batch %d and seq %d must be >= 1", batch, seq)
	}
	if seq > s.LongestSeq() {
		return nil, fmt.Errorf("model: seq %d exceeds max_seq_len %d", seq, s.LongestSeq())
	}
	if err := o.Validate(s); err != nil {
		return nil, err
	}
	if (o.LoRA == nil) != (layout.LoRA == nil) || o.LoRA != nil && !o.LoRA.same(layout.LoRA) {
		return nil, fmt.Errorf("model: the activation options' LoRA (%v) is not the layout's (%v)", o.LoRA, layout.LoRA)
	}
	m := &Model{layout: layout, shape: s, dev: dev, ops: dev.Ops(), batch: batch, seq: seq, act: o, bo: layout.block(), lo: layout.llamaBlock()}
	for _, al := range planActivations(s, batch, seq, o, &m.a) {
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
	if o.LoRA != nil {
		m.lora = newLoRAState(s, o.LoRA, &m.a)
	}
	bt := batch * seq
	if s.MoE() {
		m.moe = newMoEState(s, bt)
	}
	m.idsHost, m.targetsHost, m.posHost = make([]byte, 4*bt), make([]byte, 4*bt), make([]byte, 4*bt)
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

// Activations returns the options the activations are kept with.
func (m *Model) Activations() ActivationOptions { return m.act }

// checkBatch panics unless b is a micro-batch of the model's shape: ids in
// [0, Vocab), targets in [0, Vocab) or IgnoreTarget, positions (when
// given) restarting at 0 at column 0 and otherwise either 0 or one more
// than the column before. It returns the number of tokens with a target.
func (m *Model) checkBatch(b Batch) int {
	bt, v := m.batch*m.seq, m.shape.Vocab
	if (b.Rows != 0 || b.Seq != 0) && (b.Rows != m.batch || b.Seq != m.seq) {
		panic(fmt.Sprintf("model: Forward got a %d×%d batch, the model is %d×%d", b.Rows, b.Seq, m.batch, m.seq))
	}
	if len(b.IDs) != bt || len(b.Targets) != bt || b.Pos != nil && len(b.Pos) != bt {
		panic(fmt.Sprintf("model: Forward got %d ids, %d targets and %d positions, want batch*seq = %d", len(b.IDs), len(b.Targets), len(b.Pos), bt))
	}
	counted := 0
	for i, id := range b.IDs {
		tg := b.Targets[i]
		if uint32(id) >= uint32(v) || uint32(tg) >= uint32(v) && tg != IgnoreTarget {
			panic(fmt.Sprintf("model: token %d (id %d, target %d) outside the vocabulary [0, %d)", i, id, tg, v))
		}
		if tg != IgnoreTarget {
			counted++
		}
		if b.Pos == nil {
			continue
		}
		if p, t := b.Pos[i], i%m.seq; !(p == 0 || t > 0 && p == b.Pos[i-1]+1) {
			panic(fmt.Sprintf("model: position %d at row %d, column %d: positions restart at 0 and count up by one within an example", p, i/m.seq, t))
		}
	}
	return counted
}

// Forward enqueues the forward pass of one micro-batch on s: b.IDs and
// b.Targets are batch×seq token ids in [0, Vocab), row-major (see Batch);
// b.Targets[i] is the token that follows b.IDs[i], or IgnoreTarget. b.Pos,
// when not nil, packs several examples in a row: positions (GPT-2's wpe
// rows, the Llama family's rotary angles) restart at each example and
// attention stays inside it. It computes the per-token cross-entropy whose
// mean over the tokens with a target Loss returns. Forward copies what it
// needs of b before it returns; a b that breaks these rules panics.
// An error of p stops the pass at once and is returned as it is (see
// Params); the micro-batch has no loss then, and Backward and Loss need a
// new Forward. With ActivationOptions.Offload, p must implement
// InputStore.
func (m *Model) Forward(s gpu.Stream, p Params, b Batch) error {
	counted := m.checkBatch(b)
	bt, nl := m.batch*m.seq, m.shape.Layers
	m.forwarded = false
	m.drop = nil
	if b.Dropout != nil {
		k := *b.Dropout
		m.drop = &k
	}
	store, err := m.inputStore(p)
	if err != nil {
		return err
	}
	// The staging bytes may still be read by the previous upload.
	m.staged.Synchronize()
	copy(i32View(m.idsHost), b.IDs)
	copy(i32View(m.targetsHost), b.Targets)
	m.dev.CopyHostToDevice(s, m.a.ids, 0, m.idsHost)
	m.dev.CopyHostToDevice(s, m.a.targets, 0, m.targetsHost)
	m.ropeLen = m.seq
	if m.packed = b.Pos != nil; m.packed {
		copy(i32View(m.posHost), b.Pos)
		m.dev.CopyHostToDevice(s, m.a.pos, 0, m.posHost)
		m.ropeLen = 0
		for _, p := range b.Pos {
			m.ropeLen = max(m.ropeLen, int(p)+1)
		}
	}
	s.Record(m.staged)

	emb, err := p.Acquire(s, EmbeddingChunk, shard.Forward)
	if err != nil {
		return err
	}
	next := 0 // the ring slot the next offloaded input takes
	x, xSlot := m.residual(s, 0, &next)
	m.embeddingForward(s, emb, x)
	p.Release(s, EmbeddingChunk, shard.Forward)
	if m.moe != nil {
		m.moe.reset()
	}

	for l := 0; l < nl; l++ {
		if err := m.loadAdapters(s, p, l, shard.Forward); err != nil {
			return err
		}
		w, err := p.Acquire(s, BlockChunk(l), shard.Forward)
		if err != nil {
			return err
		}
		out, outSlot := m.residual(s, l+1, &next)
		m.blockForward(s, l, w, x, out, false)
		p.Release(s, BlockChunk(l), shard.Forward)
		if m.shape.SparseLayer(l) {
			if err := m.moeForward(s, p, l, out); err != nil {
				return err
			}
		}
		if xSlot >= 0 {
			ev, err := store.SaveInput(s, l, x)
			if err != nil {
				return err
			}
			m.a.ringEv[xSlot] = ev
		}
		x, xSlot = out, outSlot
	}

	fc := m.layout.FinalNormChunk()
	fin, err := p.Acquire(s, fc, shard.Forward)
	if err != nil {
		return err
	}
	m.finalNormForward(s, fin)
	head := fin
	if m.shape.TiedHead() {
		p.Release(s, fc, shard.Forward)
		if head, err = p.Acquire(s, EmbeddingChunk, shard.Forward); err != nil {
			return err
		}
	}
	m.lossForward(s, m.headWeight(head))
	p.Release(s, m.layout.HeadChunk(), shard.Forward)

	var lossHost []byte
	if n := len(m.spare); n > 0 {
		lossHost, m.spare = m.spare[n-1], m.spare[:n-1]
	} else {
		lossHost = make([]byte, 4*bt)
	}
	m.dev.CopyDeviceToHost(s, lossHost, m.a.losses, 0)
	pd := pending{losses: lossHost, counted: counted}
	if m.moe != nil && counted > 0 { // no target, no loss: the router's is 0 too (its gradient is)
		pd.aux = m.moe.auxLoss(m.shape.Experts)
	}
	m.pending = append(m.pending, pd)
	m.counted = counted
	m.forwarded = true
	return nil
}

// inputStore is p as an InputStore when the model offloads its
// checkpointed inputs (nil otherwise), or an error naming what p lacks.
func (m *Model) inputStore(p Params) (InputStore, error) {
	if !m.act.Offload {
		return nil, nil
	}
	store, ok := p.(InputStore)
	if !ok {
		return nil, fmt.Errorf("model: offloaded checkpoint inputs (cpu_checkpointing) need Params that implement model.InputStore; %T does not", p)
	}
	return store, nil
}

// residual is the device buffer the forward writes residual i into (the
// embedding's output for i = 0, block i-1's for i > 0): res[i] (slot -1),
// or for an offloaded input ring slot *next, once the InputStore has read
// what that slot held before; *next moves on.
func (m *Model) residual(s gpu.Stream, i int, next *int) (gpu.Buffer, int) {
	a := &m.a
	if a.res[i] != nil {
		return a.res[i], -1
	}
	k := *next
	*next = (k + 1) % offloadRing
	if ev := a.ringEv[k]; ev != nil {
		s.Wait(ev)
		a.ringEv[k] = nil
	}
	return a.ring[k], k
}

// blockForward runs block l of the model's architecture (see gpt2.go and
// llama.go) from its input x into out, saving into its layerActs; with
// recompute (the backward of a checkpointed block) out is nil and the
// block stops before its output projection, which its backward does not
// read.
func (m *Model) blockForward(s gpu.Stream, l int, w, x, out gpu.Buffer, recompute bool) {
	m.layer = l
	if m.shape.IsLlama() {
		m.llamaBlockForward(s, w, x, out, m.a.layers[l], recompute)
	} else {
		m.gpt2BlockForward(s, w, x, out, m.a.layers[l], recompute)
	}
}

// blockBackward turns dres, the gradient with respect to block l's
// output, into the gradient with respect to its input x, accumulating the
// block's parameter gradients into g (its weights' not when the block is
// frozen: FrozenParams) and its adapters' into the adapter gradient.
func (m *Model) blockBackward(s gpu.Stream, l int, w, g, x gpu.Buffer) {
	m.layer = l
	wg := func(off, n int) gpu.Buffer { return m.weightGrad(BlockChunk(l), g, off, n) }
	if m.shape.IsLlama() {
		m.llamaBlockBackward(s, w, g, x, m.a.layers[l], wg)
	} else {
		m.gpt2BlockBackward(s, w, g, x, m.a.layers[l], wg)
	}
}

// posBuffer is the positions of the last Forward, or nil when its rows
// were not packed (pos[b,t] = t).
func (m *Model) posBuffer() gpu.Buffer {
	if m.packed {
		return m.a.pos
	}
	return nil
}

// embeddingForward: out[b,t,:] = wte[id] (+ GPT-2's wpe[pos]) with the
// embedding chunk emb.
func (m *Model) embeddingForward(s gpu.Stream, emb, out gpu.Buffer) {
	v, c := m.shape.Vocab, m.shape.Dim
	var wpe gpu.Buffer
	if !m.shape.IsLlama() {
		wpe = emb.Slice(v*c, m.seq*c)
	}
	m.ops.EmbeddingForward(s, m.a.ids, m.posBuffer(), emb.Slice(0, v*c), wpe, out, m.batch, m.seq, c)
	if m.shape.Gemma() {
		m.embScale = EmbedScale(m.shape, emb.DType())
		m.ops.Scale(s, out, m.embScale)
	}
}

// EmbedScale is what Gemma multiplies its embeddings by: √hidden_size as
// a tensor of the hidden states' dtype, which in transformers is the
// embedding weights' (dt: rounded to bf16 for bf16 weights, to fp16 for
// fp16 ones), as Hugging Face's Gemma rounds it; 1 for the other families.
func EmbedScale(s Shape, dt gpu.DType) float32 {
	if !s.Gemma() {
		return 1
	}
	v := float32(math.Sqrt(float64(s.Dim)))
	switch dt {
	case gpu.BF16:
		v = bf16.Round(v)
	case gpu.F16:
		v = fp16.Round(v)
	}
	return v
}

// finalNormForward: lnf = norm(res[L]) with the final chunk fin (GPT-2's
// ln_f g, b; the Llama family's norm.weight).
func (m *Model) finalNormForward(s gpu.Stream, fin gpu.Buffer) {
	a, bt, c := &m.a, m.batch*m.seq, m.shape.Dim
	x, eps := a.res[m.shape.Layers], float32(m.shape.Eps())
	if m.shape.IsLlama() {
		m.ops.RMSNormForward(s, x, m.finalGain(s, fin), a.lnf, a.lnfRstd, bt, c, eps)
		return
	}
	m.ops.LayerNormForward(s, x, fin.Slice(0, c), fin.Slice(c, c), a.lnf, a.lnfMean, a.lnfRstd, bt, c, eps)
}

// finalNormBackward accumulates dres += d norm(res[L]) from dlnf and the
// final chunk's gradient g.
func (m *Model) finalNormBackward(s gpu.Stream, dlnf, fin, g gpu.Buffer) {
	a, bt, c := &m.a, m.batch*m.seq, m.shape.Dim
	x := a.res[m.shape.Layers]
	if m.shape.IsLlama() {
		m.ops.RMSNormBackward(s, dlnf, x, m.finalGain(s, fin), a.lnfRstd, a.dres, g.Slice(0, c), bt, c)
		return
	}
	m.ops.LayerNormBackward(s, dlnf, x, fin.Slice(0, c), a.lnfMean, a.lnfRstd, a.dres, g.Slice(0, c), g.Slice(c, c), bt, c)
}

// finalGain is the final RMSNorm's gain: norm.weight, or Gemma's 1 +
// norm.weight (fp32, in the gains scratch).
func (m *Model) finalGain(s gpu.Stream, fin gpu.Buffer) gpu.Buffer {
	c := m.shape.Dim
	if !m.shape.Gemma() {
		return fin.Slice(0, c)
	}
	g := m.a.gains.Slice(0, c)
	m.ops.Fill(s, g, 1)
	m.ops.Axpy(s, 1, fin.Slice(0, c), g)
	return g
}

// headWeight is the output head (Vocab×C) in buf, the chunk
// Layout.HeadChunk: the token embedding when tied, else lm_head after the
// final norm's weight.
func (m *Model) headWeight(buf gpu.Buffer) gpu.Buffer {
	v, c := m.shape.Vocab, m.shape.Dim
	if m.shape.TiedHead() {
		return buf.Slice(0, v*c)
	}
	return buf.Slice(c, v*c)
}

// linearForward writes y (rows×out) = x (rows×in) · Wᵀ + b, W out×in; b
// may be nil (no bias).
func linearForward(ops gpu.Ops, s gpu.Stream, x, w, b, y gpu.Buffer, rows, in, out int) {
	ops.Gemm(s, false, true, rows, out, in, 1, x, w, 0, y)
	if b != nil {
		ops.BiasAdd(s, y, b, rows, out)
	}
}

// linearBackward, for y = x·Wᵀ + b, writes dx = dy·W and accumulates
// dW += dyᵀ·x and db += Σ_rows dy (dw nil: W is frozen, no dW; db nil: no
// bias, or frozen).
func linearBackward(ops gpu.Ops, s gpu.Stream, dy, x, w, dx, dw, db gpu.Buffer, rows, in, out int) {
	ops.Gemm(s, false, false, rows, in, out, 1, dy, w, 0, dx)
	if dw != nil {
		ops.Gemm(s, true, false, out, in, rows, 1, dy, x, 1, dw)
	}
	if db != nil {
		ops.BiasGrad(s, dy, db, rows, out)
	}
}

// Backward enqueues the backward pass of the last Forward on s and
// accumulates gradScale × the gradient of its mean loss into the Params'
// gradient buffers: the loss is the mean over the tokens that have a
// target, so each token's dlogits is scaled by gradScale / that count; a
// micro-batch without any target has loss 0 and adds a zero gradient
// (every Params call is still made, in AccessOrder). The trainer passes
// 1/micro-batches-per-step so that the accumulated gradient is that of the
// step's mean loss. A checkpointed block runs its forward again from its
// saved input before its backward, with the parameters it acquires for
// the backward. An error of p stops the pass at once and is returned as
// it is (see Params); the gradients are then partial.
func (m *Model) Backward(s gpu.Stream, p Params, gradScale float32) error {
	if !m.forwarded {
		panic("model: Backward without a Forward")
	}
	ops, a := m.ops, &m.a
	c, v, nl := m.shape.Dim, m.shape.Vocab, m.shape.Layers
	scale := float32(0)
	if m.counted > 0 {
		scale = float32(float64(gradScale) / float64(m.counted))
	}
	store, err := m.inputStore(p)
	if err != nil {
		return err
	}
	fc, hc := m.layout.FinalNormChunk(), m.layout.HeadChunk()
	m.frozen, _ = p.(FrozenParams)

	// Head: d lnf into dtmp and dW += dlogitsᵀ·lnf, a token slice at a time.
	hw, hg, err := acquireWithGrad(s, p, hc)
	if err != nil {
		return err
	}
	var dhead gpu.Buffer
	if !m.isFrozen(hc) {
		dhead = m.headWeight(hg)
	}
	m.lossBackward(s, m.headWeight(hw), dhead, scale)
	gemb := hg // the embedding gradient, when the head is tied
	fin, gfin := hw, hg
	if hc != fc {
		p.Release(s, hc, shard.Backward)
		if fin, gfin, err = acquireWithGrad(s, p, fc); err != nil {
			return err
		}
	}
	ops.Fill(s, a.dres, 0)
	m.finalNormBackward(s, a.dtmp.Slice(0, m.batch*m.seq*c), fin, gfin)
	p.Release(s, fc, shard.Backward)
	if err := p.GradReady(s, fc); err != nil {
		return err
	}

	auxScale := 0.0
	if m.shape.RouterAux && m.counted > 0 {
		auxScale = float64(gradScale) * m.shape.RouterAuxCoef
	}
	for l := nl - 1; l >= 0; l-- {
		if err := m.loadAdapters(s, p, l, shard.Backward); err != nil {
			return err
		}
		if m.shape.SparseLayer(l) { // the experts first: their adapters are loaded
			if err := m.moeBackward(s, p, l, auxScale); err != nil {
				return err
			}
		}
		if err := m.blockPass(s, p, store, l); err != nil {
			return err
		}
	}

	if !m.shape.TiedHead() {
		if gemb, err = p.Grad(s, EmbeddingChunk); err != nil {
			return err
		}
	}
	if !m.isFrozen(EmbeddingChunk) {
		var dwpe gpu.Buffer
		if !m.shape.IsLlama() {
			dwpe = gemb.Slice(v*c, m.seq*c)
		}
		if m.shape.Gemma() {
			ops.Scale(s, a.dres, m.embScale)
		}
		ops.EmbeddingBackward(s, a.ids, m.posBuffer(), a.dres, gemb.Slice(0, v*c), dwpe, m.batch, m.seq, c)
	}
	return p.GradReady(s, EmbeddingChunk)
}

// isFrozen says whether the Params of this Backward freeze chunk c: its
// weight gradients are then not computed.
func (m *Model) isFrozen(c int) bool { return m.frozen != nil && m.frozen.Frozen(c) }

// weightGrad is g's slice [off, off+n) for a weight gradient, or nil when
// chunk c is frozen (linearBackward skips it).
func (m *Model) weightGrad(c int, g gpu.Buffer, off, n int) gpu.Buffer {
	if m.isFrozen(c) {
		return nil
	}
	return g.Slice(off, n)
}

// blockPass is block l's backward (its adapters loaded: loadAdapters):
// its input (res[l], or taken back from the InputStore), its forward
// again when it is checkpointed, then its backward, in AccessOrder's
// calls.
func (m *Model) blockPass(s gpu.Stream, p Params, store InputStore, l int) error {
	c := BlockChunk(l)
	w, g, err := acquireWithGrad(s, p, c)
	if err != nil {
		return err
	}
	x := m.a.res[l]
	off := m.act.offloaded(l, m.shape.Layers)
	if off {
		if x, err = store.RestoreInput(s, l); err != nil {
			return err
		}
	}
	if m.act.Checkpointed(l, m.shape.Layers) {
		m.blockForward(s, l, w, x, nil, true)
	}
	m.blockBackward(s, l, w, g, x)
	p.Release(s, c, shard.Backward)
	if off {
		store.ReleaseInput(s, l)
	}
	if err := p.GradReady(s, c); err != nil || m.lora == nil {
		return err
	}
	a := m.layout.AdapterChunk(l)
	ga, err := p.Grad(s, a)
	if err != nil {
		return err
	}
	n := m.layout.Chunks[a].Len
	m.ops.Add(s, ga, m.lora.g.Slice(0, n), ga, n) // the block's adapter gradient
	return p.GradReady(s, a)
}

// loadAdapters copies block l's adapter chunk into the workspace, between
// its Acquire and Release, before the block's own Acquire; in the
// backward it also zeroes the workspace's adapter gradient, which the
// block's backward accumulates into (blockPass adds it to the chunk's
// Grad). Without LoRA it does nothing.
func (m *Model) loadAdapters(s gpu.Stream, p Params, l int, pass shard.Phase) error {
	if m.lora == nil {
		return nil
	}
	a := m.layout.AdapterChunk(l)
	w, err := p.Acquire(s, a, pass)
	if err != nil {
		return err
	}
	m.ops.Cast(s, m.lora.w.Slice(0, w.Len()), w) // the block's adapters (a mixture of experts' vary by layer)
	p.Release(s, a, pass)
	if pass == shard.Backward {
		m.ops.Fill(s, m.lora.g, 0)
	}
	return nil
}

// acquireWithGrad is the backward's Acquire then Grad of chunk c.
func acquireWithGrad(s gpu.Stream, p Params, c int) (w, g gpu.Buffer, err error) {
	if w, err = p.Acquire(s, c, shard.Backward); err != nil {
		return nil, nil, err
	}
	if g, err = p.Grad(s, c); err != nil {
		return nil, nil, err
	}
	return w, g, nil
}

// Loss synchronizes s and returns the mean cross-entropy (nats per token
// with a target) of the last Forward, summed in float64 in token order; 0
// when no token has a target. A diverged model returns NaN or +Inf without
// an error. It drops the losses of earlier Forwards that Losses did not
// read.
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
	for i, pd := range m.pending {
		var sum float64
		for _, l := range f32View(pd.losses) {
			sum += float64(l)
		}
		if pd.counted > 0 {
			out[i] = sum / float64(pd.counted)
		}
		if m.moe != nil {
			if i == 0 {
				m.moe.lastAux = m.moe.lastAux[:0]
			}
			m.moe.lastAux = append(m.moe.lastAux, pd.aux)
		}
		m.spare = append(m.spare, pd.losses)
	}
	if len(out) > 0 {
		m.lastLoss = out[len(out)-1]
	}
	m.pending = m.pending[:0]
	return out, nil
}
