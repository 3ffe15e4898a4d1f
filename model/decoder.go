package model

import (
	"fmt"
	"math"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/shard"
)

// Decoder runs a model forward for inference on one device, one sequence
// at a time, with a key/value cache: every block keeps the keys and values
// (after rotation, for the Llama family) of the tokens it has seen, so a
// Step with new tokens computes only their rows and their attention reads
// the cache (gpu.Ops.AttentionCached). Generation runs the prompt in one
// Step and then one token a Step; evaluation runs a window in one Score.
// It saves nothing for a backward pass: its activations are one Step's
// rows, reused by every block.
//
// Parameters come from a Params (Weights, or any other: the Decoder calls
// Acquire and Release in the forward order of AccessOrder, and never Grad).
// Activations and the cache are fp32.
type Decoder struct {
	layout  *Layout
	shape   Shape
	dev     gpu.Device
	ops     gpu.Ops
	opts    DecoderOptions
	bo      blockOffsets // GPT-2
	lo      llamaOffsets // the Llama family
	length  int          // tokens in the cache
	scoring bool         // the call is a Score: its targets are staged

	allocs []gpu.Buffer
	a      decoderActs
	moe    *moeState // nil unless a mixture of experts

	idsHost, posHost, targetsHost []byte
	logitsHost, lossesHost        []byte
}

// DecoderOptions size a Decoder.
type DecoderOptions struct {
	// Capacity is the most tokens the cache holds: a prompt and what is
	// generated after it, or an evaluation window. At most the shape's
	// MaxSeq (GPT-2 has no position past it; the Llama family was trained
	// to it).
	Capacity int
	// MaxStep is the most tokens one Step or Score runs (the prompt, the
	// window): the activations hold that many rows. 0: Capacity.
	MaxStep int
	// HeadRows is the most rows whose logits Score computes at once (the
	// head's GEMM and the cross-entropy run in blocks of this many rows).
	// 0: min(MaxStep, 128).
	HeadRows int
}

func (o DecoderOptions) withDefaults() DecoderOptions {
	if o.MaxStep == 0 {
		o.MaxStep = o.Capacity
	}
	if o.HeadRows == 0 {
		o.HeadRows = min(o.MaxStep, 128)
	}
	return o
}

func (o DecoderOptions) validate(s Shape) error {
	switch {
	case o.Capacity < 1 || o.Capacity > s.LongestSeq():
		return fmt.Errorf("model: decoder capacity %d must be in [1, max_seq_len %d]", o.Capacity, s.LongestSeq())
	case o.MaxStep < 1 || o.MaxStep > o.Capacity:
		return fmt.Errorf("model: decoder step of %d tokens must be in [1, capacity %d]", o.MaxStep, o.Capacity)
	case o.HeadRows < 1:
		return fmt.Errorf("model: decoder head rows %d must be >= 1", o.HeadRows)
	}
	return nil
}

// decoderActs are the views of a Decoder's allocations.
type decoderActs struct {
	ids, pos, targets gpu.Buffer   // I32: MaxStep tokens
	x                 gpu.Buffer   // MaxStep×C: the residual stream
	h                 gpu.Buffer   // MaxStep×C: a norm's output
	mean, rstd        gpu.Buffer   // MaxStep: the norm's statistics
	qkv               gpu.Buffer   // MaxStep×(H+2·KV)·D
	att               gpu.Buffer   // MaxStep×H·D: attention's output
	tmp               gpu.Buffer   // MaxStep×C: a projection's output
	tmp2              gpu.Buffer   // MaxStep×C (Gemma): a projection's output after its norm
	qkA, qkB, qkRstd  gpu.Buffer   // MaxStep×H·D twice and MaxStep×H (q_norm, k_norm): the heads out of qkv, normalised, their rstd
	gains             gpu.Buffer   // 4C + 2D (Gemma): the block's norm gains, 1 + weight
	mlp               gpu.Buffer   // MaxStep×(F, or 2F for gate|up)
	act               gpu.Buffer   // MaxStep×F
	logits            gpu.Buffer   // HeadRows×V
	losses            gpu.Buffer   // MaxStep
	k, v              []gpu.Buffer // per block: Capacity×KV·D
	// A mixture of experts' (moe.go, moeRows): MaxStep·k grouped rows.
	moe moeRows
	// The router logits (F32, MaxStep×E).
	moeLogits gpu.Buffer
}

