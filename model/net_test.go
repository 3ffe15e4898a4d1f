package model

import (
	"strings"
	"testing"
)

// TestCustomLayout: CustomLayout packs each chunk's tensors densely, in
// order, from offset 0, and refuses what a trainer could not lay out.
func TestCustomLayout(t *testing.T) {
	l, err := CustomLayout("mlp", []Chunk{
		{Name: "in", Tensors: []Tensor{{Name: "w1", Shape: []int{4, 3}}, {Name: "b1", Shape: []int{4}}}},
		{Name: "out", Tensors: []Tensor{{Name: "w2", Shape: []int{2, 4}, Offset: 99, Len: 1}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Custom() || l.Name != "mlp" || l.ParamCount() != 24 {
		t.Fatalf("layout %+v", l)
	}
	b1, _ := l.Chunks[0].Tensor("b1")
	w2, _ := l.Chunks[1].Tensor("w2")
	if l.Chunks[0].Len != 16 || b1.Offset != 12 || b1.Len != 4 || l.Chunks[1].Index != 1 || w2.Offset != 0 || w2.Len != 8 {
		t.Errorf("chunks %+v", l.Chunks)
	}
	if s, _ := Lookup("tiny"); mustLayout(t, s).Custom() {
		t.Error("a decoder's layout says it is custom")
	}
	for _, tc := range []struct {
		name   string
		chunks []Chunk
		want   string
	}{
		{"", []Chunk{{Name: "a", Tensors: []Tensor{{Name: "x", Shape: []int{1}}}}}, "needs a name"},
		{"m", nil, "has no chunks"},
		{"m", []Chunk{{Tensors: []Tensor{{Name: "x", Shape: []int{1}}}}}, "has no name"},
		{"m", []Chunk{{Name: "a"}}, "has no tensors"},
		{"m", []Chunk{{Name: "a", Tensors: []Tensor{{Name: "x", Shape: []int{2, 0}}}}}, "every dimension must be >= 1"},
		{"m", []Chunk{{Name: "a", Tensors: []Tensor{{Name: "x"}}}}, "has no shape"},
		{"m", []Chunk{{Name: "a", Tensors: []Tensor{{Shape: []int{1}}}}}, "a tensor has no name"},
		{"m", []Chunk{{Name: "a", Tensors: []Tensor{{Name: "x", Shape: []int{1}}}}, {Name: "b", Tensors: []Tensor{{Name: "x", Shape: []int{1}}}}}, `tensor name "x" is also chunk 0's`},
	} {
		if _, err := CustomLayout(tc.name, tc.chunks); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %+v: got %v, want an error containing %q", tc.name, tc.chunks, err, tc.want)
		}
	}
	l.Chunks[0].Tensors[1].Offset = 13
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "want offset 12 (densely packed)") {
		t.Errorf("a gap between tensors: %v", err)
	}
	l.Chunks[0].Tensors[1].Offset, l.Chunks[0].Len = 12, 17
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "has length 17, its tensors 16") {
		t.Errorf("a chunk longer than its tensors: %v", err)
	}
}

// TestDecoderLayoutsValidate: every named shape's layout keeps the rules
// of Layout.Validate (the engine checks every model's layout with it).
func TestDecoderLayoutsValidate(t *testing.T) {
	for _, n := range Names() {
		s, _ := Lookup(n)
		if err := mustLayout(t, s).Validate(); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// TestStackOrder writes out the order of a stack of two chunks.
func TestStackOrder(t *testing.T) {
	var got []string
	for _, a := range StackOrder(2) {
		got = append(got, a.String())
	}
	want := "fwd acquire 0,fwd release 0,fwd acquire 1,fwd release 1," +
		"bwd acquire 1,bwd grad 1,bwd release 1,bwd grad-ready 1,bwd acquire 0,bwd grad 0,bwd release 0,bwd grad-ready 0"
	if strings.Join(got, ",") != want {
		t.Errorf("StackOrder(2) = %s\nwant %s", strings.Join(got, ","), want)
	}
}

func mustLayout(t testing.TB, s Shape) *Layout {
	t.Helper()
	l, err := NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
