package model

import (
	"fmt"
	"math"
	"strings"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/shard"
)

// A mixture of experts (Mixtral, Qwen3-MoE), as Hugging Face's
// MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock compute it. In a sparse
// layer the MLP is
//
//	p      = softmax(router(h))                       h = post_attention_layernorm(res2), E probabilities per token, fp32
//	sel, w = top-k of p                               (renormalised to sum 1: Mixtral always, Qwen3-MoE with norm_topk_prob)
//	out    = res2 + Σ_{e in sel, ascending} w_e · expert_e(h),  expert_e(h) = w2(silu(w1 h) · w3 h)
//
// and with output_router_logits the loss gains router_aux_loss_coef times
// the load-balancing loss of load_balancing_loss_func over the sparse
// layers' N = layers·B·T rows: E · Σ_e (selections of e / N) · (mean of p_e).
//
// Each expert is a chunk of its own (Layout.ExpertChunk: after the final
// chunk, w1|w3 adjacent so one GEMM computes gate and up, then w2), so the
// tier store places and moves it on its own. The routing runs on the host:
// the block's router logits come down (the stream is synchronized once per
// sparse layer), the host picks each token's experts and groups the tokens
// by expert (expert-major, tokens ascending), and each expert is one GEMM
// over its tokens' gathered rows. Every expert chunk is acquired in the
// access order, whether tokens reached it or not: an expert no token
// reached gets a zero gradient (DeepSpeed's choice, not PyTorch's skipped
// parameter), so its AdamW step still decays its moments and, with weight
// decay, its weights, on every stage and tier alike.

// MoE says whether s is a mixture of experts (ArchMixtral, ArchQwen3MoE).
func (s Shape) MoE() bool { return s.Arch == ArchMixtral || s.Arch == ArchQwen3MoE }

func (s Shape) moeFields() bool {
	return s.Experts != 0 || s.TopK != 0 || s.ExpertFFN != 0 || s.NormTopK || s.MLPLayers != "" || s.RouterAux || s.RouterAuxCoef != 0
}

// checkMoE says what is wrong with a mixture of experts' fields.
func (s Shape) checkMoE() error {
	if !s.MoE() {
		return nil
	}
	switch {
	case s.Experts < 1:
		return fmt.Errorf("model: num_experts %d must be >= 1 for %s", s.Experts, s.Arch)
	case s.TopK < 1 || s.TopK > s.Experts:
		return fmt.Errorf("model: num_experts_per_tok %d must be in [1, num_experts %d]", s.TopK, s.Experts)
	case s.ExpertFFN < 0:
		return fmt.Errorf("model: moe_intermediate_size %d must not be negative", s.ExpertFFN)
	case math.IsNaN(s.RouterAuxCoef) || math.IsInf(s.RouterAuxCoef, 0) || s.RouterAuxCoef < 0:
		return fmt.Errorf("model: router_aux_loss_coef %g must be a finite number >= 0", s.RouterAuxCoef)
	case s.Arch == ArchMixtral && s.MLPLayers != "":
		return fmt.Errorf("model: mlp_layers %q: every Mixtral layer is sparse", s.MLPLayers)
	case s.MLPLayers != "" && (len(s.MLPLayers) != s.Layers || strings.Trim(s.MLPLayers, "de") != ""):
		return fmt.Errorf("model: mlp_layers %q must be one letter per layer (%d), 'e' experts or 'd' a dense MLP", s.MLPLayers, s.Layers)
	}
	return nil
}

// checkedExpertParams bounds the experts' parameters, E·3·C·F_e per layer,
// through checked arithmetic (0 for a dense shape).
func (s Shape) checkedExpertParams() (int64, bool) {
	if !s.MoE() {
		return 0, true
	}
	per, ok1 := units.Mul(3*int64(max(s.Dim, 0)), int64(max(s.ExpertFFNDim(), 0)))
	layer, ok2 := units.Mul(per, int64(max(s.Experts, 0))+1)
	all, ok3 := units.Mul(layer, int64(max(s.Layers, 0)))
	return all, ok1 && ok2 && ok3
}

