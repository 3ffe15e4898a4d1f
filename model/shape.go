package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/internal/units"
)

// Architectures a Shape can name (Shape.Arch).
const (
	ArchGPT2  = "gpt2"  // GPT-2: learned positions, LayerNorm, GELU MLP, head tied to wte
	ArchLlama = "llama" // Llama family (and Mistral without sliding window): RMSNorm, rotary positions, SwiGLU, grouped-query attention
	ArchQwen2 = "qwen2" // Qwen2: Llama with biases on q, k and v
	ArchQwen3 = "qwen3" // Qwen3: Llama with an RMSNorm on each query and key head (q_norm, k_norm)
	ArchPhi3  = "phi3"  // Phi-3 and Phi-4: Llama with q|k|v and gate|up fused in the files (qkv_proj, gate_up_proj)
	// Gemma 2 and Gemma 3 (text): RMSNorm by 1 + weight, embeddings times
	// √hidden, GeGLU, a norm after attention and around the MLP, a tied
	// head; Gemma 3 adds q_norm and k_norm.
	ArchGemma2 = "gemma2"
	ArchGemma3 = "gemma3"
	// Mixtral: Mistral's attention and a sparse mixture of experts in
	// every layer (block_sparse_moe: a router, experts w1, w3, w2, the top-k
	// weights renormalised); Qwen3-MoE: Qwen3's attention and the same
	// mixture (mlp.gate, mlp.experts.e.gate_proj/up_proj/down_proj,
	// norm_topk_prob), some layers dense (mlp_only_layers,
	// decoder_sparse_step). moe.go computes them.
	ArchMixtral  = "mixtral"
	ArchQwen3MoE = "qwen3_moe"
)

