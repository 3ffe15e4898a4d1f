package model

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

func TestTokenizerRoundTrip(t *testing.T) {
	text := make([]byte, 0, 512)
	for i := 0; i < 512; i++ {
		text = append(text, byte(i*37))
	}
	ids := Encode(text)
	for i, id := range ids {
		if id < 0 || id >= ByteVocab || byte(id) != text[i] {
			t.Fatalf("id %d at %d for byte %d", id, i, text[i])
		}
	}
	back, err := Decode(ids)
	if err != nil || !bytes.Equal(back, text) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := Decode([]int32{65, 256}); err == nil {
		t.Fatal("Decode accepted id 256")
	}
	if _, err := Decode([]int32{-1}); err == nil {
		t.Fatal("Decode accepted id -1")
	}
}

func TestSamplerDeterministicAndShifted(t *testing.T) {
	tokens := make([]int32, 1000)
	for i := range tokens {
		tokens[i] = int32(i % 251)
	}
	s, err := NewSampler(tokens, 16, 42)
	if err != nil {
		t.Fatal(err)
	}
	b := must(t)(s.Batch(3, 0, 4))
	for r := 0; r < 4; r++ {
		for i := 0; i < 16; i++ {
			id, tg := b.IDs[r*16+i], b.Targets[r*16+i]
			if tg != (id+1)%251 {
				t.Fatalf("row %d token %d: id %d target %d is not the next token", r, i, id, tg)
			}
		}
	}
	// Same (seed, step, row) → same window, whatever the call order or split.
	s2, _ := NewSampler(tokens, 16, 42)
	_ = must(t)(s2.Batch(9, 0, 8))
	if c := must(t)(s2.Batch(3, 0, 4)); !slices.Equal(c.IDs, b.IDs) || !slices.Equal(c.Targets, b.Targets) {
		t.Fatal("same step gives different windows")
	}
	// 2 ranks × 2 micro-batches of 1 row == 1 rank × 4 rows == 4 ranks × 1.
	var split []int32
	for r := 0; r < 2; r++ {
		for k := 0; k < 2; k++ {
			split = append(split, must(t)(s.RankBatch(3, r, k, 2, 1)).IDs...)
		}
	}
	if !slices.Equal(split, b.IDs) {
		t.Fatal("rank split does not reproduce the global batch in rank order")
	}
	if c := must(t)(s.RankBatch(3, 1, 0, 1, 2)); !slices.Equal(c.IDs, b.IDs[32:]) {
		t.Fatal("rank 1 of 2 (1 micro-batch of 2 rows) is not rows 2..3")
	}
	if slices.Equal(must(t)(s.Batch(4, 0, 4)).IDs, b.IDs) {
		t.Fatal("step 4 and step 3 draw the same windows")
	}
	s3, _ := NewSampler(tokens, 16, 43)
	if slices.Equal(must(t)(s3.Batch(3, 0, 4)).IDs, b.IDs) {
		t.Fatal("the seed does not change the windows")
	}
	// Windows cover the corpus: every start in [0, len-seq) is possible.
	seen := map[int64]bool{}
	short, _ := NewSampler(tokens[:20], 16, 1)
	for step := 0; step < 200; step++ {
		w := short.Window(step, 0)
		if w < 0 || w > 3 {
			t.Fatalf("window %d out of [0, 3]", w)
		}
		seen[w] = true
	}
	if len(seen) != 4 {
		t.Fatalf("windows seen %v, want all of 0..3", seen)
	}
}

func TestSamplerRejectsShortCorpus(t *testing.T) {
	if _, err := NewSampler(make([]int32, 16), 16, 1); !errors.Is(err, ErrCorpusTooShort) {
		t.Fatalf("err = %v, want ErrCorpusTooShort", err)
	}
	if _, err := NewSampler(make([]int32, 17), 16, 1); err != nil {
		t.Fatalf("17 tokens for seq 16: %v", err)
	}
}

// must returns the batch, failing t on a read error.
func must(t testing.TB) func(Batch, error) Batch {
	return func(b Batch, err error) Batch {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}