// ExpertFFNDim is an expert's hidden size: ExpertFFN, or FFNDim when 0.
func (s Shape) ExpertFFNDim() int {
	if s.ExpertFFN == 0 {
		return s.FFNDim()
	}
	return s.ExpertFFN
}

// NormTopKProb says whether the top-k routing weights are renormalised to
// sum to 1: always for Mixtral, NormTopK for Qwen3-MoE.
func (s Shape) NormTopKProb() bool { return s.Arch == ArchMixtral || s.NormTopK }

// SparseLayer says whether layer l's MLP is a mixture of experts.
func (s Shape) SparseLayer(l int) bool {
	return s.MoE() && (s.MLPLayers == "" || s.MLPLayers[l] == 'e')
}

// SparseLayers is the number of layers whose MLP is a mixture of experts.
func (s Shape) SparseLayers() int {
	n := 0
	for l := range s.Layers {
		if s.SparseLayer(l) {
			n++
		}
	}
	return n
}

// ExpertParamCount is one expert's parameters: w1 and w3 (F_e×C each) and
// w2 (C×F_e).
func (s Shape) ExpertParamCount() int64 { return 3 * int64(s.Dim) * int64(s.ExpertFFNDim()) }

// BlockChunkParamCount is block chunk l's parameters: a dense block's
// (BlockParamCount), or a sparse layer's attention, norms and router (E×C)
// without its experts.
func (s Shape) BlockChunkParamCount(l int) int64 {
	n := s.BlockParamCount()
	if s.SparseLayer(l) {
		n += int64(s.Experts)*int64(s.Dim) - 3*int64(s.Dim)*int64(s.FFNDim())
	}
	return n
}

// LayerParamCount is layer l's parameters: its block chunk and, for a
// sparse layer, all its experts.
func (s Shape) LayerParamCount(l int) int64 {
	n := s.BlockChunkParamCount(l)
	if s.SparseLayer(l) {
		n += int64(s.Experts) * s.ExpertParamCount()
	}
	return n
}

// ActiveParamCount is the parameters one token computes with: ParamCount
// with TopK experts per sparse layer instead of all of them (ParamCount
// for a dense shape).
func (s Shape) ActiveParamCount() int64 {
	if !s.MoE() {
		return s.ParamCount()
	}
	return s.ParamCount() - int64(s.SparseLayers())*int64(s.Experts-s.TopK)*s.ExpertParamCount()
}

// ExpertsReached is how many of a sparse layer's experts tokens tokens
// reach on average when each token's TopK experts are drawn uniformly
// (a router near its initialisation): E·(1 − (1 − k/E)^tokens). A
// skewed router reaches fewer; Experts for a dense shape.
func (s Shape) ExpertsReached(tokens int) float64 {
	if !s.MoE() {
		return float64(s.Experts)
	}
	e := float64(s.Experts)
	return e * (1 - math.Pow(1-float64(s.TopK)/e, float64(max(tokens, 0))))
}

// PassParamCount is the parameters a training pass over tokens tokens
// reads: ParamCount with ExpertsReached experts per sparse layer (the
// engine acquires only those: model.ExpertRouter); ParamCount for a dense
// shape.
func (s Shape) PassParamCount(tokens int) float64 {
	if !s.MoE() {
		return float64(s.ParamCount())
	}
	unread := float64(s.Experts) - s.ExpertsReached(tokens)
	return float64(s.ParamCount()) - float64(s.SparseLayers())*unread*float64(s.ExpertParamCount())
}

// routerName is the router's tensor name in a sparse block (less the
// layer prefix): Mixtral's block_sparse_moe.gate, Qwen3-MoE's mlp.gate.
func routerName(s Shape) string {
	if s.Arch == ArchMixtral {
		return "block_sparse_moe.gate.weight"
	}
	return "mlp.gate.weight"
}

