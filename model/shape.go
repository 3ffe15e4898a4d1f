package model

import (
	"fmt"
	"sort"
	"strings"

	"github.com/strata-ai/strata/internal/units"
)

// Shape is the architecture of a GPT-2-style decoder.
type Shape struct {
	Name   string `json:"name,omitempty"`
	Layers int    `json:"n_layer"`
	Dim    int    `json:"n_embd"`
	Heads  int    `json:"n_head"`
	Vocab  int    `json:"vocab_size"`
	MaxSeq int    `json:"max_seq_len"`
}

// Named shapes: tiny ones for tests, GPT-2 sizes and a 7B-class shape for
// estimates and benchmarks. Byte-level models use vocabulary 256.
var shapes = map[string]Shape{
	"tiny":      {Layers: 2, Dim: 32, Heads: 4, Vocab: 256, MaxSeq: 64},
	"small":     {Layers: 4, Dim: 128, Heads: 4, Vocab: 256, MaxSeq: 256},
	"medium":    {Layers: 8, Dim: 256, Heads: 8, Vocab: 256, MaxSeq: 256},
	"gpt2":      {Layers: 12, Dim: 768, Heads: 12, Vocab: 50257, MaxSeq: 1024},
	"gpt2-350m": {Layers: 24, Dim: 1024, Heads: 16, Vocab: 50257, MaxSeq: 1024},
	"gpt2-774m": {Layers: 36, Dim: 1280, Heads: 20, Vocab: 50257, MaxSeq: 1024},
	"gpt2-1.5b": {Layers: 48, Dim: 1600, Heads: 25, Vocab: 50257, MaxSeq: 1024},
	"gpt-2b":    {Layers: 40, Dim: 2048, Heads: 16, Vocab: 256, MaxSeq: 1024},
	"gpt-7b":    {Layers: 32, Dim: 4096, Heads: 32, Vocab: 50257, MaxSeq: 2048},
}

func init() {
	for n, s := range shapes {
		s.Name = n
		shapes[n] = s
	}
	aliases := map[string]string{"gpt2-124m": "gpt2", "gpt2-medium": "gpt2-350m", "gpt2-large": "gpt2-774m", "gpt2-xl": "gpt2-1.5b"}
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

// Names lists the named shapes, smallest first.
func Names() []string {
	var names []string
	for n, s := range shapes {
		if n == s.Name {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return shapes[names[i]].ParamCount() < shapes[names[j]].ParamCount() })
	return names
}

// Validate says what is wrong with s.
func (s Shape) Validate() error {
	switch {
	case s.Layers < 1:
		return fmt.Errorf("model: n_layer %d must be >= 1", s.Layers)
	case s.Dim < 1 || s.Heads < 1:
		return fmt.Errorf("model: n_embd %d and n_head %d must be >= 1", s.Dim, s.Heads)
	case s.Dim%s.Heads != 0:
		return fmt.Errorf("model: n_embd %d is not a multiple of n_head %d", s.Dim, s.Heads)
	case s.Vocab < 1 || s.MaxSeq < 1:
		return fmt.Errorf("model: vocab_size %d and max_seq_len %d must be >= 1", s.Vocab, s.MaxSeq)
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
func (s Shape) checkedParamCount() (int64, bool) {
	c, l := int64(s.Dim), int64(s.Layers)
	c2, ok1 := units.Mul(c, c)
	block, ok2 := units.Mul(12, c2)
	c13, ok0 := units.Mul(13, c)
	block, ok3 := units.Add(block, c13)
	blocks, ok4 := units.Mul(l, block)
	rows, ok8 := units.Add(int64(s.Vocab), int64(s.MaxSeq))
	emb, ok5 := units.Mul(rows, c)
	psi, ok6 := units.Add(emb, blocks, 2*c)
	_, ok7 := units.Mul(psi, maxBytesPerParam)
	return psi, ok0 && ok8 && ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7
}

// HeadDim is Dim / Heads.
func (s Shape) HeadDim() int { return s.Dim / s.Heads }

// BlockParamCount is the number of parameters of one transformer block:
// ln1 (2C), qkv (3C·C + 3C), proj (C·C + C), ln2 (2C), fc (4C·C + 4C), fcproj (4C·C + C).
func (s Shape) BlockParamCount() int64 {
	c := int64(s.Dim)
	return 12*c*c + 13*c
}

// EmbeddingParamCount is wte (Vocab·C) + wpe (MaxSeq·C); the output head is tied to wte.
func (s Shape) EmbeddingParamCount() int64 {
	return int64(s.Vocab+s.MaxSeq) * int64(s.Dim)
}

// ParamCount is Ψ: embeddings, L blocks and the final layernorm (2C).
func (s Shape) ParamCount() int64 {
	return s.EmbeddingParamCount() + int64(s.Layers)*s.BlockParamCount() + 2*int64(s.Dim)
}

func (s Shape) String() string {
	return fmt.Sprintf("%s (L=%d C=%d H=%d V=%d T=%d, %.1fM params)", s.Name, s.Layers, s.Dim, s.Heads, s.Vocab, s.MaxSeq, float64(s.ParamCount())/1e6)
}
