package model

import (
	"fmt"

	"github.com/strata-ai/strata/gpu"
)

// ActivationOptions say how a Model keeps its activations. The zero value
// is fp32 activations without checkpointing.
type ActivationOptions struct {
	// DType is the dtype of the saved activations and of the backward's
	// scratch: gpu.F32 (0 means F32), gpu.BF16 or gpu.F16. Whatever it is, the norm
	// statistics, attention's row log-sum-exps, the logits of the loss
	// chunk, the per-token losses and the gradient of the residual stream
	// (which every block's backward accumulates into) are fp32.
	DType gpu.DType
	// Checkpoint is the number of blocks whose activations are recomputed
	// in the backward (activation checkpointing), 0 for none, at most the
	// number of blocks; Checkpointed says which. A checkpointed block keeps
	// only its input from the forward; its backward runs its forward again
	// from that input, with the same parameters, into one work set that all
	// checkpointed blocks share, so the gradients are bit-identical to a
	// run without checkpointing.
	Checkpoint int
	// Offload (cpu_checkpointing) hands the inputs of the checkpointed
	// blocks to the Params' InputStore after their forward and takes them
	// back for their backward: the device keeps only a ring of three
	// residual buffers for them. Needs Checkpoint > 0 and Params that
	// implement InputStore.
	Offload bool
	// LoRA is the adapters of every block (nil: none); the layout must
	// have them (Layout.WithLoRA with the same options).
	LoRA *LoRA
}

// dtype is o.DType with the zero value resolved.
func (o ActivationOptions) dtype() gpu.DType {
	if o.DType == 0 {
		return gpu.F32
	}
	return o.DType
}

// Validate says what is wrong with o for shape s.
func (o ActivationOptions) Validate(s Shape) error {
	switch dt := o.dtype(); {
	case dt != gpu.F32 && !dt.Half():
		return fmt.Errorf("model: activation dtype %s is not f32, bf16 or f16", dt)
	case o.Checkpoint < 0 || o.Checkpoint > s.Layers:
		return fmt.Errorf("model: %d checkpointed blocks: want 0 to the model's %d blocks", o.Checkpoint, s.Layers)
	case o.Offload && o.Checkpoint == 0:
		return fmt.Errorf("model: offloading the checkpointed inputs (cpu_checkpointing) needs activation checkpointing")
	case s.MoE() && o.Checkpoint > 0:
		return fmt.Errorf("model: activation checkpointing of a mixture of experts (%s) is not built: set strata.activation_checkpointing to 0", s.Arch)
	case o.LoRA != nil:
		return o.LoRA.Validate(s)
	}
	return nil
}

func (o ActivationOptions) String() string {
	return fmt.Sprintf("activations %s, %d checkpointed blocks, offload %t", o.dtype(), o.Checkpoint, o.Offload)
}

// Checkpointed says whether block l of a model of layers blocks is
// recomputed in the backward: the o.Checkpoint checkpointed blocks are
// spread evenly, block l being one when ⌊(l+1)·k/L⌋ > ⌊l·k/L⌋ (k =
// o.Checkpoint, L = layers): every block for k = L, every second one
// (1, 3, 5, ...) for k = L/2, the last one for k = 1.
func (o ActivationOptions) Checkpointed(l, layers int) bool {
	k := o.Checkpoint
	return k > 0 && (l+1)*k/layers > l*k/layers
}

// offloaded says whether block l's input goes through the InputStore.
func (o ActivationOptions) offloaded(l, layers int) bool {
	return o.Offload && o.Checkpointed(l, layers)
}

// offloadRing is the number of device buffers the offloaded block inputs
// pass through in the forward: the input being read, the output being
// written, and the one whose copy to the InputStore is still running.
const offloadRing = 3