// expertTensors are the names and shapes of expert e of layer l, in chunk
// order: gate (w1) and up (w3) adjacent, then down (w2).
func expertTensors(s Shape, l, e int) ([]string, [][]int) {
	c, f := s.Dim, s.ExpertFFNDim()
	shapes := [][]int{{f, c}, {f, c}, {c, f}}
	if s.Arch == ArchMixtral {
		p := fmt.Sprintf("layers.%d.block_sparse_moe.experts.%d.", l, e)
		return []string{p + "w1.weight", p + "w3.weight", p + "w2.weight"}, shapes
	}
	p := fmt.Sprintf("layers.%d.mlp.experts.%d.", l, e)
	return []string{p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"}, shapes
}

// ExpertChunks is the number of expert chunks: Experts per sparse layer.
func (l *Layout) ExpertChunks() int {
	if l.Shape.Layers == 0 || !l.Shape.MoE() {
		return 0
	}
	return l.Shape.SparseLayers() * l.Shape.Experts
}

// baseChunks is the number of the model's own chunks (the adapters come
// after them): embeddings, blocks, the final chunk and the experts.
func (l *Layout) baseChunks() int {
	if l.Shape.Layers == 0 { // a custom layout
		return len(l.Chunks)
	}
	return l.Shape.Layers + 2 + l.ExpertChunks()
}

// ExpertChunk is the chunk of expert e of layer layer, or -1 when that
// layer is dense. The experts follow the final chunk, layer by layer.
func (l *Layout) ExpertChunk(layer, e int) int { return expertChunk(l.Shape, layer, e) }

func expertChunk(s Shape, layer, e int) int {
	if !s.SparseLayer(layer) || e < 0 || e >= s.Experts {
		return -1
	}
	i := 0
	for j := range layer {
		if s.SparseLayer(j) {
			i++
		}
	}
	return s.Layers + 2 + i*s.Experts + e
}

// expertLayer is the layer of expert chunk c.
func (l *Layout) expertLayer(c int) int {
	i := (c - l.Shape.Layers - 2) / l.Shape.Experts
	for layer := range l.Shape.Layers {
		if l.Shape.SparseLayer(layer) {
			if i == 0 {
				return layer
			}
			i--
		}
	}
	return -1
}

// IsExpert says whether chunk c holds an expert.
func (l *Layout) IsExpert(c int) bool {
	base := l.Shape.Layers + 2
	return l.ExpertChunks() > 0 && c >= base && c < base+l.ExpertChunks()
}

// expertLayers appends the expert chunks of every sparse layer to ch.
func expertChunks(s Shape, ch []Chunk) []Chunk {
	for l := range s.Layers {
		if !s.SparseLayer(l) {
			continue
		}
		for e := range s.Experts {
			names, shapes := expertTensors(s, l, e)
			ch = append(ch, makeChunk(len(ch), fmt.Sprintf("block %d expert %d", l, e), names, shapes))
		}
	}
	return ch
}

// moeRoute is one sparse layer's routing of the last Forward, on the host.
type moeRoute struct {
	probs   []float32 // B·T×E: the softmax of the router logits
	sel     []int32   // B·T×k: each token's experts, in top-k order
	weights []float32 // B·T×k: their routing weights
	row     []int32   // B·T×k: the grouped row of each selection
	offsets []int     // E+1: expert e's grouped rows are [offsets[e], offsets[e+1])
	next    []int     // E: the grouping's cursor per expert
	tok     []byte    // I32 per grouped row: its token (uploaded)
	w       []byte    // F32 per grouped row: its routing weight (uploaded)
	reached []bool    // E: a token was routed to expert e (ExpertRouter's question)
	acquire []bool    // E: ExpertRouter's answer, the experts the passes acquire; nil: all
}

// moeState is a mixture of experts' routing: per sparse layer, and the
// load-balancing loss's sums over the layers.
type moeState struct {
	routes    []*moeRoute // per layer; nil for a dense one
	logits    []byte      // B·T×E F32: the router logits down, their gradient up
	dw        []byte      // B·T·k F32: the routing weights' gradient down
	count     []float64   // E: selections of each expert over the sparse layers
	probSum   []float64   // E: the sum of its probabilities
	rows      int         // the rows counted: sparse layers × B·T
	dp, g     []float64   // E each: routerGrad's scratch
	lastAux   []float64   // those of the Forwards the last Losses read
	uploadsOf int         // the layer whose routing the device buffers hold (-1: none)
}

func newMoEState(s Shape, bt int) *moeState {
	st := &moeState{routes: make([]*moeRoute, s.Layers), logits: make([]byte, 4*bt*s.Experts), dw: make([]byte, 4*bt*s.TopK),
		count: make([]float64, s.Experts), probSum: make([]float64, s.Experts), uploadsOf: -1,
		dp: make([]float64, s.Experts), g: make([]float64, s.Experts)}
	k, e := s.TopK, s.Experts
	for l := range s.Layers {
		if s.SparseLayer(l) {
			st.routes[l] = &moeRoute{probs: make([]float32, bt*e), reached: make([]bool, e), sel: make([]int32, bt*k), weights: make([]float32, bt*k),
				row: make([]int32, bt*k), offsets: make([]int, e+1), next: make([]int, e), tok: make([]byte, 4*bt*k), w: make([]byte, 4*bt*k)}
		}
	}
	return st
}

// route computes r from the router logits (B·T×E): HF's softmax in fp32
// (here exp and the sum in float64, rounded once), the top k (ties to the
// lower expert), renormalised in fp32 when norm says so, and the grouping
// of the selections by expert; count adds the layer to the load-balancing
// sums.
func (r *moeRoute) route(logits []float32, bt, ne, k int, norm bool, st *moeState, count bool) {
	clear(r.offsets)
	for t := range bt {
		z, p := logits[t*ne:(t+1)*ne], r.probs[t*ne:(t+1)*ne]
		mx := z[0]
		for _, v := range z {
			mx = max(mx, v)
		}
		var sum float64
		for e, v := range z {
			ex := math.Exp(float64(v - mx))
			sum += ex
			p[e] = float32(ex)
		}
		for e := range p {
			p[e] = float32(float64(p[e]) / sum)
		}
		sel, w := r.sel[t*k:(t+1)*k], r.weights[t*k:(t+1)*k]
		for j := range k {
			best := -1
			for e, v := range p {
				if (best < 0 || v > p[best]) && !picked(sel[:j], e) {
					best = e
				}
			}
			sel[j], w[j] = int32(best), p[best]
			r.offsets[best+1]++
		}
		if norm {
			var s32 float32
			for _, v := range w {
				s32 += v
			}
			for j := range w {
				w[j] /= s32
			}
		}
		if count {
			for e, v := range p {
				st.probSum[e] += float64(v)
			}
			for _, e := range sel {
				st.count[e]++
			}
		}
	}
	if count {
		st.rows += bt
	}
	for e := range ne {
		r.offsets[e+1] += r.offsets[e]
	}
	next := r.next
	copy(next, r.offsets[:ne])
	tok, w := i32View(r.tok), f32View(r.w)
	for e := range ne { // expert-major, tokens ascending: the order the combine sums each token's experts in
		for t := range bt {
			for j := range k {
				if int(r.sel[t*k+j]) == e {
					i := next[e]
					next[e]++
					r.row[t*k+j], tok[i], w[i] = int32(i), int32(t), r.weights[t*k+j]
				}
			}
		}
	}
}

func picked(sel []int32, e int) bool {
	for _, v := range sel {
		if int(v) == e {
			return true
		}
	}
	return false
}

// auxLoss is load_balancing_loss_func over the layers counted since
// reset: E · Σ_e (selections of e / N) · (Σ p_e / N).
func (st *moeState) auxLoss(ne int) float64 {
	if st.rows == 0 {
		return 0
	}
	n := float64(st.rows)
	var sum float64
	for e := range ne {
		sum += st.count[e] / n * (st.probSum[e] / n)
	}
	return float64(ne) * sum
}

func (st *moeState) reset() {
	clear(st.count)
	clear(st.probSum)
	st.rows = 0
}

// routerGrad writes into st.logits the gradient of the router logits of
// route r from dw (the gradient of each grouped row's routing weight) and,
// with auxScale ≠ 0, auxScale times the load-balancing loss's gradient:
// through the renormalisation (dp_j = (dw_j − Σ_i dw_i·w_i)/S) and the
// softmax (dz = p ⊙ (dp − p·dp)), in float64, rounded once.
func (st *moeState) routerGrad(r *moeRoute, dw []float32, bt, ne, k int, norm bool, auxScale float64) {
	dz := f32View(st.logits)
	dp, g := st.dp, st.g
	clear(g)
	if auxScale != 0 && st.rows > 0 {
		n := float64(st.rows)
		for e := range ne {
			g[e] = auxScale * float64(ne) * (st.count[e] / n) / n
		}
	}
	for t := range bt {
		p := r.probs[t*ne : (t+1)*ne]
		clear(dp)
		copy(dp, g)
		sel := r.sel[t*k : (t+1)*k]
		if norm {
			var s, dot float64
			for j, e := range sel {
				s += float64(p[e])
				dot += float64(dw[r.row[t*k+j]]) * float64(r.weights[t*k+j])
			}
			for j, e := range sel {
				dp[e] += (float64(dw[r.row[t*k+j]]) - dot) / s
			}
		} else {
			for j, e := range sel {
				dp[e] += float64(dw[r.row[t*k+j]])
			}
		}
		var dot float64
		for e := range ne {
			dot += float64(p[e]) * dp[e]
		}
		for e := range ne {
			dz[t*ne+e] = float32(float64(p[e]) * (dp[e] - dot))
		}
	}
}

// routeLayer brings sparse layer l's router logits (n×E in logits) to the
// host (synchronizing s) and routes its n tokens; count adds them to the
// load-balancing sums.
func (st *moeState) routeLayer(dev gpu.Device, s gpu.Stream, logits gpu.Buffer, l, n int, sh Shape, count bool) error {
	host := st.logits[:4*n*sh.Experts]
	dev.CopyDeviceToHost(s, host, logits, 0)
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("model: block %d's router: %w", l, err)
	}
	st.routes[l].route(f32View(host), n, sh.Experts, sh.TopK, sh.NormTopKProb(), st, count)
	st.uploadsOf = -1
	return nil
}

