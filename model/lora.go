package model

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/gpu"
)

// LoRA is low-rank adaptation (Hu et al. 2021) as PEFT's LoraConfig
// defines it: each adapted linear y = x·Wᵀ (+ b) of every block becomes
//
//	y = x·Wᵀ (+ b) + scaling · (x·Aᵀ)·Bᵀ,   A r×in, B out×r
//
// with scaling = Alpha/R, or Alpha/√R with RSLoRA; A starts
// Kaiming-uniform (PyTorch's kaiming_uniform_ with a = √5, as PEFT: U(−b,
// b), b = 1/√in) and B at zero, so the adapted model starts as the base.
// The base stays frozen; only A and B train.
//
// Where they live: block l's adapters are one chunk of their own,
// AdapterChunk(l), after the base chunks (Layout.WithLoRA), holding for
// each adapted module in block order its A then its B under PEFT's
// tensor names less "base_model.model." and the block prefix's
// "model."/"transformer.": "layers.0.self_attn.q_proj.lora_A.weight".
// The adapted modules are matched as PEFT matches target_modules given as
// a list: a module whose name, or whose path within the block, equals a
// target or ends in "." + target ("c_proj" is GPT-2's attn.c_proj and
// mlp.c_proj alike). A target that matches no module is an error.
//
// Dropout (LoRA.Dropout, in training micro-batches: Batch.Dropout)
// multiplies each module's input by a mask before A, drawn counter-based
// (gpu.DropoutKeep) from a stream per step, block and module and each
// element's global row, so the backward and a recomputation draw it
// again, whatever the split of the batch.
//
// The passes (lora.go's loraForward and loraBackward, called from the
// blocks right after the base linear they adapt): the forward copies the
// block's adapter chunk into the model's workspace (the Params rules hold
// one chunk acquired at a time, so the adapter chunk is acquired and
// released before its block's), then per module t = x·Aᵀ and y +=
// scaling·t·Bᵀ; where one GEMM computes several modules (q|k|v, the Llama
// family's gate|up) the module's columns are added with AddColumns. The
// backward recomputes t, then dB += scaling·dyᵀ·t, dt = scaling·dy·B, dA +=
// dtᵀ·x and dx += dt·A, the adapters' gradients accumulating in an fp32
// workspace that Grad(a), after the block's GradReady, adds in (so that
// no more than two gradients are open at once, the tied embedding's being
// one). With the base frozen (FrozenParams) its weight and bias gradients
// are not computed at all: a frozen linear's backward is the one GEMM of
// dx (the norms' gains still accumulate into the frozen chunk's Grad
// buffer, a reduction over the rows).
type LoRA struct {
	R       int      `json:"r"`              // rank, > 0
	Alpha   float64  `json:"alpha"`          // lora_alpha
	Dropout float64  `json:"dropout"`        // lora_dropout: the adapters' input dropout probability, [0, 1)
	Targets []string `json:"target_modules"` // ["all-linear"]: every linear of the blocks
	RSLoRA  bool     `json:"use_rslora"`     // scaling Alpha/√R
	// Base is strata.lora.base_dtype's dtype (NF4, INT8; 0: bf16): how
	// the engine stores the frozen base, nothing of the model's math (not
	// recorded, not compared).
	Base dtype.DType `json:"-"`
}

// Scaling is the factor of the adapter's output.
func (o *LoRA) Scaling() float64 {
	if o.RSLoRA {
		return o.Alpha / math.Sqrt(float64(o.R))
	}
	return o.Alpha / float64(o.R)
}

// The GEMM outputs a block's adapted modules add to.
const (
	siteQKV     = iota // GPT-2 c_attn; Llama q_proj, k_proj, v_proj
	siteAttnOut        // GPT-2 attn.c_proj; Llama o_proj
	siteUp             // GPT-2 mlp.c_fc; Llama gate_proj, up_proj
	siteDown           // GPT-2 mlp.c_proj; Llama down_proj
	siteRouter         // a mixture of experts' router (Mixtral's block_sparse_moe.gate, Qwen3-MoE's mlp.gate)
	siteExperts        // expert e's gate and up: siteExperts + 2e; its down: siteExperts + 2e + 1
)