// activations are views into the model's allocations; see planActivations.
type activations struct {
	ids, targets, pos gpu.Buffer // I32 (B·T)
	// res[i] is block i's input (i < L) and res[L] the final norm's: its
	// own buffer, or nil for an offloaded input, which passes through ring.
	res    []gpu.Buffer
	ring   []gpu.Buffer // offloaded inputs in the forward (offloadRing), B·T·C each
	ringEv []gpu.Event  // per ring slot: the InputStore's read of its last occupant; nil: none
	// layers[l] is what block l saves for its backward: its own, or, for a
	// checkpointed block, work, which every checkpointed block shares.
	layers  []*layerActs
	work    layerActs
	lnf     gpu.Buffer // B·T·C: the final norm's output
	lnfMean gpu.Buffer // B·T (GPT-2's layernorm only)
	lnfRstd gpu.Buffer // B·T
	logits  gpu.Buffer // lossRows·V, F32: the loss chunk (logits, then their gradient, of a slice of tokens)
	losses  gpu.Buffer // B·T, F32
	dres    gpu.Buffer // B·T·C, F32: gradient of the residual stream
	dtmp    gpu.Buffer // B·T·max(C, H·D)
	dbig    gpu.Buffer // B·T·max(qkv width, MLP gradient width): gradient of qkv or of the MLP hidden layer
	gains   gpu.Buffer // 4C + 2D, F32: Gemma's norm gains 1 + weight of the block (or final norm) at hand
	dtmp2   gpu.Buffer // B·T·C (Gemma): the gradient of a norm's input inside a block
	// LoRA's workspace (lora.go): a block's adapter chunk, x·Aᵀ and its
	// gradient (B·T·r each), and a module's columns of a fused output.
	loraW, loraG, loraT, loraDT, loraWide, loraXD gpu.Buffer
	// A mixture of experts' (moe.go): each grouped row's token (I32) and
	// routing weight, its weight's gradient (F32, B·T·k each), the router
	// logits and then their gradient (F32, B·T×E), the grouped rows' inputs
	// and then their weighted outputs, their output gradients and then
	// their input gradients (B·T·k×C each), an expert's gate|up gradient
	// (B·T×2F_e: a token reaches an expert once) and the gradient of the
	// experts' input (B·T×C).
	moeTok, moeW, moeDW, moeLogits, moeX, moeDY, moeBig, moeDln2 gpu.Buffer
}

// layerActs are what one block saves for its backward. GPT-2 fills every
// field; the Llama family has no norm means (RMSNorm), and its fch is the
// fused gate|up output (2F wide).
type layerActs struct {
	ln1, ln1Mean, ln1Rstd gpu.Buffer // B·T·C, B·T, B·T: the first norm's output and statistics (F32)
	qkv                   gpu.Buffer // B·T·(H+2·KV)·D: q, k, v (rotated, for the Llama family)
	qkPre, qkRstd         gpu.Buffer // B·T·H·D q then B·T·KV·D k before q_norm / k_norm, and their B·T·(H+KV) rstd (QKNorm)
	atty                  gpu.Buffer // B·T·H·D: attention output before the output projection
	attnOut, attnRstd     gpu.Buffer // B·T·C, B·T: o_proj's output before Gemma's post-attention norm, its rstd
	mlpOut, mlpRstd       gpu.Buffer // B·T·C, B·T: down_proj's output before Gemma's post-feed-forward norm, its rstd
	lse                   gpu.Buffer // B·H·T, F32: attention's row log-sum-exp
	res2                  gpu.Buffer // B·T·C: residual after attention
	ln2, ln2Mean, ln2Rstd gpu.Buffer // B·T·C, B·T, B·T
	fch                   gpu.Buffer // B·T·F (GPT-2: c_fc output) or B·T·2F (gate|up output)
	fchAct                gpu.Buffer // B·T·F: gelu(fch) or swiglu(gate, up); reused for its gradient in backward
	// A sparse layer's fch and fchAct are its experts' (B·T·k rows of 2F_e
	// and F_e, grouped by expert), and moeY their outputs before the
	// routing weights (B·T·k×C).
	moeY gpu.Buffer
}

// segment is one named tensor inside an activation allocation.
type segment struct {
	name string
	n    int
	dst  *gpu.Buffer
}

// Activation terms: what each allocation of planActivations is for, as
// ActivationTerms names them.
const (
	TermTokens       = "token ids, targets, positions"
	TermResidual     = "residual stream (block inputs kept on the device)"
	TermOffloadRing  = "offload ring (3 block inputs on their way to the host)"
	TermBlocks       = "saved block activations"
	TermWorkSet      = "recompute work set (one block)"
	TermHead         = "final norm output"
	TermLossChunk    = "loss chunk (fp32 logits of a token slice)"
	TermBackwardTemp = "backward scratch"
	TermLoRA         = "LoRA workspace (a block's adapters and their gradient, x·Aᵀ, a module's columns)"
	TermMoE          = "mixture of experts (routing, the grouped rows of a layer's experts)"
)

