package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// Tensor is one named parameter tensor inside a chunk. Weights of linear
// layers are stored out×in (PyTorch nn.Linear; Hugging Face's GPT-2 Conv1D
// stores the transpose).
type Tensor struct {
	Name   string
	Shape  []int
	Offset int // first element within the chunk
	Len    int // elements: the product of Shape
}

// Chunk is the unit of movement of docs/DESIGN.md: a contiguous run of parameters
// stored in one flat buffer, its tensors packed densely in the order listed.
type Chunk struct {
	Index   int
	Name    string // "embeddings", "block 0" ... "block L-1", "ln_f"
	Tensors []Tensor
	Len     int // elements
}

// Tensor returns the tensor called name, or false.
func (c Chunk) Tensor(name string) (Tensor, bool) {
	for _, t := range c.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// Layout is the arrangement of a shape's parameters in chunks. GPT-2:
//
//	chunk 0       embeddings: wte (Vocab×C), wpe (MaxSeq×C); wte is also the output head
//	chunk 1..L    block l-1: ln_1 g,b (C), attn.c_attn W (3C×C), b (3C), attn.c_proj W (C×C), b (C),
//	              ln_2 g,b (C), mlp.c_fc W (F×C), b (F), mlp.c_proj W (C×F), b (C)
//	chunk L+1     ln_f g,b (C)
//
// The Llama family (D the head dimension, KV the key/value heads), with
// Hugging Face's names less the "model." prefix:
//
//	chunk 0       embeddings: embed_tokens.weight (Vocab×C)
//	chunk 1..L    block l-1: layers.l-1. input_layernorm.weight (C),
//	              self_attn.q_proj.weight (A×C, A = H·D), k_proj.weight (KV·D×C), v_proj.weight (KV·D×C)
//	                [Phi-3: self_attn.qkv_proj.weight ((A+2·KV·D)×C) instead],
//	              [Qwen2: self_attn.q_proj.bias (A), k_proj.bias (KV·D), v_proj.bias (KV·D)],
//	              [Qwen3, Gemma 3: self_attn.q_norm.weight (D), self_attn.k_norm.weight (D)],
//	              self_attn.o_proj.weight (C×A), post_attention_layernorm.weight (C),
//	              [Gemma: pre_feedforward_layernorm.weight (C), post_feedforward_layernorm.weight (C)],
//	              mlp.gate_proj.weight (F×C), mlp.up_proj.weight (F×C) [Phi-3: mlp.gate_up_proj.weight (2F×C)],
//	              mlp.down_proj.weight (C×F)
//	chunk L+1     norm: norm.weight (C), lm_head.weight (Vocab×C) unless the head is tied
//
// q, k and v (and their biases) are adjacent, so one GEMM with the
// (C + 2·KV·D)×C matrix starting at q_proj.weight computes all three; gate
// and up likewise form one 2F×C matrix. The sum of the chunk lengths is
// Shape.ParamCount().
//
// A model defined outside this package (CustomLayout) has a Layout too:
// its name, its chunks and their tensors, and a zero Shape.
type Layout struct {
	Name   string // the model's: the shape's name, or CustomLayout's
	Shape  Shape  // the decoder's; zero for a custom layout
	Chunks []Chunk
	// LoRA is the adapters WithLoRA added (nil: none): block l's are
	// chunk AdapterChunk(l), after the base chunks.
	LoRA *LoRA
}

// EmbeddingChunk is the chunk of the token (and GPT-2's position) embeddings.
const EmbeddingChunk = 0

// BlockChunk is the chunk of block (layer) l, 0 <= l < L.
func BlockChunk(l int) int { return 1 + l }

// FinalNormChunk is the chunk of the final norm (and an untied output head).
func (l *Layout) FinalNormChunk() int { return l.Shape.Layers + 1 }

// HeadChunk is the chunk holding the output head: EmbeddingChunk when it is
// tied, else the final chunk.
func (l *Layout) HeadChunk() int {
	if l.Shape.TiedHead() {
		return EmbeddingChunk
	}
	return l.FinalNormChunk()
}

// NewLayout lays out the parameters of s.
func NewLayout(s Shape) (*Layout, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	c := s.Dim
	l := &Layout{Name: s.Name, Shape: s}
	if s.IsLlama() {
		l.Chunks = append(l.Chunks, makeChunk(0, "embeddings", []string{"embed_tokens.weight"}, [][]int{{s.Vocab, c}}))
	} else {
		l.Chunks = append(l.Chunks, makeChunk(0, "embeddings", []string{"wte", "wpe"}, [][]int{{s.Vocab, c}, {s.MaxSeq, c}}))
	}
	for i := 0; i < s.Layers; i++ {
		names, shapes := blockTensors(s, i)
		l.Chunks = append(l.Chunks, makeChunk(1+i, fmt.Sprintf("block %d", i), names, shapes))
	}
	switch {
	case !s.IsLlama():
		l.Chunks = append(l.Chunks, makeChunk(s.Layers+1, "ln_f", []string{"ln_f.weight", "ln_f.bias"}, [][]int{{c}, {c}}))
	case s.TiedHead():
		l.Chunks = append(l.Chunks, makeChunk(s.Layers+1, "norm", []string{"norm.weight"}, [][]int{{c}}))
	default:
		l.Chunks = append(l.Chunks, makeChunk(s.Layers+1, "norm", []string{"norm.weight", "lm_head.weight"}, [][]int{{c}, {s.Vocab, c}}))
	}
	l.Chunks = expertChunks(s, l.Chunks)
	return l, nil
}

// blockTensors are the names and shapes of block i's tensors in chunk order.
func blockTensors(s Shape, i int) ([]string, [][]int) {
	c, f := s.Dim, s.FFNDim()
	if s.IsLlama() {
		return llamaBlockTensors(s, i)
	}
	p := fmt.Sprintf("h.%d.", i)
	return []string{
			p + "ln_1.weight", p + "ln_1.bias",
			p + "attn.c_attn.weight", p + "attn.c_attn.bias",
			p + "attn.c_proj.weight", p + "attn.c_proj.bias",
			p + "ln_2.weight", p + "ln_2.bias",
			p + "mlp.c_fc.weight", p + "mlp.c_fc.bias",
			p + "mlp.c_proj.weight", p + "mlp.c_proj.bias",
		}, [][]int{
			{c}, {c},
			{3 * c, c}, {3 * c},
			{c, c}, {c},
			{c}, {c},
			{f, c}, {f},
			{c, f}, {c},
		}
}

func llamaBlockTensors(s Shape, i int) ([]string, [][]int) {
	c, f, d, a := s.Dim, s.FFNDim(), s.HeadDim(), s.AttnDim()
	kv := s.KVHeadCount() * d
	p := fmt.Sprintf("layers.%d.", i)
	names := []string{p + "input_layernorm.weight"}
	shapes := [][]int{{c}}
	if s.Fused() {
		names = append(names, p+"self_attn.qkv_proj.weight")
		shapes = append(shapes, []int{a + 2*kv, c})
	} else {
		names = append(names, p+"self_attn.q_proj.weight", p+"self_attn.k_proj.weight", p+"self_attn.v_proj.weight")
		shapes = append(shapes, []int{a, c}, []int{kv, c}, []int{kv, c})
	}
	if s.QKVBias() {
		names = append(names, p+"self_attn.q_proj.bias", p+"self_attn.k_proj.bias", p+"self_attn.v_proj.bias")
		shapes = append(shapes, []int{a}, []int{kv}, []int{kv})
	}
	if s.QKNorm() {
		names = append(names, p+"self_attn.q_norm.weight", p+"self_attn.k_norm.weight")
		shapes = append(shapes, []int{d}, []int{d})
	}
	names = append(names, p+"self_attn.o_proj.weight", p+"post_attention_layernorm.weight")
	shapes = append(shapes, []int{c, a}, []int{c})
	if s.Gemma() {
		names = append(names, p+"pre_feedforward_layernorm.weight", p+"post_feedforward_layernorm.weight")
		shapes = append(shapes, []int{c}, []int{c})
	}
	if s.SparseLayer(i) { // the router; the experts are chunks of their own
		return append(names, p+routerName(s)), append(shapes, []int{s.Experts, c})
	}
	if s.Fused() {
		names = append(names, p+"mlp.gate_up_proj.weight")
		shapes = append(shapes, []int{2 * f, c})
	} else {
		names = append(names, p+"mlp.gate_proj.weight", p+"mlp.up_proj.weight")
		shapes = append(shapes, []int{f, c}, []int{f, c})
	}
	names = append(names, p+"mlp.down_proj.weight")
	shapes = append(shapes, []int{c, f})
	return names, shapes
}

func makeChunk(index int, name string, names []string, shapes [][]int) Chunk {
	ch := Chunk{Index: index, Name: name}
	for i, n := range names {
		size := 1
		for _, d := range shapes[i] {
			size *= d
		}
		ch.Tensors = append(ch.Tensors, Tensor{Name: n, Shape: shapes[i], Offset: ch.Len, Len: size})
		ch.Len += size
	}
	return ch
}

// ParamCount is the number of parameters over all chunks.
func (l *Layout) ParamCount() int64 {
	var n int64
	for _, c := range l.Chunks {
		n += int64(c.Len)
	}
	return n
}

// blockOffsets are the element offsets of a GPT-2 block chunk's tensors;
// the same for every block.
type blockOffsets struct {
	ln1g, ln1b, qkvW, qkvB, projW, projB, ln2g, ln2b, fcW, fcB, fcpW, fcpB int
}

// block returns a GPT-2 layout's block offsets.
func (l *Layout) block() blockOffsets {
	if l.Shape.IsLlama() {
		return blockOffsets{}
	}
	t := l.Chunks[1].Tensors
	return blockOffsets{t[0].Offset, t[1].Offset, t[2].Offset, t[3].Offset, t[4].Offset, t[5].Offset,
		t[6].Offset, t[7].Offset, t[8].Offset, t[9].Offset, t[10].Offset, t[11].Offset}
}

// llamaOffsets are the element offsets of a Llama-family block chunk's
// tensors: the input norm, the fused q|k|v weight (q_proj.weight, k and v
// following, or Phi-3's qkv_proj) and bias (-1 without biases), q_norm
// and k_norm (-1 without), o_proj, the post-attention norm, Gemma's
// pre- and post-feed-forward norms (-1 without), the fused gate|up weight
// (gate_proj.weight, up following, or gate_up_proj) and down_proj.
type llamaOffsets struct {
	ln1, qkvW, qkvB, qNorm, kNorm, oW, ln2, preFF, postFF, gateUpW, downW int
	router                                                                int // a sparse layer's router (the first sparse block's offset; -1 without)
}

// llamaBlock returns a Llama-family layout's block offsets.
func (l *Layout) llamaBlock() llamaOffsets {
	if !l.Shape.IsLlama() {
		return llamaOffsets{}
	}
	// The attention's tensors come first and sit alike in every block; a
	// mixture of experts' dense and sparse blocks differ after them (the
	// MLP's offsets from a dense block, the router's from a sparse one).
	dense, sparse := l.Chunks[1], l.Chunks[1]
	for i := l.Shape.Layers - 1; i >= 0; i-- {
		if l.Shape.SparseLayer(i) {
			sparse = l.Chunks[BlockChunk(i)]
		} else {
			dense = l.Chunks[BlockChunk(i)]
		}
	}
	in := func(ch Chunk, suffix string) int {
		for _, t := range ch.Tensors {
			if strings.HasSuffix(t.Name, suffix) {
				return t.Offset
			}
		}
		return -1
	}
	off := func(suffix string) int { return in(dense, suffix) }
	either := func(a, b string) int { return max(off(a), off(b)) }
	return llamaOffsets{ln1: off(".input_layernorm.weight"), qkvW: either(".q_proj.weight", ".qkv_proj.weight"), qkvB: off(".q_proj.bias"),
		qNorm: off(".q_norm.weight"), kNorm: off(".k_norm.weight"),
		oW: off(".o_proj.weight"), ln2: off(".post_attention_layernorm.weight"),
		preFF: off(".pre_feedforward_layernorm.weight"), postFF: off(".post_feedforward_layernorm.weight"),
		gateUpW: either(".gate_proj.weight", ".gate_up_proj.weight"), downW: off(".down_proj.weight"), router: in(sparse, ".gate.weight")}
}

// InitStd is the standard deviation of GPT-2's weight initialisation.
const InitStd = 0.02

// InitChunk returns chunk c's initial parameters. GPT-2: weights and
// embeddings N(0, 0.02), the residual projections (attn.c_proj and
// mlp.c_proj weights) N(0, 0.02/sqrt(2L)), layernorm gains 1, biases 0.
// The Llama family, as Hugging Face initialises it (initializer_range
// 0.02): every matrix N(0, 0.02), norm gains 1, biases 0.
// The values depend only on (seed, c), so a chunk (or every rank's shard of
// it) can be initialised without the others.
func (l *Layout) InitChunk(seed uint64, c int) []float32 {
	if c < 0 || c >= len(l.Chunks) {
		panic(fmt.Sprintf("model: chunk %d out of range [0, %d)", c, len(l.Chunks)))
	}
	out := make([]float32, l.Chunks[c].Len)
	l.InitChunkInto(seed, c, out)
	return out
}

// InitChunkInto is InitChunk into out, exactly the chunk's length (what
// it held is overwritten).
func (l *Layout) InitChunkInto(seed uint64, c int, out []float32) {
	if c < 0 || c >= len(l.Chunks) || len(out) != l.Chunks[c].Len {
		panic(fmt.Sprintf("model: init chunk %d of [0, %d) into %d values", c, len(l.Chunks), len(out)))
	}
	ch := l.Chunks[c]
	clear(out)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15^uint64(c)))
	residStd := InitStd / math.Sqrt(2*float64(l.Shape.Layers))
	for _, t := range ch.Tensors {
		v := out[t.Offset : t.Offset+t.Len]
		switch {
		case strings.HasSuffix(t.Name, ".lora_A.weight"): // PEFT: kaiming_uniform_(a=√5), U(-1/√in, 1/√in)
			bound := 1 / math.Sqrt(float64(t.Shape[1]))
			for i := range v {
				v[i] = float32((2*rng.Float64() - 1) * bound)
			}
		case strings.HasSuffix(t.Name, ".lora_B.weight"): // zero
		case len(t.Shape) == 2 && !l.Shape.IsLlama() && (strings.HasSuffix(t.Name, "attn.c_proj.weight") || strings.HasSuffix(t.Name, "mlp.c_proj.weight")):
			fillNormal(rng, v, residStd)
		case len(t.Shape) == 2:
			fillNormal(rng, v, InitStd)
		case strings.HasSuffix(t.Name, ".weight") && l.Shape.Gemma(): // Gemma's norm computes x·(1 + weight): weight 0
		case strings.HasSuffix(t.Name, ".weight"): // layernorm gain
			for i := range v {
				v[i] = 1
			}
		default: // biases stay 0
		}
	}
}

// Init returns every chunk's initial parameters (InitChunk for each).
func (l *Layout) Init(seed uint64) [][]float32 {
	out := make([][]float32, len(l.Chunks))
	for c := range l.Chunks {
		out[c] = l.InitChunk(seed, c)
	}
	return out
}

func fillNormal(rng *rand.Rand, v []float32, std float64) {
	for i := range v {
		v[i] = float32(rng.NormFloat64() * std)
	}
}