// expertSite is expert e's gate|up site, or with down its down site.
func expertSite(e int, down bool) int {
	if down {
		return siteExperts + 2*e + 1
	}
	return siteExperts + 2*e
}

// loraModule is one adaptable linear of a block.
type loraModule struct {
	name    string // PEFT's module name: "q_proj", "c_attn", ...
	path    string // within the block: "self_attn.q_proj", "attn.c_attn"
	in, out int
	index   int // its place among the block's adaptable modules (blockModules): its dropout stream
	site    int // the GEMM output it adds to
	off     int // its first column there
	width   int // the columns of that output
	a, b    int // its A and B's offsets in the adapter chunk (adapted modules only)
}

// blockModules are the linears of block l of s that LoRA can adapt, in
// block order: a mixture of experts' sparse layer has, after the
// attention's, its router and each expert's gate (w1), up (w3) and down
// (w2), under PEFT's module names.
func blockModules(s Shape, l int) []loraModule {
	c, f := s.Dim, s.FFNDim()
	if !s.IsLlama() {
		return []loraModule{
			{name: "c_attn", path: "attn.c_attn", in: c, out: 3 * c, site: siteQKV, width: 3 * c},
			{name: "c_proj", path: "attn.c_proj", in: c, out: c, site: siteAttnOut, width: c},
			{name: "c_fc", path: "mlp.c_fc", in: c, out: f, site: siteUp, width: f},
			{name: "c_proj", path: "mlp.c_proj", in: f, out: c, site: siteDown, width: c},
		}
	}
	q, kv := s.AttnDim(), s.KVHeadCount()*s.HeadDim()
	w := q + 2*kv
	if s.Fused() { // Phi-3: one adapter on each fused linear, as PEFT puts it
		return []loraModule{
			{name: "qkv_proj", path: "self_attn.qkv_proj", in: c, out: w, site: siteQKV, width: w},
			{name: "o_proj", path: "self_attn.o_proj", in: q, out: c, site: siteAttnOut, width: c},
			{name: "gate_up_proj", path: "mlp.gate_up_proj", in: c, out: 2 * f, site: siteUp, width: 2 * f},
			{name: "down_proj", path: "mlp.down_proj", in: f, out: c, site: siteDown, width: c},
		}
	}
	attn := []loraModule{
		{name: "q_proj", path: "self_attn.q_proj", in: c, out: q, site: siteQKV, off: 0, width: w},
		{name: "k_proj", path: "self_attn.k_proj", in: c, out: kv, site: siteQKV, off: q, width: w},
		{name: "v_proj", path: "self_attn.v_proj", in: c, out: kv, site: siteQKV, off: q + kv, width: w},
		{name: "o_proj", path: "self_attn.o_proj", in: q, out: c, site: siteAttnOut, width: c},
	}
	if !s.SparseLayer(l) {
		return append(attn,
			loraModule{name: "gate_proj", path: "mlp.gate_proj", in: c, out: f, site: siteUp, off: 0, width: 2 * f},
			loraModule{name: "up_proj", path: "mlp.up_proj", in: c, out: f, site: siteUp, off: f, width: 2 * f},
			loraModule{name: "down_proj", path: "mlp.down_proj", in: f, out: c, site: siteDown, width: c})
	}
	ne, fe := s.Experts, s.ExpertFFNDim()
	router := strings.TrimSuffix(routerName(s), ".weight")
	out := append(attn, loraModule{name: "gate", path: router, in: c, out: ne, site: siteRouter, width: ne})
	for e := range ne {
		names, _ := expertTensors(s, l, e)
		mod := func(i int) (string, string) {
			p := strings.TrimSuffix(strings.TrimPrefix(names[i], fmt.Sprintf("layers.%d.", l)), ".weight")
			return p[strings.LastIndexByte(p, '.')+1:], p
		}
		gn, gp := mod(0)
		un, up := mod(1)
		dn, dp := mod(2)
		out = append(out,
			loraModule{name: gn, path: gp, in: c, out: fe, site: expertSite(e, false), off: 0, width: 2 * fe},
			loraModule{name: un, path: up, in: c, out: fe, site: expertSite(e, false), off: fe, width: 2 * fe},
			loraModule{name: dn, path: dp, in: fe, out: c, site: expertSite(e, true), width: c})
	}
	return out
}

