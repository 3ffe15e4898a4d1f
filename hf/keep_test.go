package hf

import (
	"math/rand/v2"
	"testing"

	"github.com/strata-ai/strata/dtype"
)

// TestEncodeF16: a tensor kept in F16 (a merged export of an fp16 base,
// DirOptions.KeepDTypes) is each value rounded to nearest even, in the
// file's layout (GPT-2's Conv1D transposed), from fp32 or bf16 chunks.
func TestEncodeF16(t *testing.T) {
	l := tinyLayout(t)
	rng := rand.New(rand.NewPCG(3, 4))
	transposed := 0
	for _, ft := range fileTensors(l, NamesHF) {
		v := make([]float32, l.Chunks[ft.chunk].Len)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		b16 := make([]uint16, len(v))
		dtype.Narrow(dtype.BF16, b16, v)
		wide := make([]float32, len(v))
		dtype.Widen(dtype.BF16, wide, b16)
		for _, src := range []struct {
			data chunkData
			vals []float32
		}{{chunkOf(v), v}, {chunkOf(b16), wide}} {
			out := make([]byte, ft.t.Len*2)
			encodeTensor(out, dtype.F16, src.data, ft)
			want := make([]uint16, ft.t.Len)
			rows, cols := 1, ft.t.Len
			if ft.transposed {
				rows, cols = ft.t.Shape[0], ft.t.Shape[1]
			}
			for r := range rows {
				for c := range cols {
					at := r*cols + c
					if ft.transposed {
						at = c*rows + r
					}
					dtype.Narrow(dtype.F16, want[at:at+1], src.vals[ft.t.Offset+r*cols+c:][:1])
				}
			}
			got := dtype.Uint16s(out)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s (transposed %t): element %d is %#04x, want %#04x", ft.name, ft.transposed, i, got[i], want[i])
				}
			}
		}
		if ft.transposed {
			transposed++
		}
	}
	if transposed == 0 {
		t.Error("no transposed tensor checked")
	}
}
