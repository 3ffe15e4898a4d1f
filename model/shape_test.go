package model

import (
	"strings"
	"testing"
)

func TestGPT2ParamCount(t *testing.T) {
	// GPT-2 124M as published (wte 50257x768, wpe 1024x768, tied head): 124,439,808.
	s, err := Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.ParamCount(); got != 124439808 {
		t.Fatalf("gpt2 params = %d, want 124439808", got)
	}
	for _, n := range Names() {
		s, _ := Lookup(n)
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// A shape whose Ψ (or its 16 B per parameter of model state) does not fit
// in an int64 is refused, not wrapped around to a negative count; the
// largest named shapes still pass.
func TestShapeOverflow(t *testing.T) {
	big := Shape{Name: "big", Layers: 1_000_000, Dim: 1_000_000, Heads: 1, Vocab: 50257, MaxSeq: 1024}
	err := big.Validate()
	if err == nil || !strings.Contains(err.Error(), "would exceed 2^63 bytes: lower n_layer or n_embd") {
		t.Errorf("Validate: %v", err)
	}
	if _, err := NewLayout(big); err == nil {
		t.Error("NewLayout accepted the overflowing shape")
	}
	// Ψ fits, Ψ × 16 B does not: 2^59+ parameters.
	edge := Shape{Name: "edge", Layers: 1 << 20, Dim: 1 << 20, Heads: 1, Vocab: 1, MaxSeq: 1}
	if err := edge.Validate(); err == nil {
		t.Errorf("Validate accepted Ψ = %d (×16 B overflows)", edge.ParamCount())
	}
	for _, name := range Names() {
		s, _ := Lookup(name)
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