// upload puts layer l's grouping of n tokens (each grouped row's token
// and weight) in tok and w, unless they hold it already.
func (st *moeState) upload(dev gpu.Device, s gpu.Stream, l, n, k int, tok, w gpu.Buffer) {
	if st.uploadsOf == l {
		return
	}
	r := st.routes[l]
	dev.CopyHostToDevice(s, tok, 0, r.tok[:4*n*k])
	dev.CopyHostToDevice(s, w, 0, r.w[:4*n*k])
	st.uploadsOf = l
}

// moeRows are the device buffers of a sparse layer's forward over n
// tokens: each grouped row's token and weight (uploaded), the grouped
// inputs (then the weighted outputs), and the experts' gate|up, act and
// outputs, grouped by expert.
type moeRows struct {
	tok, w, x, fch, act, y gpu.Buffer
}

// expertsForward writes out (n×C) = Σ over each token's experts, in
// ascending order, of w · expert(h) for the normed inputs h (n×C) routed
// by r, each expert run over its tokens' grouped rows between its Acquire
// and Release: every expert of the layer in order (training's fixed
// access order), or with routed only the experts a token reached (the
// Decoder's: inference moves only those), which a p that implements
// ExpertPrefetcher is told of first. acquire, when not nil, is the
// ExpertRouter p's answer for the layer: an expert not in it is skipped
// (SkipExpert) in its place in the order.
func expertsForward(ops gpu.Ops, s gpu.Stream, p Params, lo *Layout, l int, r *moeRoute, n int, h, out gpu.Buffer, b moeRows, routed bool, acquire []bool, ad expertAdapters) error {
	sh := lo.Shape
	c, fe, k := sh.Dim, sh.ExpertFFNDim(), sh.TopK
	x := b.x.Slice(0, n*k*c)
	ops.EmbeddingForward(s, b.tok.Slice(0, n*k), nil, h, nil, x, 1, n*k, c) // x[i] = h[tok[i]]
	if pf, ok := p.(ExpertPrefetcher); ok && routed {
		var chunks []int
		for e := range sh.Experts {
			if r.offsets[e+1] > r.offsets[e] {
				chunks = append(chunks, lo.ExpertChunk(l, e))
			}
		}
		if err := pf.PrefetchExperts(chunks); err != nil {
			return err
		}
	}
	for e := range sh.Experts {
		if routed && r.offsets[e+1] == r.offsets[e] {
			continue
		}
		ch := lo.ExpertChunk(l, e)
		if acquire != nil && !acquire[e] {
			if err := p.(ExpertRouter).SkipExpert(s, ch, shard.Forward); err != nil {
				return err
			}
			continue
		}
		w, err := p.Acquire(s, ch, shard.Forward)
		if err != nil {
			return err
		}
		if o, m := r.offsets[e], r.offsets[e+1]-r.offsets[e]; m > 0 {
			fch, act := b.fch.Slice(o*2*fe, m*2*fe), b.act.Slice(o*fe, m*fe)
			xe, y := x.Slice(o*c, m*c), b.y.Slice(o*c, m*c)
			linearForward(ops, s, xe, w.Slice(0, 2*fe*c), nil, fch, m, c, 2*fe) // gate|up (m×2F_e)
			if ad != nil {
				ad.loraForwardRows(s, expertSite(e, false), xe, fch, m)
			}
			ops.GLUForward(s, fch, act, m, fe, gpu.Silu)
			linearForward(ops, s, act, w.Slice(2*fe*c, c*fe), nil, y, m, fe, c) // expert output (m×C)
			if ad != nil {
				ad.loraForwardRows(s, expertSite(e, true), act, y, m)
			}
		}
		p.Release(s, ch, shard.Forward)
	}
	ops.Cast(s, x, b.y.Slice(0, n*k*c)) // the gathered inputs are read no more: x = the weighted outputs
	ops.ScaleRows(s, x, b.w.Slice(0, n*k), n*k, c)
	ops.Fill(s, out, 0)
	ops.EmbeddingBackward(s, b.tok.Slice(0, n*k), nil, x, out, nil, 1, n*k, c) // out[tok[i]] += x[i], each token's experts in ascending order
	return nil
}