// blockPrefix is the prefix of block l's tensor names.
func blockPrefix(s Shape, l int) string {
	if s.IsLlama() {
		return fmt.Sprintf("layers.%d.", l)
	}
	return fmt.Sprintf("h.%d.", l)
}

// Validate says what is wrong with o for shape s: its numbers, and a
// target that matches none of the blocks' linears (naming the ones it
// could).
func (o *LoRA) Validate(s Shape) error {
	_, err := o.modules(s, -1)
	return err
}

// modules are block l's adapted modules, with their offsets in its
// adapter chunk; l < 0 checks every block (a target must match a linear
// of some block) and returns the first's.
func (o *LoRA) modules(s Shape, l int) ([]loraModule, error) {
	if l >= 0 || s.Layers == 0 {
		return o.blockModules(s, max(l, 0), true)
	}
	hit := map[string]bool{}
	var first []loraModule
	for i := range s.Layers {
		mods, err := o.blockModules(s, i, false)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			first = mods
		}
		for _, m := range mods {
			for _, t := range o.Targets {
				if t == "all-linear" || m.name == t || m.path == t || strings.HasSuffix(m.path, "."+t) {
					hit[t] = true
				}
			}
		}
	}
	for _, t := range o.Targets {
		if !hit[t] {
			var names []string
			for i := range s.Layers {
				for _, m := range blockModules(s, i) {
					if !slices.Contains(names, m.name) {
						names = append(names, m.name)
					}
				}
			}
			return nil, fmt.Errorf("strata.lora.target_modules: %q matches no linear of a %s block (its linears: %s)", t, s.Arch, strings.Join(names, ", "))
		}
	}
	return first, nil
}

// blockModules is modules of block l; with strict a target that matches
// none of its linears is an error.
func (o *LoRA) blockModules(s Shape, l int, strict bool) ([]loraModule, error) {
	switch {
	case o.R <= 0:
		return nil, fmt.Errorf("strata.lora.r: %d must be > 0", o.R)
	case math.IsNaN(o.Alpha) || math.IsInf(o.Alpha, 0) || o.Alpha <= 0:
		return nil, fmt.Errorf("strata.lora.alpha: %g must be a positive number", o.Alpha)
	case !(o.Dropout >= 0 && o.Dropout < 1):
		return nil, fmt.Errorf("strata.lora.dropout: %g is not in [0, 1)", o.Dropout)
	case len(o.Targets) == 0:
		return nil, fmt.Errorf("strata.lora.target_modules: empty; name the linears to adapt")
	case s.MoE() && o.Dropout > 0:
		return nil, fmt.Errorf("strata.lora.dropout: %g: dropout on the adapters of a mixture of experts (%s) is not built; set it to 0", o.Dropout, s.Arch)
	}
	all := blockModules(s, l)
	var names []string
	for _, m := range all {
		if !slices.Contains(names, m.name) {
			names = append(names, m.name)
		}
	}
	matched := make([]bool, len(all))
	if len(o.Targets) == 1 && o.Targets[0] == "all-linear" { // PEFT's: every linear but the output head
		for i := range matched {
			matched[i] = true
		}
	}
	for _, t := range o.Targets {
		if t == "all-linear" {
			if len(o.Targets) > 1 {
				return nil, fmt.Errorf("strata.lora.target_modules: \"all-linear\" is a list's only entry")
			}
			continue
		}
		hit := false
		for i, m := range all {
			if m.name == t || m.path == t || strings.HasSuffix(m.path, "."+t) {
				matched[i], hit = true, true
			}
		}
		if !hit && strict && !s.MoE() {
			return nil, fmt.Errorf("strata.lora.target_modules: %q matches no linear of a %s block (its linears: %s)", t, s.Arch, strings.Join(names, ", "))
		}
	}
	var out []loraModule
	off := 0
	for i, m := range all {
		if !matched[i] {
			continue
		}
		m.index = i
		m.a, m.b = off, off+o.R*m.in
		off = m.b + m.out*o.R
		out = append(out, m)
	}
	return out, nil
}

