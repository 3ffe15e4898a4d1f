package model

import (
	"slices"
	"testing"

	"github.com/strata-ai/strata/gpu"
)

// TestMoEFollowsAccessOrder: a mixture of experts (a dense layer between
// sparse ones), with and without LoRA adapters on its attention, router
// and experts, makes exactly the Params calls of Layout.AccessOrder in
// every micro-batch (each expert after its block in the forward, before
// it in the backward, the adapters before the first of a layer's chunks
// in each pass), and that order keeps CheckAccessOrder's rules.
func TestMoEFollowsAccessOrder(t *testing.T) {
	s := Shape{Name: "moe", Layers: 3, Dim: 16, Heads: 4, Vocab: 256, MaxSeq: 16, Arch: ArchQwen3MoE, KVHeads: 2, FFN: 24,
		HeadDimension: 4, Experts: 4, TopK: 2, ExpertFFN: 8, MLPLayers: "ede"}
	for _, lora := range []bool{false, true} {
		dev := newDevice(t)
		st := dev.DefaultStream()
		l, err := NewLayout(s)
		if err != nil {
			t.Fatal(err)
		}
		if lora {
			if l, err = l.WithLoRA(LoRA{R: 2, Alpha: 4, Targets: []string{"all-linear"}}); err != nil {
				t.Fatal(err)
			}
		}
		if n := l.ExpertChunks(); n != 8 || l.ExpertChunk(1, 0) != -1 || l.ExpertChunk(2, 3) != s.Layers+2+7 {
			t.Fatalf("%d expert chunks; layer 1's expert 0 at %d, layer 2's expert 3 at %d", n, l.ExpertChunk(1, 0), l.ExpertChunk(2, 3))
		}
		order := l.AccessOrder(ActivationOptions{})
		if err := CheckAccessOrder(order, len(l.Chunks)); err != nil {
			t.Fatal(err)
		}
		res, err := NewResident(dev, l, gpu.BF16)
		if err != nil {
			t.Fatal(err)
		}
		res.Load(st, l.Init(1))
		m, err := NewWith(dev, l, 1, 8, ActivationOptions{LoRA: l.LoRA})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{Resident: res}
		ids := Encode([]byte("abcdefghi"))
		for range 2 {
			rec.log = nil
			if err := m.Forward(st, rec, Batch{IDs: ids[:8], Targets: ids[1:]}); err != nil {
				t.Fatal(err)
			}
			if err := m.Backward(st, rec, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Loss(st); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rec.log, order) {
				t.Fatalf("LoRA %t: calls:\n%v\nLayout.AccessOrder:\n%v", lora, rec.log, order)
			}
		}
		m.Free()
		res.Free()
	}
}