// expertAdapters adds LoRA adapters to the experts' GEMM outputs (the
// Model's, with LoRA; the Decoder has none).
type expertAdapters interface {
	loraForwardRows(s gpu.Stream, site int, x, y gpu.Buffer, rows int)
}

// moeForward runs sparse layer l's experts after its block (which wrote
// the router logits into moeLogits and released its chunk): out = res2 +
// the experts (expertsForward) of the routed tokens.
func (m *Model) moeForward(s gpu.Stream, p Params, l int, out gpu.Buffer) error {
	a, la, st := &m.a, m.a.layers[l], m.moe
	bt := m.batch * m.seq
	if err := st.routeLayer(m.dev, s, a.moeLogits, l, bt, m.shape, true); err != nil {
		return err
	}
	st.upload(m.dev, s, l, bt, m.shape.TopK, a.moeTok, a.moeW)
	var ad expertAdapters
	if m.lora != nil {
		ad = m
	}
	r := st.routes[l]
	r.acquire = nil
	if er, ok := p.(ExpertRouter); ok {
		for e := range r.reached {
			r.reached[e] = r.offsets[e+1] > r.offsets[e]
		}
		acq, err := er.RouteExperts(s, l, r.reached)
		if err != nil {
			return err
		}
		for e, ok := range r.reached {
			if ok && !acq[e] {
				panic(fmt.Sprintf("model: Params.RouteExperts left out expert %d of block %d, which tokens reached", e, l))
			}
		}
		r.acquire = acq
	}
	if err := expertsForward(m.ops, s, p, m.layout, l, r, bt, la.ln2, out, moeRows{a.moeTok, a.moeW, a.moeX, la.fch, la.fchAct, la.moeY}, false, r.acquire, ad); err != nil {
		return err
	}
	m.ops.Add(s, la.res2, out, out, bt*m.shape.Dim)
	return nil
}