// planDecoder lists a Decoder's allocations (as planActivations does for
// a Model); with a not nil, each segment's dst points into it.
func planDecoder(s Shape, o DecoderOptions, a *decoderActs) []allocation {
	if a == nil {
		a = &decoderActs{}
	}
	n, c, kvw := o.MaxStep, s.Dim, s.KVHeadCount()*s.HeadDim()
	plan := []allocation{
		{"decoder tokens", "decoder", gpu.I32, []segment{{"ids", n, &a.ids}, {"pos", n, &a.pos}, {"targets", n, &a.targets}}},
		{"decoder rows", "decoder", gpu.F32, []segment{
			{"x", n * c, &a.x}, {"h", n * c, &a.h}, {"mean", n, &a.mean}, {"rstd", n, &a.rstd},
			{"qkv", n * qkvWidth(s), &a.qkv}, {"att", n * s.AttnDim(), &a.att}, {"tmp", n * c, &a.tmp},
			{"mlp", n * mlpWidth(s), &a.mlp}, {"act", n * s.FFNDim(), &a.act},
			{"logits", o.HeadRows * s.Vocab, &a.logits}, {"losses", n, &a.losses},
		}},
	}
	var extra []segment
	if s.QKNorm() {
		extra = append(extra, segment{"qk a", n * s.AttnDim(), &a.qkA}, segment{"qk b", n * s.AttnDim(), &a.qkB}, segment{"qk rstd", n * s.Heads, &a.qkRstd})
	}
	if s.Gemma() {
		extra = append(extra, segment{"tmp2", n * c, &a.tmp2}, segment{"gains", 4*c + 2*s.HeadDim(), &a.gains})
	}
	if len(extra) > 0 {
		plan = append(plan, allocation{"decoder variants", "decoder", gpu.F32, extra})
	}
	if s.MoE() {
		k, fe := s.TopK, s.ExpertFFNDim()
		plan = append(plan, allocation{"decoder routing", "decoder", gpu.I32, []segment{{"grouped tokens", n * k, &a.moe.tok}}},
			allocation{"decoder experts", "decoder", gpu.F32, []segment{{"weights", n * k, &a.moe.w}, {"router logits", n * s.Experts, &a.moeLogits},
				{"grouped rows", n * k * c, &a.moe.x}, {"gate|up", n * k * 2 * fe, &a.moe.fch}, {"act", n * k * fe, &a.moe.act}, {"outputs", n * k * c, &a.moe.y}}})
	}
	a.k, a.v = make([]gpu.Buffer, s.Layers), make([]gpu.Buffer, s.Layers)
	for l := range s.Layers {
		plan = append(plan, allocation{fmt.Sprintf("kv cache %d", l), "kv cache", gpu.F32,
			[]segment{{"k", o.Capacity * kvw, &a.k[l]}, {"v", o.Capacity * kvw, &a.v[l]}}})
	}
	return plan
}

// DecoderBytes is the device memory NewDecoder allocates for shape s and
// options o (after defaults): the cache, 2·Capacity·KV·D values per block
// (fp32), and fp32 rows for MaxStep tokens (per token 4C + (H+2·KV)·D +
// F + the MLP's first output (F, or 2F for gate|up) + 3 floats, and 3
// int32) and HeadRows×V logits, each tensor padded to 256 bytes.
func DecoderBytes(s Shape, o DecoderOptions) int64 {
	var n int64
	for _, a := range planDecoder(s, o.withDefaults(), nil) {
		n += int64(a.elements()) * int64(a.dtype.Size())
	}
	return n
}

// NewDecoder allocates a Decoder for models laid out by layout on dev
// (tagged gpu.Activation); an *gpu.OutOfMemoryError comes back wrapped.
func NewDecoder(dev gpu.Device, layout *Layout, o DecoderOptions) (*Decoder, error) {
	s := layout.Shape
	o = o.withDefaults()
	if err := o.validate(s); err != nil {
		return nil, err
	}
	d := &Decoder{layout: layout, shape: s, dev: dev, ops: dev.Ops(), opts: o, bo: layout.block(), lo: layout.llamaBlock()}
	for _, al := range planDecoder(s, o, &d.a) {
		buf, err := dev.Alloc(al.elements(), al.dtype, gpu.Tag{Kind: gpu.Activation, Purpose: al.purpose})
		if err != nil {
			d.Free()
			return nil, fmt.Errorf("model: %s: %w", al.purpose, err)
		}
		d.allocs = append(d.allocs, buf)
		off := 0
		for _, sg := range al.segs {
			*sg.dst = buf.Slice(off, sg.n)
			off += alignUp(sg.n)
		}
	}
	d.idsHost, d.posHost, d.targetsHost = make([]byte, 4*o.MaxStep), make([]byte, 4*o.MaxStep), make([]byte, 4*o.MaxStep)
	d.logitsHost, d.lossesHost = make([]byte, 4*o.HeadRows*s.Vocab), make([]byte, 4*o.MaxStep)
	if s.MoE() {
		d.moe = newMoEState(s, o.MaxStep)
	}
	return d, nil
}

