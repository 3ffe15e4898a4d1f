package gpu

import (
	"strings"
	"testing"
)

// TestHostRegistryAdjacentRanges: memory registered as adjacent pieces (a
// pinned pool's arenas) holds a buffer that spans them; a gap does not.
// Split cuts a buffer at the pieces' boundaries.
func TestHostRegistryAdjacentRanges(t *testing.T) {
	mem := make([]byte, 40)
	r := NewHostRegistry()
	for i, piece := range [][]byte{mem[0:10], mem[10:20], mem[30:40]} {
		if err := r.Register(i, piece); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Register(3, mem[15:25]); err == nil || !strings.Contains(err.Error(), "register arena 3: overlaps") {
		t.Fatalf("overlap: %v", err)
	}
	for _, c := range []struct {
		lo, hi int
		in     bool
		pieces []int // lengths
	}{
		{0, 10, true, []int{10}},
		{2, 8, true, []int{6}},
		{5, 15, true, []int{5, 5}},
		{0, 20, true, []int{10, 10}},
		{5, 25, false, []int{5, 10, 5}},
		{15, 35, false, []int{5, 15}},
		{20, 30, false, []int{10}},
		{32, 40, true, []int{8}},
	} {
		b := mem[c.lo:c.hi]
		if got := r.Contains(b); got != c.in {
			t.Errorf("[%d, %d): Contains %v, want %v", c.lo, c.hi, got, c.in)
		}
		var lens []int
		total := 0
		for _, p := range r.Split(b) {
			if &p[0] != &mem[c.lo+total] {
				t.Errorf("[%d, %d): piece at the wrong address", c.lo, c.hi)
			}
			lens = append(lens, len(p))
			total += len(p)
		}
		if total != len(b) || len(lens) != len(c.pieces) {
			t.Errorf("[%d, %d): pieces %v, want %v", c.lo, c.hi, lens, c.pieces)
			continue
		}
		for i := range lens {
			if lens[i] != c.pieces[i] {
				t.Errorf("[%d, %d): pieces %v, want %v", c.lo, c.hi, lens, c.pieces)
			}
		}
	}
	var nilReg *HostRegistry
	if nilReg.Contains(mem) || len(nilReg.Split(mem)) != 1 {
		t.Fatal("a nil registry holds nothing")
	}
}