// ExpertPrefetcher is the optional interface of a Decoder's Params that
// keeps a mixture of experts' experts off the device: after a sparse
// layer's router has run, PrefetchExperts names the expert chunks its
// tokens reached (ascending), which the Decoder then acquires one by
// one; the experts no token reached are not acquired at all.
type ExpertPrefetcher interface {
	PrefetchExperts(chunks []int) error
}

// ExpertRouter is the optional interface of a Model's Params that moves
// only the experts a training step reaches. In the forward, once a sparse
// layer's router has run, RouteExperts gets which of block l's experts the
// micro-batch's tokens reached and answers which to acquire: at least
// those (the engine's answer is the union over its ranks, whose gathers
// must match). In place of each expert's calls that is not acquired (its
// Acquire and Release in the forward; Acquire, Grad, Release and GradReady
// in the backward, which acquires the forward's experts) the Model calls
// SkipExpert, in the same place of Model.AccessOrder: what a skipped
// expert's gradient is (none for a frozen chunk, zero otherwise) is the
// Params'. The Model reads the answer until its next Forward.
type ExpertRouter interface {
	RouteExperts(s gpu.Stream, l int, reached []bool) (acquire []bool, err error)
	SkipExpert(s gpu.Stream, chunk int, pass shard.Phase) error
}