// Shape is the architecture of a decoder: GPT-2 (Arch "" or "gpt2") or the
// Llama family ("llama", "qwen2"). The fields after MaxSeq are the Llama
// family's; zero means the default each method names, and GPT-2 shapes leave
// them zero.
type Shape struct {
	Name   string `json:"name,omitempty"`
	Layers int    `json:"n_layer"`
	Dim    int    `json:"n_embd"`
	Heads  int    `json:"n_head"`
	Vocab  int    `json:"vocab_size"`
	MaxSeq int    `json:"max_seq_len"`

	Arch    string `json:"arch,omitempty"`      // "" = ArchGPT2
	KVHeads int    `json:"n_kv_head,omitempty"` // key/value heads (grouped-query attention); 0 = Heads
	FFN     int    `json:"n_inner,omitempty"`   // MLP hidden size (intermediate_size); 0 = 4·Dim
	// RopeTheta is the rotary embedding base (rope_theta); 0 = 10000.
	RopeTheta float64 `json:"rope_theta,omitempty"`
	// NormEps is the normalisation epsilon (rms_norm_eps,
	// layer_norm_epsilon); 0 = 1e-5.
	NormEps float64 `json:"norm_eps,omitempty"`
	// TieEmbeddings (tie_word_embeddings) makes a Llama-family output head
	// the token embedding, as GPT-2's always is; false = its own lm_head.
	TieEmbeddings bool `json:"tie_word_embeddings,omitempty"`

	// The attention variants of the Llama family's members (rope.go): all
	// zero for Llama 3.0, Qwen2 and Mistral without a window.

	// HeadDimension is the width of an attention head (head_dim); 0 =
	// Dim/Heads.
	HeadDimension int `json:"head_dim,omitempty"`
	// Rope is the rotary embedding's scaling (rope_scaling); zero: plain.
	Rope RopeScaling `json:"rope_scaling,omitzero"`
	// RotaryFraction is partial_rotary_factor: the rotated share of each
	// head; 0 = 1.
	RotaryFraction float64 `json:"partial_rotary_factor,omitempty"`
	// SlidingWindow > 0 makes the layers LayerTypes marks sliding (all of
	// them when it is empty) attend to the last SlidingWindow tokens only.
	SlidingWindow int `json:"sliding_window,omitempty"`
	// LayerTypes is one letter per layer, 's' sliding and 'f' full
	// attention (transformers' layer_types); "" = every layer alike.
	LayerTypes string `json:"layer_types,omitempty"`
	// RopeLocalTheta is the rotary base of the sliding layers (Gemma 3's
	// rope_local_base_freq: plain rotary, no scaling); 0 = the same rotary
	// embedding as the full layers.
	RopeLocalTheta float64 `json:"rope_local_base_freq,omitempty"`
	// QueryScale is query_pre_attn_scalar (Gemma): scores are scaled by
	// QueryScale^-0.5; 0 = the head dimension.
	QueryScale float64 `json:"query_pre_attn_scalar,omitempty"`
	// AttnSoftCap and FinalSoftCap are Gemma 2's attn_logit_softcapping
	// and final_logit_softcapping (x -> cap·tanh(x/cap)); 0 = none.
	AttnSoftCap  float64 `json:"attn_logit_softcapping,omitempty"`
	FinalSoftCap float64 `json:"final_logit_softcapping,omitempty"`

	// The mixture of experts of ArchMixtral and ArchQwen3MoE (moe.go):
	// zero for every other arch.

	// Experts is the number of experts of a sparse layer (Mixtral's
	// num_local_experts, Qwen3-MoE's num_experts).
	Experts int `json:"num_experts,omitempty"`
	// TopK is the number of experts each token is routed to
	// (num_experts_per_tok).
	TopK int `json:"num_experts_per_tok,omitempty"`
	// ExpertFFN is an expert's hidden size (moe_intermediate_size); 0 =
	// FFN (Mixtral's experts are intermediate_size wide).
	ExpertFFN int `json:"moe_intermediate_size,omitempty"`
	// NormTopK renormalises the top-k routing weights to sum to 1
	// (norm_topk_prob; Mixtral always does).
	NormTopK bool `json:"norm_topk_prob,omitempty"`
	// MLPLayers is one letter per layer, 'e' a sparse layer (experts) and
	// 'd' a dense MLP of FFN (Qwen3-MoE's mlp_only_layers and
	// decoder_sparse_step); "" = every layer sparse.
	MLPLayers string `json:"mlp_layers,omitempty"`
	// RouterAux adds RouterAuxCoef times the load-balancing loss to the
	// loss (output_router_logits, router_aux_loss_coef).
	RouterAux     bool    `json:"output_router_logits,omitempty"`
	RouterAuxCoef float64 `json:"router_aux_loss_coef,omitempty"`
}