// Free releases the decoder's memory; the streams that used it must have
// completed.
func (d *Decoder) Free() {
	for _, b := range d.allocs {
		d.dev.Free(b)
	}
	d.allocs = nil
}

// Len is the number of tokens in the cache: the position of the next one.
func (d *Decoder) Len() int { return d.length }

// Options are the decoder's options, with defaults filled in.
func (d *Decoder) Options() DecoderOptions { return d.opts }

// Reset empties the cache: the next Step starts a new sequence at
// position 0.
func (d *Decoder) Reset() { d.length = 0 }

// Step runs ids, the tokens at positions Len() .. Len()+len(ids)-1 of the
// sequence, through the model with p's parameters: their keys and values
// join the cache, and the logits that follow the last of them come back
// (Vocab fp32 values on the host, valid until the next call). It
// synchronizes s. Too many tokens (past MaxStep, or the cache's capacity)
// or an id outside the vocabulary is an error and changes nothing; an
// error of p stops the pass and leaves the cache as it was.
func (d *Decoder) Step(s gpu.Stream, p Params, ids []int32) ([]float32, error) {
	d.scoring = false
	n, err := d.start(ids, nil)
	if err != nil {
		return nil, err
	}
	head, err := d.forward(s, p, ids)
	if err != nil {
		return nil, err
	}
	v, c := d.shape.Vocab, d.shape.Dim
	logits := d.a.logits.Slice(0, v)
	d.ops.Gemm(s, false, true, 1, v, c, 1, d.a.h.Slice((n-1)*c, c), head, 0, logits)
	p.Release(s, d.layout.HeadChunk(), shard.Forward)
	out := d.logitsHost[:4*v]
	d.dev.CopyDeviceToHost(s, out, logits, 0)
	if err := s.Synchronize(); err != nil {
		return nil, fmt.Errorf("model: decoder: %w", err)
	}
	d.length += n
	SoftCap(f32View(out), d.shape.FinalSoftCap)
	return f32View(out), nil
}

// Score runs ids as Step does, with targets[i] the token that follows
// ids[i] (or IgnoreTarget), and returns the sum over the tokens with a
// target of their cross-entropy (natural log, summed in float64 in token
// order) and how many there are. When logits is not nil it is called with
// each row's logits (Vocab fp32 values, reused after it returns), in
// order. The head runs HeadRows rows at a time. It synchronizes s.
func (d *Decoder) Score(s gpu.Stream, p Params, ids, targets []int32, logits func(row int, v []float32)) (float64, int, error) {
	if targets == nil {
		targets = []int32{}
	}
	d.scoring = true
	n, err := d.start(ids, targets)
	if err != nil {
		return 0, 0, err
	}
	head, err := d.forward(s, p, ids)
	if err != nil {
		return 0, 0, err
	}
	v, c, hr := d.shape.Vocab, d.shape.Dim, d.opts.HeadRows
	for r0 := 0; r0 < n; r0 += hr {
		rb := min(hr, n-r0)
		lg := d.a.logits.Slice(0, rb*v)
		d.ops.Gemm(s, false, true, rb, v, c, 1, d.a.h.Slice(r0*c, rb*c), head, 0, lg)
		d.ops.CrossEntropyForward(s, lg, d.a.targets.Slice(r0, rb), d.a.losses.Slice(r0, rb), rb, v, float32(d.shape.FinalSoftCap))
		if logits == nil {
			continue
		}
		host := d.logitsHost[:4*rb*v]
		d.dev.CopyDeviceToHost(s, host, lg, 0)
		if err := s.Synchronize(); err != nil {
			return 0, 0, fmt.Errorf("model: decoder: %w", err)
		}
		SoftCap(f32View(host), d.shape.FinalSoftCap)
		for r := range rb {
			logits(r0+r, f32View(host)[r*v:(r+1)*v])
		}
	}
	p.Release(s, d.layout.HeadChunk(), shard.Forward)
	d.dev.CopyDeviceToHost(s, d.lossesHost[:4*n], d.a.losses.Slice(0, n), 0)
	if err := s.Synchronize(); err != nil {
		return 0, 0, fmt.Errorf("model: decoder: %w", err)
	}
	d.length += n
	var sum float64
	counted := 0
	for i, l := range f32View(d.lossesHost[:4*n]) {
		if targets[i] != IgnoreTarget {
			sum += float64(l)
			counted++
		}
	}
	return sum, counted, nil
}