// moeBackward runs sparse layer l's experts' backward before its block's:
// from dres (the gradient of the layer's output) the gradient of each
// routing weight (the router's, which goes to the host and comes back as
// the router logits' gradient in moeLogits, with the load-balancing loss's
// at auxScale) and each expert's, accumulating the gradient of the experts'
// input into moeDln2, in the access order's calls.
func (m *Model) moeBackward(s gpu.Stream, p Params, l int, auxScale float64) error {
	ops, sh, a, la, st := m.ops, m.shape, &m.a, m.a.layers[l], m.moe
	bt, c, fe, k, ne := m.batch*m.seq, sh.Dim, sh.ExpertFFNDim(), sh.TopK, sh.Experts
	r := st.routes[l]
	m.layer = l
	st.upload(m.dev, s, l, bt, k, a.moeTok, a.moeW)
	x, dy := a.moeX, a.moeDY
	ops.EmbeddingForward(s, a.moeTok, nil, la.ln2, nil, x, 1, bt*k, c)  // the experts' inputs again
	ops.EmbeddingForward(s, a.moeTok, nil, a.dres, nil, dy, 1, bt*k, c) // d out of each grouped row
	ops.RowDots(s, dy, la.moeY, a.moeDW, bt*k, c)                       // d w = <d out, expert output>
	ops.ScaleRows(s, dy, a.moeW, bt*k, c)                               // d expert output = w · d out
	m.dev.CopyDeviceToHost(s, st.dw, a.moeDW, 0)
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("model: block %d's routing weights' gradient: %w", l, err)
	}
	st.routerGrad(r, f32View(st.dw), bt, ne, k, sh.NormTopKProb(), auxScale)
	m.dev.CopyHostToDevice(s, a.moeLogits, 0, st.logits)
	ops.Fill(s, a.moeDln2, 0)
	for e := range ne {
		ch := m.layout.ExpertChunk(l, e)
		if r.acquire != nil && !r.acquire[e] {
			if err := p.(ExpertRouter).SkipExpert(s, ch, shard.Backward); err != nil {
				return err
			}
			continue
		}
		w, g, err := acquireWithGrad(s, p, ch)
		if err != nil {
			return err
		}
		if o, n := r.offsets[e], r.offsets[e+1]-r.offsets[e]; n > 0 {
			dye, fch, act := dy.Slice(o*c, n*c), la.fch.Slice(o*2*fe, n*2*fe), la.fchAct.Slice(o*fe, n*fe)
			if dw := m.weightGrad(ch, g, 2*fe*c, c*fe); dw != nil {
				ops.Gemm(s, true, false, c, fe, n, 1, dye, act, 1, dw) // d w2 += dyᵀ·act
			}
			m.loraBackwardRows(s, expertSite(e, true), dye, act, nil, n)               // reads act before it becomes d act
			ops.Gemm(s, false, false, n, fe, c, 1, dye, w.Slice(2*fe*c, c*fe), 0, act) // d act (n×F_e), over act
			m.loraInputGradRows(s, expertSite(e, true), act, n)
			dgu := a.moeBig.Slice(0, n*2*fe)
			ops.GLUBackward(s, fch, act, dgu, n, fe, gpu.Silu)
			xe := x.Slice(o*c, n*c)
			linearBackward(ops, s, dgu, xe, w.Slice(0, 2*fe*c), dye, m.weightGrad(ch, g, 0, 2*fe*c), nil, n, c, 2*fe) // d x over d y
			m.loraBackwardRows(s, expertSite(e, false), dgu, xe, dye, n)
		}
		p.Release(s, ch, shard.Backward)
		if err := p.GradReady(s, ch); err != nil {
			return err
		}
	}
	ops.EmbeddingBackward(s, a.moeTok, nil, dy, a.moeDln2, nil, 1, bt*k, c) // d ln2[tok[i]] += d x[i]
	return nil
}