// WithLoRA returns a copy of l with the adapter chunks of o appended, one
// per block (AdapterChunk), and LoRA set.
func (l *Layout) WithLoRA(o LoRA) (*Layout, error) {
	if l.LoRA != nil {
		return nil, fmt.Errorf("model: layout %q already has LoRA adapters", l.Name)
	}
	if l.Shape.Layers == 0 {
		return nil, fmt.Errorf("model: LoRA adapts a decoder's blocks; layout %q has none", l.Name)
	}
	if _, err := o.modules(l.Shape, -1); err != nil {
		return nil, err
	}
	o.Targets = slices.Clone(o.Targets)
	out := &Layout{Name: l.Name, Shape: l.Shape, Chunks: slices.Clone(l.Chunks), LoRA: &o}
	for i := range l.Shape.Layers {
		mods, err := o.modules(l.Shape, i)
		if err != nil {
			return nil, err
		}
		var names []string
		var shapes [][]int
		for _, m := range mods {
			p := blockPrefix(l.Shape, i) + m.path
			names = append(names, p+".lora_A.weight", p+".lora_B.weight")
			shapes = append(shapes, []int{o.R, m.in}, []int{m.out, o.R})
		}
		out.Chunks = append(out.Chunks, makeChunk(len(out.Chunks), fmt.Sprintf("block %d lora", i), names, shapes))
	}
	return out, nil
}

// AdapterChunk is the chunk of block layer's LoRA adapters, or -1 without
// LoRA.
func (l *Layout) AdapterChunk(layer int) int {
	if l.LoRA == nil {
		return -1
	}
	return l.baseChunks() + layer
}

// IsAdapter says whether chunk c holds LoRA adapters.
func (l *Layout) IsAdapter(c int) bool {
	return l.LoRA != nil && c >= l.baseChunks() && c < len(l.Chunks)
}

// FrozenParams is the optional interface of a Params whose chunks may be
// frozen (LoRA's base, strata.freeze): the backward of a frozen chunk
// computes the gradients that flow through it (its inputs') and not those
// of its own weights, so its Grad buffer is not written by any weight
// GEMM. The Params calls are the same (AccessOrder).
type FrozenParams interface {
	Frozen(c int) bool
}

// loraState is a Model's adapters: the modules per site, the scaling and
// the workspace planActivations lays out (activations.lora*).
type loraState struct {
	mods    [][]loraModule // per block: its adapted modules
	scaling float32
	// dropout: the threshold and scale of gpu.Dropout (threshold 0: none),
	// and xd, bt×(widest input), the dropped input (in the backward also
	// the dropped input gradient).
	threshold uint32
	dropScale float32
	xd        gpu.Buffer
	w         gpu.Buffer // the block's adapter chunk, copied
	g         gpu.Buffer // the block's adapter gradient, F32, accumulated by its backward
	t, dt     gpu.Buffer // bt×r each: x·Aᵀ and its gradient
	wide      gpu.Buffer // bt×(widest module sharing a GEMM output): y's or dy's columns
}