// Named shapes: tiny ones for tests, GPT-2 sizes and a 7B-class shape for
// estimates and benchmarks, and the Llama family's published configurations.
// Byte-level models use vocabulary 256.
var shapes = map[string]Shape{
	"tiny":      {Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64},
	"small":     {Layers: 4, Dim: 128, Heads: 4, Vocab: 256, MaxSeq: 256},
	"medium":    {Layers: 8, Dim: 256, Heads: 8, Vocab: 256, MaxSeq: 256},
	"gpt2":      {Layers: 12, Dim: 768, Heads: 12, Vocab: 50257, MaxSeq: 1024},
	"gpt2-350m": {Layers: 24, Dim: 1024, Heads: 16, Vocab: 50257, MaxSeq: 1024},
	"gpt2-774m": {Layers: 36, Dim: 1280, Heads: 20, Vocab: 50257, MaxSeq: 1024},
	"gpt2-1.5b": {Layers: 48, Dim: 1600, Heads: 25, Vocab: 50257, MaxSeq: 1024},
	"gpt-2b":    {Layers: 40, Dim: 2048, Heads: 16, Vocab: 256, MaxSeq: 1024},
	"gpt-5b":    {Layers: 40, Dim: 3200, Heads: 25, Vocab: 256, MaxSeq: 1024}, // 4.9B: 16Ψ = 79 GB, 3x this machine's 24 GiB
	"gpt-7b":    {Layers: 32, Dim: 4096, Heads: 32, Vocab: 50257, MaxSeq: 2048},

	// Byte-level Llama-family shapes for tests: grouped-query attention
	// (2 query heads per key/value head) and an untied head.
	"tiny-llama": {Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64, Arch: ArchLlama, KVHeads: 2, FFN: 64},
	"tiny-qwen2": {Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64, Arch: ArchQwen2, KVHeads: 2, FFN: 64, NormEps: 1e-6},
	// config.json of meta-llama/Meta-Llama-3-8B, -70B and Qwen/Qwen2-7B.
	"llama-3-8b":  {Layers: 32, Dim: 4096, Heads: 32, Vocab: 128256, MaxSeq: 8192, Arch: ArchLlama, KVHeads: 8, FFN: 14336, RopeTheta: 500000},
	"llama-3-70b": {Layers: 80, Dim: 8192, Heads: 64, Vocab: 128256, MaxSeq: 8192, Arch: ArchLlama, KVHeads: 8, FFN: 28672, RopeTheta: 500000},
	"qwen2-7b":    {Layers: 28, Dim: 3584, Heads: 28, Vocab: 152064, MaxSeq: 32768, Arch: ArchQwen2, KVHeads: 4, FFN: 18944, RopeTheta: 1000000, NormEps: 1e-6},
	// Mixtures of experts: config.json of mistralai/Mixtral-8x7B-v0.1
	// (46.7B parameters, 12.9B active) and Qwen/Qwen3-30B-A3B (30.5B,
	// 3.3B active).
	"mixtral-8x7b": {Layers: 32, Dim: 4096, Heads: 32, Vocab: 32000, MaxSeq: 32768, Arch: ArchMixtral, KVHeads: 8, FFN: 14336, RopeTheta: 1e6,
		Experts: 8, TopK: 2, NormTopK: true, RouterAuxCoef: 0.02},
	"qwen3-30b-a3b": {Layers: 48, Dim: 2048, Heads: 32, Vocab: 151936, MaxSeq: 40960, Arch: ArchQwen3MoE, KVHeads: 4, FFN: 6144, HeadDimension: 128,
		RopeTheta: 1e6, NormEps: 1e-6, Experts: 128, TopK: 8, ExpertFFN: 768, NormTopK: true, RouterAuxCoef: 0.001},
}

func init() {
	for n, s := range shapes {
		s.Name = n
		shapes[n] = s
	}
	aliases := map[string]string{"gpt2-124m": "gpt2", "gpt2-medium": "gpt2-350m", "gpt2-large": "gpt2-774m", "gpt2-xl": "gpt2-1.5b",
		"llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b"}
	for a, n := range aliases {
		s := shapes[n]
		shapes[a] = s
	}
}