// routerBackward is the router's part of a sparse block's backward: with
// moeLogits the router logits' gradient, d router += dzᵀ·ln2 and moeDln2
// += dz·router, which then holds the whole gradient of ln2.
func (m *Model) routerBackward(s gpu.Stream, w gpu.Buffer, la *layerActs, wg func(off, n int) gpu.Buffer) gpu.Buffer {
	ops, sh, a := m.ops, m.shape, &m.a
	bt, c, ne := m.batch*m.seq, sh.Dim, sh.Experts
	if dw := wg(m.lo.router, ne*c); dw != nil {
		ops.Gemm(s, true, false, ne, c, bt, 1, a.moeLogits, la.ln2, 1, dw)
	}
	ops.Gemm(s, false, false, bt, c, ne, 1, a.moeLogits, w.Slice(m.lo.router, ne*c), 1, a.moeDln2)
	m.loraBackward(s, siteRouter, a.moeLogits, la.ln2, a.moeDln2)
	return a.moeDln2
}

// RouterLoss is the load-balancing loss (load_balancing_loss_func, before
// router_aux_loss_coef) of the last Forward whose loss Loss or Losses
// read; 0 for a dense model or before any.
func (m *Model) RouterLoss() float64 {
	if m.moe == nil || len(m.moe.lastAux) == 0 {
		return 0
	}
	return m.moe.lastAux[len(m.moe.lastAux)-1]
}

// Objective is what a micro-batch's training minimizes, from its
// cross-entropy ce (Losses) and its load-balancing loss aux
// (RouterLoss): ce + router_aux_loss_coef·aux when the shape's
// output_router_logits is set (transformers' loss), else ce. A
// micro-batch without any target has both 0, as its gradient. The engine
// and Trainer report it as the step's loss; evaluation reports the
// cross-entropy alone.
func (s Shape) Objective(ce, aux float64) float64 {
	if !s.RouterAux {
		return ce
	}
	return ce + s.RouterAuxCoef*aux
}

// RouterLosses is RouterLoss of each Forward the last Losses read, oldest
// first (nil for a dense model).
func (m *Model) RouterLosses() []float64 {
	if m.moe == nil {
		return nil
	}
	return m.moe.lastAux
}