// loraWorkspace is what planActivations lays out for o on a shape s: the
// adapter chunk's elements, the columns of the widest module that shares
// its GEMM output with others (0: none does), and with dropout the widest
// input (0: no dropout).
func loraWorkspace(s Shape, o *LoRA) (chunk, wide, in int) {
	for l := range s.Layers {
		mods, err := o.modules(s, l)
		if err != nil {
			return 0, 0, 0
		}
		n := 0
		for _, m := range mods {
			n += o.R * (m.in + m.out)
			if m.out != m.width {
				wide = max(wide, m.out)
			}
			if o.Dropout > 0 {
				in = max(in, m.in)
			}
		}
		chunk = max(chunk, n)
	}
	return chunk, wide, in
}

// dropoutOn says whether the adapters' inputs are dropped in this pass: a
// training micro-batch (Batch.Dropout) of a LoRA with dropout.
func (m *Model) dropoutOn() bool { return m.lora != nil && m.lora.threshold > 0 && m.drop != nil }

// loraDropout writes module md's dropped input (x, bt×in, dropped as
// gpu.DropoutKeep decides for the block's layer, the module and each
// element's global row) into the workspace and returns it.
func (m *Model) loraDropout(s gpu.Stream, md loraModule, x gpu.Buffer) gpu.Buffer {
	lo, bt := m.lora, m.batch*m.seq
	xd := lo.xd.Slice(0, bt*md.in)
	m.dropMask(s, md, x, xd)
	return xd
}

// dropMask applies module md's mask to x (bt×in) into y (y may be x).
func (m *Model) dropMask(s gpu.Stream, md loraModule, x, y gpu.Buffer) {
	lo, bt := m.lora, m.batch*m.seq
	m.ops.Dropout(s, x, y, bt*md.in, dropoutSeed(m.drop.Seed, m.layer, md.index), m.drop.FirstRow*int64(m.seq*md.in), lo.threshold, lo.dropScale)
}

// dropoutSeed is the dropout stream of module index of block layer for a
// step's seed.
func dropoutSeed(seed uint64, layer, index int) uint64 {
	z := seed ^ (uint64(layer)<<16|uint64(index))*0xd1b54a32d192ed03
	z = (z ^ z>>32) * 0x9e3779b97f4a7c15
	return z ^ z>>29
}

// newLoRAState groups o's modules by site, over the workspace in a.
func newLoRAState(s Shape, o *LoRA, a *activations) *loraState {
	st := &loraState{scaling: float32(o.Scaling()), w: a.loraW, g: a.loraG, t: a.loraT, dt: a.loraDT, wide: a.loraWide, xd: a.loraXD}
	st.threshold, st.dropScale = gpu.DropoutThreshold(o.Dropout)
	for l := range s.Layers {
		mods, err := o.modules(s, l)
		if err != nil {
			panic(err) // validated by ActivationOptions.Validate
		}
		st.mods = append(st.mods, mods)
	}
	return st
}

// site is the current block's adapted modules that add to site.
func (lo *loraState) site(l, site int) []loraModule {
	var out []loraModule
	for _, m := range lo.mods[l] {
		if m.site == site {
			out = append(out, m)
		}
	}
	return out
}

// loraForward adds the adapters of site to y (bt×width), the output of
// the base linear whose input is x (bt×in).
func (m *Model) loraForward(s gpu.Stream, site int, x, y gpu.Buffer) {
	m.loraForwardRows(s, site, x, y, m.batch*m.seq)
}

// loraForwardRows is loraForward over bt rows (an expert's tokens).
func (m *Model) loraForwardRows(s gpu.Stream, site int, x, y gpu.Buffer, bt int) {
	lo := m.lora
	if lo == nil {
		return
	}
	ops, r := m.ops, m.act.LoRA.R
	t := lo.t.Slice(0, bt*r)
	for _, md := range lo.site(m.layer, site) {
		a, b := lo.w.Slice(md.a, r*md.in), lo.w.Slice(md.b, md.out*r)
		xin := x
		if m.dropoutOn() {
			xin = m.loraDropout(s, md, x)
		}
		ops.Gemm(s, false, true, bt, r, md.in, 1, xin, a, 0, t) // t = dropout(x)·Aᵀ (bt×r)
		if md.out == md.width {
			ops.Gemm(s, false, true, bt, md.out, r, lo.scaling, t, b, 1, y) // y += scaling·t·Bᵀ
			continue
		}
		u := lo.wide.Slice(0, bt*md.out)
		ops.Gemm(s, false, true, bt, md.out, r, lo.scaling, t, b, 0, u)
		ops.AddColumns(s, y, u, bt, md.out, md.width, md.off, md.out, 0, 1)
	}
}

