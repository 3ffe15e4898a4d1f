package model

import "testing"

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