// Lookup returns a named shape.
func Lookup(name string) (Shape, error) {
	s, ok := shapes[strings.ToLower(name)]
	if !ok {
		return Shape{}, fmt.Errorf("model: unknown shape %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	return s, nil
}

// LookupConfigShape is Lookup for config.Options.LookupShape: a config's
// strata.model resolved among the named shapes.
func LookupConfigShape(name string) (config.Shape, error) {
	s, err := Lookup(name)
	return config.Shape(s), err
}

// Names lists the named shapes, smallest first.
func Names() []string {
	var names []string
	for n, s := range shapes {
		if n == s.Name {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := shapes[names[i]].ParamCount(), shapes[names[j]].ParamCount()
		return a < b || a == b && names[i] < names[j]
	})
	return names
}

// Validate says what is wrong with s.
func (s Shape) Validate() error {
	switch {
	case s.Arch != "" && s.Arch != ArchGPT2 && !s.IsLlama():
		return fmt.Errorf("model: arch %q is not one of %s", s.Arch, strings.Join(Archs(), ", "))
	case s.Layers < 1:
		return fmt.Errorf("model: n_layer %d must be >= 1", s.Layers)
	case s.Dim < 1 || s.Heads < 1:
		return fmt.Errorf("model: n_embd %d and n_head %d must be >= 1", s.Dim, s.Heads)
	case s.HeadDimension == 0 && s.Dim%s.Heads != 0:
		return fmt.Errorf("model: n_embd %d is not a multiple of n_head %d", s.Dim, s.Heads)
	case s.HeadDimension < 0:
		return fmt.Errorf("model: head_dim %d must not be negative", s.HeadDimension)
	case s.Vocab < 1 || s.MaxSeq < 1:
		return fmt.Errorf("model: vocab_size %d and max_seq_len %d must be >= 1", s.Vocab, s.MaxSeq)
	case s.KVHeads < 0 || s.FFN < 0 || s.RopeTheta < 0 || s.NormEps < 0:
		return fmt.Errorf("model: n_kv_head %d, n_inner %d, rope_theta %g and norm_eps %g must not be negative", s.KVHeads, s.FFN, s.RopeTheta, s.NormEps)
	case s.Heads%s.KVHeadCount() != 0:
		return fmt.Errorf("model: n_head %d is not a multiple of n_kv_head %d", s.Heads, s.KVHeadCount())
	case !s.MoE() && s.moeFields():
		return fmt.Errorf("model: num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, mlp_layers and the router's loss are the mixtures of experts' (arch %s, %s)", ArchMixtral, ArchQwen3MoE)
	case !s.IsLlama() && (s.KVHeads != 0 && s.KVHeads != s.Heads || s.RopeTheta != 0 || s.TieEmbeddings || s.variants()):
		return fmt.Errorf("model: n_kv_head, rope_theta, tie_word_embeddings and the attention variants are the Llama family's (arch %s); GPT-2 has none of them", strings.Join(Archs()[1:], ", "))
	case s.IsLlama() && s.HeadDim()%2 != 0:
		return fmt.Errorf("model: head dimension %d must be even for rotary embeddings", s.HeadDim())
	}
	if s.IsLlama() {
		if err := s.checkVariants(); err != nil {
			return err
		}
	}
	if err := s.checkMoE(); err != nil {
		return err
	}
	if _, ok := s.checkedParamCount(); !ok {
		return fmt.Errorf("model: n_layer %d, n_embd %d, vocab_size %d, max_seq_len %d: the model state (%d bytes per parameter) would exceed 2^63 bytes: lower n_layer or n_embd",
			s.Layers, s.Dim, s.Vocab, s.MaxSeq, maxBytesPerParam)
	}
	return nil
}

// maxBytesPerParam is the most bytes any tier keeps per parameter (bf16
// param and gradient, fp32 master and two moments: 16 B), and so the factor
// every size is checked against: a shape whose Ψ × 16 B fits in an int64
// can be multiplied out everywhere without overflow.
const maxBytesPerParam = 16

// checkedParamCount is ParamCount through checked arithmetic: false when Ψ,
// or its model state at maxBytesPerParam bytes, does not fit in an int64.
// It checks a bound on every product ParamCount forms,
// L·(13·M² + 3·M·F + 16·M) + (2·V + T + 4)·M with M = max(C, H·D, D).
func (s Shape) checkedParamCount() (int64, bool) {
	hd, ok0 := units.Mul(int64(s.Heads), int64(s.HeadDim()))
	if !ok0 {
		return 0, false
	}
	c, l, f := max(int64(s.Dim), hd, int64(s.HeadDim())), int64(s.Layers), int64(s.FFNDim())
	c2, ok1 := units.Mul(c, c)
	c2x13, ok2 := units.Mul(c2, 13)
	cf, ok3 := units.Mul(c, f)
	cfx3, ok4 := units.Mul(cf, 3)
	c16, ok5 := units.Mul(c, 16)
	block, ok6 := units.Add(c2x13, cfx3, c16)
	blocks, ok7 := units.Mul(block, l)
	rows, ok8 := units.Add(int64(s.Vocab), int64(s.Vocab), int64(s.MaxSeq), 4)
	emb, ok9 := units.Mul(rows, c)
	bound, ok10 := units.Add(blocks, emb)
	experts, ok12 := s.checkedExpertParams()
	bound, ok13 := units.Add(bound, experts)
	_, ok11 := units.Mul(bound, maxBytesPerParam)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && ok8 && ok9 && ok10 && ok11 && ok12 && ok13) {
		return 0, false
	}
	return s.ParamCount(), true
}

// Canonical is s without its name and with every default written out, so
// that two shapes describe the same architecture when their Canonical
// forms are equal.
func (s Shape) Canonical() Shape {
	s.Name, s.Arch = "", s.ArchName()
	s.KVHeads, s.FFN, s.NormEps = s.KVHeadCount(), s.FFNDim(), s.Eps()
	if s.IsLlama() {
		s.RopeTheta = s.Theta()
		s.HeadDimension = s.HeadDim()
		s.RotaryFraction = s.rotaryFraction()
	}
	if s.MoE() {
		s.ExpertFFN, s.NormTopK = s.ExpertFFNDim(), s.NormTopKProb()
		if s.MLPLayers == strings.Repeat("e", s.Layers) {
			s.MLPLayers = ""
		}
	}
	return s
}

// IsLlama says whether s is of the Llama family: every Arch but GPT-2's
// (pre-norm blocks of rotary grouped-query attention and a gated MLP).
func (s Shape) IsLlama() bool {
	switch s.Arch {
	case ArchLlama, ArchQwen2, ArchQwen3, ArchPhi3, ArchGemma2, ArchGemma3, ArchMixtral, ArchQwen3MoE:
		return true
	}
	return false
}

// Archs lists the architectures a Shape can name, GPT-2's first.
func Archs() []string {
	return []string{ArchGPT2, ArchLlama, ArchQwen2, ArchQwen3, ArchPhi3, ArchGemma2, ArchGemma3, ArchMixtral, ArchQwen3MoE}
}

// Gemma says whether s is Gemma 2 or 3: RMSNorm by 1 + weight, embeddings
// times √Dim, GeGLU, and the norms after attention and around the MLP.
func (s Shape) Gemma() bool { return s.Arch == ArchGemma2 || s.Arch == ArchGemma3 }

// QKNorm says whether each query and key head goes through an RMSNorm of
// its own (q_norm, k_norm: Qwen3, Gemma 3) before the rotary embedding.
func (s Shape) QKNorm() bool {
	return s.Arch == ArchQwen3 || s.Arch == ArchGemma3 || s.Arch == ArchQwen3MoE
}

// Fused says whether the files hold q|k|v and gate|up as one tensor each
// (Phi-3's qkv_proj and gate_up_proj).
func (s Shape) Fused() bool { return s.Arch == ArchPhi3 }

// ArchName is Arch with the default filled in.
func (s Shape) ArchName() string {
	if s.Arch == "" {
		return ArchGPT2
	}
	return s.Arch
}

// HeadDim is the width of an attention head: HeadDimension, or Dim /
// Heads when 0.
func (s Shape) HeadDim() int {
	if s.HeadDimension != 0 {
		return s.HeadDimension
	}
	return s.Dim / s.Heads
}

// AttnDim is the width of the attention's output, Heads·HeadDim (the
// input of o_proj; Dim unless head_dim says otherwise).
func (s Shape) AttnDim() int { return s.Heads * s.HeadDim() }

// KVHeadCount is the number of key/value heads: KVHeads, or Heads when 0.
func (s Shape) KVHeadCount() int {
	if s.KVHeads == 0 {
		return s.Heads
	}
	return s.KVHeads
}

// FFNDim is the MLP hidden size: FFN, or 4·Dim when 0.
func (s Shape) FFNDim() int {
	if s.FFN == 0 {
		return 4 * s.Dim
	}
	return s.FFN
}

// Theta is the rotary embedding base: RopeTheta, or 10000 when 0.
func (s Shape) Theta() float64 {
	if s.RopeTheta == 0 {
		return 10000
	}
	return s.RopeTheta
}

// Eps is the normalisation epsilon: NormEps, or 1e-5 when 0.
func (s Shape) Eps() float64 {
	if s.NormEps == 0 {
		return 1e-5
	}
	return s.NormEps
}

// TiedHead says whether the output head is the token embedding (chunk 0)
// rather than a tensor of the final chunk: always for GPT-2.
func (s Shape) TiedHead() bool { return !s.IsLlama() || s.TieEmbeddings }

// QKVBias says whether the attention's q, k and v projections have biases
// (GPT-2's c_attn and Qwen2's do, the others' do not).
func (s Shape) QKVBias() bool { return s.ArchName() == ArchGPT2 || s.Arch == ArchQwen2 }

// BlockParamCount is the number of parameters of one transformer block
// with a dense MLP (a mixture of experts' layers: LayerParamCount).
// GPT-2: ln1 (2C), qkv (3C·C + 3C), proj (C·C + C), ln2 (2C), fc (F·C + F),
// fcproj (C·F + C). Llama: input norm (C), q (A·C, A = H·D), k and v
// (KV·D·C each), o (C·A), post-attention norm (C), gate, up and down
// (3·C·F); Qwen2 adds q, k and v biases (A + 2·KV·D), Qwen3 and Gemma 3
// q_norm and k_norm (D each), Gemma the norms before and after the MLP
// (2C).
func (s Shape) BlockParamCount() int64 {
	c, f := int64(s.Dim), int64(s.FFNDim())
	if !s.IsLlama() {
		return 4*c*c + 2*c*f + 9*c + f
	}
	a, d := int64(s.AttnDim()), int64(s.HeadDim())
	kv := int64(s.KVHeadCount()) * d
	n := 2*a*c + 2*kv*c + 3*c*f + 2*c
	if s.QKVBias() {
		n += a + 2*kv
	}
	if s.QKNorm() {
		n += 2 * d
	}
	if s.Gemma() {
		n += 2 * c
	}
	return n
}

// EmbeddingParamCount is the embedding chunk: GPT-2's wte (Vocab·C) and wpe
// (MaxSeq·C), the Llama family's embed_tokens (Vocab·C).
func (s Shape) EmbeddingParamCount() int64 {
	if s.IsLlama() {
		return int64(s.Vocab) * int64(s.Dim)
	}
	return int64(s.Vocab+s.MaxSeq) * int64(s.Dim)
}

// FinalParamCount is the final chunk: GPT-2's ln_f (2C); the Llama family's
// norm (C) and, when the head is not tied, lm_head (Vocab·C).
func (s Shape) FinalParamCount() int64 {
	c := int64(s.Dim)
	switch {
	case !s.IsLlama():
		return 2 * c
	case s.TiedHead():
		return c
	}
	return c + int64(s.Vocab)*c
}

// ParamCount is Ψ: embeddings, L blocks (a mixture of experts' with all
// their experts) and the final chunk.
func (s Shape) ParamCount() int64 {
	if s.MoE() {
		n := s.EmbeddingParamCount() + s.FinalParamCount()
		for l := range s.Layers {
			n += s.LayerParamCount(l)
		}
		return n
	}
	return s.EmbeddingParamCount() + int64(s.Layers)*s.BlockParamCount() + s.FinalParamCount()
}

func (s Shape) String() string {
	if s.MoE() {
		return fmt.Sprintf("%s (%s L=%d C=%d H=%d KV=%d F=%d E=%d k=%d V=%d T=%d, %.1fM params, %.1fM active)", s.Name, s.Arch, s.Layers, s.Dim, s.Heads, s.KVHeadCount(), s.ExpertFFNDim(), s.Experts, s.TopK, s.Vocab, s.MaxSeq, float64(s.ParamCount())/1e6, float64(s.ActiveParamCount())/1e6)
	}
	if s.IsLlama() {
		return fmt.Sprintf("%s (%s L=%d C=%d H=%d KV=%d F=%d V=%d T=%d, %.1fM params)", s.Name, s.Arch, s.Layers, s.Dim, s.Heads, s.KVHeadCount(), s.FFNDim(), s.Vocab, s.MaxSeq, float64(s.ParamCount())/1e6)
	}
	return fmt.Sprintf("%s (L=%d C=%d H=%d V=%d T=%d, %.1fM params)", s.Name, s.Layers, s.Dim, s.Heads, s.Vocab, s.MaxSeq, float64(s.ParamCount())/1e6)
}