// loraBackward accumulates the gradients of site's adapters from dy
// (bt×width, the gradient of the base linear's output) and x (its input),
// and adds their share of the input's gradient to dx; with dx nil it
// stops before that, leaving the site's one module's dt in the workspace
// for loraInputGrad (the Llama down projection's input buffer becomes
// its gradient, so the adapter must read x before dx is written).
func (m *Model) loraBackward(s gpu.Stream, site int, dy, x, dx gpu.Buffer) {
	m.loraBackwardRows(s, site, dy, x, dx, m.batch*m.seq)
}

// loraBackwardRows is loraBackward over bt rows (an expert's tokens).
func (m *Model) loraBackwardRows(s gpu.Stream, site int, dy, x, dx gpu.Buffer, bt int) {
	lo := m.lora
	if lo == nil {
		return
	}
	ops, r := m.ops, m.act.LoRA.R
	mods := lo.site(m.layer, site)
	if dx == nil && len(mods) > 1 {
		panic("model: a deferred LoRA input gradient needs a site of one module")
	}
	t, dt := lo.t.Slice(0, bt*r), lo.dt.Slice(0, bt*r)
	for _, md := range mods {
		a, b := lo.w.Slice(md.a, r*md.in), lo.w.Slice(md.b, md.out*r)
		ga, gb := lo.g.Slice(md.a, r*md.in), lo.g.Slice(md.b, md.out*r)
		dym := dy
		if md.out != md.width {
			dym = lo.wide.Slice(0, bt*md.out)
			ops.AddColumns(s, dym, dy, bt, md.out, md.out, 0, md.width, md.off, 0)
		}
		xin := x
		if m.dropoutOn() {
			xin = m.loraDropout(s, md, x) // the forward's mask, again
		}
		ops.Gemm(s, false, true, bt, r, md.in, 1, xin, a, 0, t)             // t = dropout(x)·Aᵀ, again
		ops.Gemm(s, true, false, md.out, r, bt, lo.scaling, dym, t, 1, gb)  // dB += scaling·dyᵀ·t
		ops.Gemm(s, false, false, bt, r, md.out, lo.scaling, dym, b, 0, dt) // dt = scaling·dy·B
		ops.Gemm(s, true, false, r, md.in, bt, 1, dt, xin, 1, ga)           // dA += dtᵀ·dropout(x)
		if dx != nil {
			m.loraAddInputGrad(s, md, dx, bt)
		}
	}
}

// loraAddInputGrad adds module md's share of the input's gradient to dx:
// dt·A, through the module's dropout mask when there is one.
func (m *Model) loraAddInputGrad(s gpu.Stream, md loraModule, dx gpu.Buffer, bt int) {
	lo, r := m.lora, m.act.LoRA.R
	a, dt := lo.w.Slice(md.a, r*md.in), lo.dt.Slice(0, bt*r)
	if !m.dropoutOn() {
		m.ops.Gemm(s, false, false, bt, md.in, r, 1, dt, a, 1, dx) // dx += dt·A
		return
	}
	g := lo.xd.Slice(0, bt*md.in)
	m.ops.Gemm(s, false, false, bt, md.in, r, 1, dt, a, 0, g) // dt·A
	m.dropMask(s, md, g, g)
	m.ops.Add(s, dx, g, dx, bt*md.in)
}

// loraInputGrad adds the input gradient loraBackward(site, …, nil) left
// in the workspace to dx.
func (m *Model) loraInputGrad(s gpu.Stream, site int, dx gpu.Buffer) {
	m.loraInputGradRows(s, site, dx, m.batch*m.seq)
}