// start checks a Step's or Score's tokens and stages their ids and
// positions; it returns their count.
func (d *Decoder) start(ids, targets []int32) (int, error) {
	n, v := len(ids), d.shape.Vocab
	switch {
	case n == 0:
		return 0, fmt.Errorf("model: decoder: no tokens")
	case n > d.opts.MaxStep:
		return 0, fmt.Errorf("model: decoder: %d tokens in one step; the decoder takes at most %d", n, d.opts.MaxStep)
	case d.length+n > d.opts.Capacity:
		return 0, fmt.Errorf("model: decoder: %d tokens after %d would pass the cache's capacity of %d", n, d.length, d.opts.Capacity)
	case targets != nil && len(targets) != n:
		return 0, fmt.Errorf("model: decoder: %d targets for %d tokens", len(targets), n)
	}
	for i, id := range ids {
		if uint32(id) >= uint32(v) {
			return 0, fmt.Errorf("model: decoder: token %d is id %d, outside the vocabulary [0, %d)", i, id, v)
		}
		if targets != nil && uint32(targets[i]) >= uint32(v) && targets[i] != IgnoreTarget {
			return 0, fmt.Errorf("model: decoder: target %d is id %d, outside the vocabulary [0, %d)", i, targets[i], v)
		}
	}
	// Every earlier call ended with a synchronization: the staging bytes
	// are free.
	copy(i32View(d.idsHost), ids)
	copy(i32View(d.targetsHost), targets)
	pos := i32View(d.posHost)
	for i := range n {
		pos[i] = int32(d.length + i)
	}
	return n, nil
}

// forward enqueues the embedding, the blocks and the final norm of the
// staged tokens (the norm's output in a.h) and returns the output head,
// acquired: the caller releases Layout.HeadChunk after the head's GEMMs.
func (d *Decoder) forward(s gpu.Stream, p Params, ids []int32) (gpu.Buffer, error) {
	n, c, v, start := len(ids), d.shape.Dim, d.shape.Vocab, d.length
	a := &d.a
	d.dev.CopyHostToDevice(s, a.ids, 0, d.idsHost[:4*n])
	d.dev.CopyHostToDevice(s, a.pos, 0, d.posHost[:4*n])
	if d.scoring {
		d.dev.CopyHostToDevice(s, a.targets, 0, d.targetsHost[:4*n])
	}

	emb, err := p.Acquire(s, EmbeddingChunk, shard.Forward)
	if err != nil {
		return nil, err
	}
	var wpe gpu.Buffer
	if !d.shape.IsLlama() {
		wpe = emb.Slice(v*c+start*c, n*c) // rows start.. of wpe: the tokens' positions
	}
	d.ops.EmbeddingForward(s, a.ids.Slice(0, n), nil, emb.Slice(0, v*c), wpe, a.x.Slice(0, n*c), 1, n, c)
	if d.shape.Gemma() {
		d.ops.Scale(s, a.x.Slice(0, n*c), EmbedScale(d.shape, emb.DType()))
	}
	p.Release(s, EmbeddingChunk, shard.Forward)

	for l := range d.shape.Layers {
		w, err := p.Acquire(s, BlockChunk(l), shard.Forward)
		if err != nil {
			return nil, err
		}
		if d.shape.IsLlama() {
			d.llamaBlock(s, l, w, n)
		} else {
			d.gpt2Block(s, l, w, n)
		}
		p.Release(s, BlockChunk(l), shard.Forward)
		if d.shape.SparseLayer(l) { // x += the experts of h
			r := d.rows(n)
			if err := d.moe.routeLayer(d.dev, s, a.moeLogits, l, n, d.shape, false); err != nil {
				return nil, err
			}
			d.moe.upload(d.dev, s, l, n, d.shape.TopK, a.moe.tok, a.moe.w)
			if err := expertsForward(d.ops, s, p, d.layout, l, d.moe.routes[l], n, r.h, r.tmp, a.moe, true, nil, nil); err != nil {
				return nil, err
			}
			d.ops.Add(s, r.x, r.tmp, r.x, n*c)
		}
	}

	fc := d.layout.FinalNormChunk()
	fin, err := p.Acquire(s, fc, shard.Forward)
	if err != nil {
		return nil, err
	}
	x, h, eps := a.x.Slice(0, n*c), a.h.Slice(0, n*c), float32(d.shape.Eps())
	if d.shape.IsLlama() {
		gain := fin.Slice(0, c)
		if d.shape.Gemma() {
			gain = a.gains.Slice(0, c)
			d.ops.Fill(s, gain, 1)
			d.ops.Axpy(s, 1, fin.Slice(0, c), gain)
		}
		d.ops.RMSNormForward(s, x, gain, h, a.rstd.Slice(0, n), n, c, eps)
	} else {
		d.ops.LayerNormForward(s, x, fin.Slice(0, c), fin.Slice(c, c), h, a.mean.Slice(0, n), a.rstd.Slice(0, n), n, c, eps)
	}
	if !d.shape.TiedHead() {
		return fin.Slice(c, v*c), nil // lm_head, after norm.weight
	}
	p.Release(s, fc, shard.Forward)
	if emb, err = p.Acquire(s, EmbeddingChunk, shard.Forward); err != nil {
		return nil, err
	}
	return emb.Slice(0, v*c), nil
}