// allocation is one device allocation holding several segments.
type allocation struct {
	purpose string
	term    string
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

func (a allocation) bytes() int64 { return int64(a.elements()) * int64(a.dtype.Size()) }

// qkvWidth is the number of values of one token's packed q|k|v row.
func qkvWidth(s Shape) int { return (s.Heads + 2*s.KVHeadCount()) * s.HeadDim() }

// mlpWidth is the width of the MLP's first GEMM output: GPT-2's c_fc (F),
// the Llama family's fused gate|up (2F).
func mlpWidth(s Shape) int {
	if s.IsLlama() {
		return 2 * s.FFNDim()
	}
	return s.FFNDim()
}

// lossChunkMaxBytes bounds the loss chunk: the fp32 logits of a slice of
// the micro-batch's tokens, which the loss and its gradient go through one
// slice at a time. A variable so that tests can make small models slice.
var lossChunkMaxBytes int64 = 64 << 20

// lossRows is the number of tokens of each slice of the loss (the last
// may be shorter): the bt tokens in as few equal slices as keep the fp32
// logits of one slice within lossChunkMaxBytes, at least one token each.
func lossRows(bt, vocab int) int {
	total := int64(bt) * int64(vocab) * 4
	slices := int((total + lossChunkMaxBytes - 1) / lossChunkMaxBytes)
	slices = max(1, min(slices, bt))
	return (bt + slices - 1) / slices
}

// planActivations lists the allocations of a model of shape s for batch×seq
// tokens with options o; when a is not nil, each segment's dst points into
// it. Stored activations are o's dtype, the statistics and the loss fp32.
//
// Per token: the residual stream, C per block input kept on the device
// (every one, less the offloaded inputs of checkpointed blocks, which pass
// through a ring of three) and C for the final norm's input. Per token and
// block not checkpointed, and once for the work set the checkpointed ones
// share: GPT-2 saves ln1, res2, ln2 and the attention output (C each), qkv
// (3C), c_fc's output and its gelu (F each), four norm statistics and H
// attention row statistics: 7C + 2F + 4 + H (15C + 4 + H with F = 4C). The
// Llama family saves ln1, res2, ln2 and the attention output (C each), qkv
// (C + 2·KV·D), gate|up (2F), the SwiGLU output (F), two norm statistics
// and H: 5C + 2·KV·D + 3F + 2 + H. The head holds the final norm (C and
// its 2 or 1 statistics) and the losses (1); the loss chunk is lossRows
// tokens of V fp32 logits (once: the backward recomputes them); the
// backward scratch is the residual gradient (C, fp32), C, and the wider of
// qkv and the MLP's gradient (GPT-2 max(3C, F), Llama max(C + 2·KV·D, 2F)).
func planActivations(s Shape, batch, seq int, o ActivationOptions, a *activations) []allocation {
	if a == nil {
		a = &activations{}
	}
	bt, c, v := batch*seq, s.Dim, s.Vocab
	dt := o.dtype()
	a.res = make([]gpu.Buffer, s.Layers+1)
	a.layers = make([]*layerActs, s.Layers)
	plan := []allocation{
		{"tokens", TermTokens, gpu.I32, []segment{{"ids", bt, &a.ids}, {"targets", bt, &a.targets}, {"pos", bt, &a.pos}}},
	}
	var res []segment
	for i := 0; i <= s.Layers; i++ {
		if i == s.Layers || !o.offloaded(i, s.Layers) {
			res = append(res, segment{fmt.Sprintf("res%d", i), bt * c, &a.res[i]})
		}
	}
	plan = append(plan, allocation{"residual stream", TermResidual, dt, res})
	if o.Offload && o.Checkpoint > 0 {
		a.ring, a.ringEv = make([]gpu.Buffer, offloadRing), make([]gpu.Event, offloadRing)
		var ring []segment
		for i := range a.ring {
			ring = append(ring, segment{fmt.Sprintf("ring%d", i), bt * c, &a.ring[i]})
		}
		plan = append(plan, allocation{"offload ring", TermOffloadRing, dt, ring})
	}
	if o.Checkpoint > 0 {
		plan = append(plan, blockAllocations(s, 0, bt, batch, seq, dt, "recompute work set", TermWorkSet, &a.work)...)
	}
	for l := 0; l < s.Layers; l++ {
		if o.Checkpointed(l, s.Layers) {
			a.layers[l] = &a.work
			continue
		}
		a.layers[l] = &layerActs{}
		plan = append(plan, blockAllocations(s, l, bt, batch, seq, dt, fmt.Sprintf("block %d", l), TermBlocks, a.layers[l])...)
	}
	head := []segment{{"lnf", bt * c, &a.lnf}}
	plan = append(plan,
		allocation{"head", TermHead, dt, head},
		allocation{"head statistics", TermHead, gpu.F32, append(normStats(s, bt, &a.lnfMean, &a.lnfRstd, "lnf"), segment{"losses", bt, &a.losses})},
		allocation{"loss chunk", TermLossChunk, gpu.F32, []segment{{"logits", lossRows(bt, v) * v, &a.logits}}},
		allocation{"residual gradient", TermBackwardTemp, gpu.F32, []segment{{"dres", bt * c, &a.dres}}},
		allocation{"backward scratch", TermBackwardTemp, dt, []segment{
			{"dtmp", bt * max(c, s.AttnDim()), &a.dtmp}, {"dbig", bt * max(qkvWidth(s), mlpWidth(s)), &a.dbig},
		}},
	)
	if s.Gemma() {
		plan = append(plan, allocation{"norm gains", TermBackwardTemp, gpu.F32, []segment{{"gains", 4*c + 2*s.HeadDim(), &a.gains}}},
			allocation{"gemma backward scratch", TermBackwardTemp, dt, []segment{{"dtmp2", bt * c, &a.dtmp2}}})
	}
	if s.MoE() {
		k, ne, fe := s.TopK, s.Experts, s.ExpertFFNDim()
		plan = append(plan, allocation{"routing", TermMoE, gpu.I32, []segment{{"grouped tokens", bt * k, &a.moeTok}}},
			allocation{"routing weights", TermMoE, gpu.F32, []segment{{"weights", bt * k, &a.moeW}, {"weight gradients", bt * k, &a.moeDW}, {"router logits", bt * ne, &a.moeLogits}}},
			allocation{"expert scratch", TermMoE, dt, []segment{{"grouped rows", bt * k * c, &a.moeX}, {"grouped gradients", bt * k * c, &a.moeDY},
				{"expert gate|up gradient", bt * 2 * fe, &a.moeBig}, {"experts' input gradient", bt * c, &a.moeDln2}}})
	}
	if o.LoRA != nil {
		chunk, wide, in := loraWorkspace(s, o.LoRA)
		segs := []segment{{"lora adapters", chunk, &a.loraW}, {"lora t", bt * o.LoRA.R, &a.loraT}, {"lora dt", bt * o.LoRA.R, &a.loraDT}}
		if wide > 0 {
			segs = append(segs, segment{"lora columns", bt * wide, &a.loraWide})
		}
		if in > 0 {
			segs = append(segs, segment{"lora dropped input", bt * in, &a.loraXD})
		}
		plan = append(plan, allocation{"lora", TermLoRA, dt, segs},
			allocation{"lora gradient", TermLoRA, gpu.F32, []segment{{"lora dA dB", chunk, &a.loraG}}})
	}
	return plan
}

// normStats are a norm's statistics: mean and rstd for LayerNorm, rstd for
// RMSNorm (fp32).
func normStats(s Shape, bt int, mean, rstd *gpu.Buffer, name string) []segment {
	if s.IsLlama() {
		return []segment{{name + " rstd", bt, rstd}}
	}
	return []segment{{name + " mean", bt, mean}, {name + " rstd", bt, rstd}}
}

// blockAllocations are the allocations of one block's saved activations
// la: the tensors in dt, the statistics in fp32.
func blockAllocations(s Shape, l, bt, batch, seq int, dt gpu.DType, purpose, term string, la *layerActs) []allocation {
	c := s.Dim
	segs := []segment{{"ln1", bt * c, &la.ln1}, {"qkv", bt * qkvWidth(s), &la.qkv}, {"atty", bt * s.AttnDim(), &la.atty},
		{"res2", bt * c, &la.res2}, {"ln2", bt * c, &la.ln2}}
	if s.SparseLayer(l) {
		rows, fe := bt*s.TopK, s.ExpertFFNDim()
		segs = append(segs, segment{"experts' gate|up", rows * 2 * fe, &la.fch}, segment{"experts' act", rows * fe, &la.fchAct}, segment{"experts' outputs", rows * c, &la.moeY})
	} else {
		segs = append(segs, segment{"fch", bt * mlpWidth(s), &la.fch}, segment{"fch act", bt * s.FFNDim(), &la.fchAct})
	}
	stats := normStats(s, bt, &la.ln1Mean, &la.ln1Rstd, "ln1")
	stats = append(stats, normStats(s, bt, &la.ln2Mean, &la.ln2Rstd, "ln2")...)
	stats = append(stats, segment{"lse", batch * s.Heads * seq, &la.lse})
	if s.QKNorm() {
		segs = append(segs, segment{"q k before their norms", bt * (s.Heads + s.KVHeadCount()) * s.HeadDim(), &la.qkPre})
		stats = append(stats, segment{"q k norm rstd", bt * (s.Heads + s.KVHeadCount()), &la.qkRstd})
	}
	if s.Gemma() {
		segs = append(segs, segment{"o_proj out", bt * c, &la.attnOut}, segment{"down_proj out", bt * c, &la.mlpOut})
		stats = append(stats, segment{"post-attention norm rstd", bt, &la.attnRstd}, segment{"post-feed-forward norm rstd", bt, &la.mlpRstd})
	}
	return []allocation{{purpose, term, dt, segs}, {purpose + " statistics", term, gpu.F32, stats}}
}

// ActivationTerm is one named part of a model's activation memory.
type ActivationTerm struct {
	Name  string
	Bytes int64
}

// ActivationTerms are the device bytes a Model of shape s with options o
// allocates for micro-batches of batch sequences of seq tokens, by term
// (the Term constants, in the order of planActivations; a term it does not
// allocate is left out): what ActivationBytes sums. Each tensor is padded
// to 256 bytes; the device's allocation granularity is not included.
// Attention keeps H log-sum-exp values per token, not the seq×seq
// probabilities, so the bytes are linear in seq.
func ActivationTerms(s Shape, batch, seq int, o ActivationOptions) []ActivationTerm {
	var out []ActivationTerm
	idx := map[string]int{}
	for _, a := range planActivations(s, batch, seq, o, nil) {
		i, ok := idx[a.term]
		if !ok {
			i = len(out)
			idx[a.term] = i
			out = append(out, ActivationTerm{Name: a.term})
		}
		out[i].Bytes += a.bytes()
	}
	return out
}

// ActivationBytesWith is the device memory a Model of shape s with options
// o allocates for micro-batches of batch sequences of seq tokens: the sum
// of ActivationTerms. With o.Offload the inputs of the checkpointed blocks
// live in the InputStore between their forward and their backward, which
// this does not count.
func ActivationBytesWith(s Shape, batch, seq int, o ActivationOptions) int64 {
	var n int64
	for _, a := range planActivations(s, batch, seq, o, nil) {
		n += a.bytes()
	}
	return n
}

// ActivationBytes is ActivationBytesWith for fp32 activations without
// checkpointing (New's): per token, the embedding output and every block's
// output (C floats each), every block's saved activations (GPT-2: 7C + 2F
// + 4 + H floats; the Llama family: 5C + 2·KV·D + 3F + 2 + H), the head
// (the final norm and the losses), the loss chunk and the backward scratch
// (2C + the wider of qkv and the MLP gradient), and the token ids, targets
// and positions (3 int32).
func ActivationBytes(s Shape, batch, seq int) int64 {
	return ActivationBytesWith(s, batch, seq, ActivationOptions{})
}

// InputBytes is the size of one block input of a micro-batch (B·T·C in
// dtype o.DType): what the InputStore holds per offloaded block.
func InputBytes(s Shape, batch, seq int, o ActivationOptions) int64 {
	return int64(batch) * int64(seq) * int64(s.Dim) * int64(o.dtype().Size())
}
