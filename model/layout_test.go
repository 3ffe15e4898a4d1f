package model

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestLayoutCoversShape(t *testing.T) {
	for _, n := range Names() {
		s, _ := Lookup(n)
		l, err := NewLayout(s)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := l.ParamCount(), s.ParamCount(); got != want {
			t.Errorf("%s: layout holds %d params, shape says %d", n, got, want)
		}
		if len(l.Chunks) != s.Layers+2+s.SparseLayers()*s.Experts || l.FinalNormChunk() != s.Layers+1 {
			t.Errorf("%s: %d chunks, want L+2 and the experts' = %d", n, len(l.Chunks), s.Layers+2+s.SparseLayers()*s.Experts)
		}
		for i, ch := range l.Chunks {
			if ch.Index != i {
				t.Errorf("%s: chunk %d has index %d", n, i, ch.Index)
			}
			off := 0
			for _, tn := range ch.Tensors {
				size := 1
				for _, d := range tn.Shape {
					size *= d
				}
				if tn.Offset != off || tn.Len != size {
					t.Errorf("%s chunk %d %s: offset %d len %d, want %d %d", n, i, tn.Name, tn.Offset, tn.Len, off, size)
				}
				off += tn.Len
			}
			if off != ch.Len {
				t.Errorf("%s chunk %d: tensors cover %d of %d", n, i, off, ch.Len)
			}
		}
		if i := 1; int64(l.Chunks[i].Len) != s.BlockChunkParamCount(0) || !s.MoE() && s.BlockChunkParamCount(0) != s.BlockParamCount() {
			t.Errorf("%s: block chunk %d, BlockChunkParamCount %d, BlockParamCount %d", n, l.Chunks[i].Len, s.BlockChunkParamCount(0), s.BlockParamCount())
		}
		for c := range l.ExpertChunks() {
			if ch := l.Chunks[s.Layers+2+c]; int64(ch.Len) != s.ExpertParamCount() || !l.IsExpert(ch.Index) {
				t.Errorf("%s: expert chunk %d (%s) of %d, ExpertParamCount %d", n, ch.Index, ch.Name, ch.Len, s.ExpertParamCount())
			}
		}
	}
}

func TestLayoutNamesAndShapes(t *testing.T) {
	s, _ := Lookup("tiny")
	l, _ := NewLayout(s)
	c := s.Dim
	want := map[string][]int{
		"wte": {s.Vocab, c}, "wpe": {s.MaxSeq, c},
		"h.1.attn.c_attn.weight": {3 * c, c}, "h.1.mlp.c_proj.weight": {c, 4 * c}, "h.1.mlp.c_fc.bias": {4 * c},
		"ln_f.weight": {c},
	}
	found := 0
	for _, ch := range l.Chunks {
		for _, tn := range ch.Tensors {
			if w, ok := want[tn.Name]; ok {
				found++
				if !slices.Equal(w, tn.Shape) {
					t.Errorf("%s: shape %v, want %v", tn.Name, tn.Shape, w)
				}
			}
		}
	}
	if found != len(want) {
		t.Errorf("found %d of %d tensors", found, len(want))
	}
	if tn, ok := l.Chunks[BlockChunk(1)].Tensor("h.1.ln_2.bias"); !ok || tn.Offset != l.block().ln2b {
		t.Errorf("h.1.ln_2.bias: %+v %v, block offset %d", tn, ok, l.block().ln2b)
	}
}

func TestInitChunk(t *testing.T) {
	s := Shape{Name: "t", Layers: 3, Dim: 64, Heads: 4, Vocab: 256, MaxSeq: 64}
	l, _ := NewLayout(s)
	a, b := l.Init(7), l.Init(7)
	for c := range a {
		if !slices.Equal(a[c], b[c]) {
			t.Fatalf("chunk %d differs between two inits with one seed", c)
		}
		if got := l.InitChunk(7, c); !slices.Equal(got, a[c]) {
			t.Fatalf("InitChunk(%d) differs from Init", c)
		}
	}
	if slices.Equal(l.InitChunk(8, 1), a[1]) {
		t.Fatal("seed does not change the init")
	}
	if slices.Equal(a[1], a[2]) {
		t.Fatal("two blocks have identical init")
	}
	// Per tensor: the standard deviation within 10 % (thousands of samples:
	// the relative standard error is below 3 %), gains 1, biases 0.
	resid := InitStd / math.Sqrt(2*float64(s.Layers))
	for c, ch := range l.Chunks {
		for _, tn := range ch.Tensors {
			v := a[c][tn.Offset : tn.Offset+tn.Len]
			switch {
			case len(tn.Shape) == 2:
				want := InitStd
				if strings.HasSuffix(tn.Name, "c_proj.weight") {
					want = resid
				}
				var sum, sq float64
				for _, x := range v {
					sum += float64(x)
					sq += float64(x) * float64(x)
				}
				mean := sum / float64(len(v))
				std := math.Sqrt(sq/float64(len(v)) - mean*mean)
				if math.Abs(std-want) > 0.1*want || math.Abs(mean) > 0.1*want {
					t.Errorf("%s: mean %.4g std %.4g, want 0 and %.4g", tn.Name, mean, std, want)
				}
			default:
				want := float32(0)
				if strings.HasSuffix(tn.Name, ".weight") {
					want = 1
				}
				for _, x := range v {
					if x != want {
						t.Fatalf("%s: %v, want %v", tn.Name, x, want)
					}
				}
			}
		}
	}
}

// TestAccessOrderShape spells out both orders for two layers: the tied
// head comes back to chunk 0 at the end of the forward; the untied one
// ends the forward with the final chunk and asks for the embedding's
// gradient only for the embedding backward.
func TestAccessOrderShape(t *testing.T) {
	tied := []string{
		"fwd acquire 0", "fwd release 0",
		"fwd acquire 1", "fwd release 1", "fwd acquire 2", "fwd release 2",
		"fwd acquire 3", "fwd release 3",
		"fwd acquire 0", "fwd release 0",
		"bwd acquire 0", "bwd grad 0", "bwd release 0",
		"bwd acquire 3", "bwd grad 3", "bwd release 3", "bwd grad-ready 3",
		"bwd acquire 2", "bwd grad 2", "bwd release 2", "bwd grad-ready 2",
		"bwd acquire 1", "bwd grad 1", "bwd release 1", "bwd grad-ready 1",
		"bwd grad-ready 0",
	}
	untied := []string{
		"fwd acquire 0", "fwd release 0",
		"fwd acquire 1", "fwd release 1", "fwd acquire 2", "fwd release 2",
		"fwd acquire 3", "fwd release 3",
		"bwd acquire 3", "bwd grad 3", "bwd release 3", "bwd grad-ready 3",
		"bwd acquire 2", "bwd grad 2", "bwd release 2", "bwd grad-ready 2",
		"bwd acquire 1", "bwd grad 1", "bwd release 1", "bwd grad-ready 1",
		"bwd grad 0", "bwd grad-ready 0",
	}
	llama, _ := Lookup("tiny-llama")
	tiedLlama := llama
	tiedLlama.TieEmbeddings = true
	for _, c := range []struct {
		shape Shape
		want  []string
	}{{Shape{Layers: 2}, tied}, {tiedLlama, tied}, {llama, untied}} {
		a := AccessOrder(c.shape)
		got := make([]string, len(a))
		for i, x := range a {
			got[i] = x.String()
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("AccessOrder(%s, tied %v):\n%s\nwant\n%s", c.shape.ArchName(), c.shape.TiedHead(), strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}