// decoderRows are the views of one call's n rows.
type decoderRows struct {
	x, h, mean, rstd, qkv, att, tmp, mlp, act, pos gpu.Buffer
}

func (d *Decoder) rows(n int) decoderRows {
	a, c := &d.a, d.shape.Dim
	return decoderRows{x: a.x.Slice(0, n*c), h: a.h.Slice(0, n*c), mean: a.mean.Slice(0, n), rstd: a.rstd.Slice(0, n),
		qkv: a.qkv.Slice(0, n*qkvWidth(d.shape)), att: a.att.Slice(0, n*d.shape.AttnDim()), tmp: a.tmp.Slice(0, n*c),
		mlp: a.mlp.Slice(0, n*mlpWidth(d.shape)), act: a.act.Slice(0, n*d.shape.FFNDim()), pos: a.pos.Slice(0, n)}
}

// gpt2Block is gpt2BlockForward for n new tokens, attention reading and
// extending block l's cache:
//
//	x += c_proj(attn(c_attn(ln_1(x))));  x += mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))
func (d *Decoder) gpt2Block(s gpu.Stream, l int, w gpu.Buffer, n int) {
	ops, o, r := d.ops, d.bo, d.rows(n)
	c, f, h := d.shape.Dim, d.shape.FFNDim(), d.shape.Heads
	eps := float32(d.shape.Eps())
	ops.LayerNormForward(s, r.x, w.Slice(o.ln1g, c), w.Slice(o.ln1b, c), r.h, r.mean, r.rstd, n, c, eps)
	linearForward(ops, s, r.h, w.Slice(o.qkvW, 3*c*c), w.Slice(o.qkvB, 3*c), r.qkv, n, c, 3*c)
	ops.AttentionCached(s, r.qkv, d.a.k[l], d.a.v[l], r.att, d.length, n, h, h, d.shape.HeadDim(), gpu.AttnOptions{})
	linearForward(ops, s, r.att, w.Slice(o.projW, c*c), w.Slice(o.projB, c), r.tmp, n, c, c)
	ops.AddLayerNormForward(s, r.x, r.tmp, r.x, w.Slice(o.ln2g, c), w.Slice(o.ln2b, c), r.h, r.mean, r.rstd, n, c, eps)
	ops.Gemm(s, false, true, n, f, c, 1, r.h, w.Slice(o.fcW, f*c), 0, r.mlp)
	ops.BiasGeluForward(s, r.mlp, w.Slice(o.fcB, f), r.act, n, f)
	linearForward(ops, s, r.act, w.Slice(o.fcpW, c*f), w.Slice(o.fcpB, c), r.tmp, n, f, c)
	ops.Add(s, r.x, r.tmp, r.x, n*c)
}

