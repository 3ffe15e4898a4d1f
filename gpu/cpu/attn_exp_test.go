package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAttnExp: attnExp within 4e-15 relative of math.Exp over the
// softmax's range and the edges, and its fp32 rounding math.Exp's rounded
// but for at most one in 10⁵ values (each off by one ULP).
func TestAttnExp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	xs := []float64{0, -0.0, 1, -1, 0.5 * math.Ln2, -0.5 * math.Ln2, -87.3, -103.9, -104, -110, -708, -744, -745, -746, 88.7, 709, 710, math.Inf(-1), math.Inf(1)}
	for range 1000000 {
		xs = append(xs, -120*r.Float64()+5)
	}
	var off32 int
	for _, x := range xs {
		got, want := attnExp(x), math.Exp(x)
		if want == 0 || math.IsInf(want, 0) || want < 0x1p-1022 {
			if math.Abs(got-want) > 0x1p-1070 && !(math.IsInf(want, 1) && math.IsInf(got, 1)) {
				t.Errorf("attnExp(%g) = %g, math.Exp %g", x, got, want)
			}
			continue
		}
		if math.Abs(got-want) > 4e-15*want {
			t.Errorf("attnExp(%g) = %.17g, math.Exp %.17g: relative %g", x, got, want, math.Abs(got-want)/want)
		}
		if g, w := float32(got), float32(want); g != w {
			off32++
			if d := math.Float32bits(g) - math.Float32bits(w); d != 1 && d != math.MaxUint32 {
				t.Errorf("fp32 attnExp(%g) = %g, math.Exp %g: more than one ULP", x, g, w)
			}
		}
	}
	if !math.IsNaN(attnExp(math.NaN())) {
		t.Error("attnExp(NaN) is not NaN")
	}
	if off32*100000 > len(xs) {
		t.Errorf("%d of %d fp32 results differ from math.Exp's", off32, len(xs))
	}
	t.Logf("%d of %d fp32 results differ from math.Exp's by one ULP", off32, len(xs))
}

func BenchmarkAttnExp(b *testing.B) {
	row := make([]float32, 128)
	for i := range row {
		row[i] = -float32(i) / 16
	}
	b.Run("attnExp", func(b *testing.B) {
		for range b.N {
			var s float64
			for _, x := range row {
				s += float64(float32(attnExp(float64(x) - 0.25)))
			}
			_ = s
		}
	})
	b.Run("math.Exp", func(b *testing.B) {
		for range b.N {
			var s float64
			for _, x := range row {
				s += float64(float32(math.Exp(float64(x) - 0.25)))
			}
			_ = s
		}
	})
}