// loraInputGradRows is loraInputGrad over bt rows.
func (m *Model) loraInputGradRows(s gpu.Stream, site int, dx gpu.Buffer, bt int) {
	lo := m.lora
	if lo == nil {
		return
	}
	if mods := lo.site(m.layer, site); len(mods) > 0 {
		m.loraAddInputGrad(s, mods[0], dx, bt)
	}
}

// same says whether o and p are the same adapters.
func (o *LoRA) same(p *LoRA) bool {
	return o.R == p.R && o.Alpha == p.Alpha && o.Dropout == p.Dropout && o.RSLoRA == p.RSLoRA && slices.Equal(o.Targets, p.Targets)
}

// ChunkLayer is the block (layer) chunk c belongs to: its own for a block
// chunk, its layer's for an expert chunk; -1 for the others.
func (l *Layout) ChunkLayer(c int) int {
	switch {
	case c >= BlockChunk(0) && c < BlockChunk(l.Shape.Layers):
		return c - BlockChunk(0)
	case l.IsExpert(c):
		return l.expertLayer(c)
	}
	return -1
}

// MergeLoRA adds its layer's adapters to the base weights of chunk c (a
// block's, or one of its experts': ChunkLayer): W += scaling·B·A for
// every adapted module whose weight is in c, values holding chunk c's
// values and adapter the layer's adapter chunk's (both fp32, in the
// layout's order). Each product is summed in float64 and added once, so
// the merged weight is W + scaling·B·A correctly rounded from the fp32
// operands' exact product, up to that sum's float64 rounding.
func (l *Layout) MergeLoRA(c int, values, adapter []float32) error {
	if l.LoRA == nil {
		return fmt.Errorf("model: merge: layout %q has no LoRA adapters", l.Name)
	}
	layer := l.ChunkLayer(c)
	if layer < 0 {
		return fmt.Errorf("model: merge: chunk %d (%s) has no adapters", c, l.Chunks[c].Name)
	}
	bc, ac := l.Chunks[c], l.Chunks[l.AdapterChunk(layer)]
	if len(values) != bc.Len || len(adapter) != ac.Len {
		return fmt.Errorf("model: merge %s: %d and %d values, the chunks have %d and %d", bc.Name, len(values), len(adapter), bc.Len, ac.Len)
	}
	mods, err := l.LoRA.modules(l.Shape, layer)
	if err != nil {
		return err
	}
	r, s := l.LoRA.R, l.LoRA.Scaling()
	acc := make([]float64, 0)
	for _, m := range mods {
		name := blockPrefix(l.Shape, layer) + m.path + ".weight"
		t, ok := bc.Tensor(name)
		if !ok && (l.IsExpert(c) || strings.Contains(m.path, ".experts.")) {
			continue // in another of the layer's chunks: the block's, or another expert's
		}
		if !ok || t.Len != m.out*m.in {
			return fmt.Errorf("model: merge: %s has no %s of %d×%d", bc.Name, name, m.out, m.in)
		}
		w := values[t.Offset : t.Offset+t.Len]
		a, b := adapter[m.a:m.a+r*m.in], adapter[m.b:m.b+m.out*r]
		acc = slices.Grow(acc[:0], m.in)[:m.in]
		for i := range m.out {
			clear(acc)
			for k := range r {
				bik := float64(b[i*r+k])
				for j, x := range a[k*m.in : (k+1)*m.in] {
					acc[j] += bik * float64(x)
				}
			}
			row := w[i*m.in : (i+1)*m.in]
			for j := range row {
				row[j] = float32(float64(row[j]) + s*acc[j])
			}
		}
	}
	return nil
}

// Base is l without its LoRA adapters: the layout of the merged model.
func (l *Layout) Base() *Layout {
	if l.LoRA == nil {
		return l
	}
	return &Layout{Name: l.Name, Shape: l.Shape, Chunks: l.Chunks[:l.baseChunks()]}
}