// llamaBlock is llamaBlockForward for n new tokens, rotated at their
// positions, attention reading and extending block l's cache:
//
//	x += o_proj(attn(rope(norm_qk(qkv_proj(rmsnorm_1(x))))));  x += down_proj(act(gate_proj(h)) · up_proj(h)), h = rmsnorm_2(x)
//
// and Gemma's norms after the attention and around the MLP.
func (d *Decoder) llamaBlock(s gpu.Stream, l int, w gpu.Buffer, n int) {
	ops, o, r, sh := d.ops, d.lo, d.rows(n), d.shape
	c, f, q, at := sh.Dim, sh.FFNDim(), qkvWidth(sh), sh.AttnDim()
	h, kv, hd := sh.Heads, sh.KVHeadCount(), sh.HeadDim()
	eps := float32(sh.Eps())
	var bias gpu.Buffer
	if o.qkvB >= 0 {
		bias = w.Slice(o.qkvB, q)
	}
	g := gemmaGains(ops, s, sh, w, d.a.gains, o)
	ops.RMSNormForward(s, r.x, g(o.ln1, c), r.h, r.rstd, n, c, eps)
	linearForward(ops, s, r.h, w.Slice(o.qkvW, q*c), bias, r.qkv, n, c, q)
	if sh.QKNorm() {
		for _, p := range qkParts(h, kv, hd) {
			a, b := d.a.qkA.Slice(0, n*p.width), d.a.qkB.Slice(0, n*p.width)
			gain := g(o.qNorm, hd)
			if p.key {
				gain = g(o.kNorm, hd)
			}
			ops.AddColumns(s, a, r.qkv, n, p.width, p.width, 0, q, p.col, 0)
			ops.RMSNormForward(s, a, gain, b, d.a.qkRstd.Slice(0, n*p.heads), n*p.heads, hd, eps)
			ops.AddColumns(s, r.qkv, b, n, p.width, q, p.col, p.width, 0, 0)
		}
	}
	ops.RopeForward(s, r.qkv, r.pos, 1, n, h, kv, hd, sh.RopeFor(l, d.length+n))
	ops.AttentionCached(s, r.qkv, d.a.k[l], d.a.v[l], r.att, d.length, n, h, kv, hd, sh.AttnFor(l))
	linearForward(ops, s, r.att, w.Slice(o.oW, c*at), nil, r.tmp, n, at, c)
	if sh.Gemma() {
		t2 := d.a.tmp2.Slice(0, n*c)
		ops.RMSNormForward(s, r.tmp, g(o.ln2, c), t2, r.rstd, n, c, eps)
		ops.AddRMSNormForward(s, r.x, t2, r.x, g(o.preFF, c), r.h, r.rstd, n, c, eps)
	} else {
		ops.AddRMSNormForward(s, r.x, r.tmp, r.x, g(o.ln2, c), r.h, r.rstd, n, c, eps)
	}
	if sh.SparseLayer(l) { // the router's logits; Forward runs the experts
		ops.Gemm(s, false, true, n, sh.Experts, c, 1, r.h, w.Slice(o.router, sh.Experts*c), 0, d.a.moeLogits.Slice(0, n*sh.Experts))
		return
	}
	linearForward(ops, s, r.h, w.Slice(o.gateUpW, 2*f*c), nil, r.mlp, n, c, 2*f)
	ops.GLUForward(s, r.mlp, r.act, n, f, mlpAct(sh))
	linearForward(ops, s, r.act, w.Slice(o.downW, c*f), nil, r.tmp, n, f, c)
	if sh.Gemma() {
		t2 := d.a.tmp2.Slice(0, n*c)
		ops.RMSNormForward(s, r.tmp, g(o.postFF, c), t2, r.rstd, n, c, eps)
		ops.Add(s, r.x, t2, r.x, n*c)
		return
	}
	ops.Add(s, r.x, r.tmp, r.x, n*c)
}

// SoftCap makes each logit x cap·tanh(x/cap) (float64, rounded to fp32),
// Gemma 2's final_logit_softcapping; cap 0 leaves them.
func SoftCap(logits []float32, cap float64) {
	if cap <= 0 {
		return
	}
	for i, x := range logits {
		logits[i] = float32(cap * math.Tanh(float64(x)/cap))
	}
}
