package nf4

import (
	"math"
	"testing"
)

// TestPublishedTree: Code is bitsandbytes' dQuantizeNF4 on its pivots (a
// value at one takes the lower code, the next float up the higher), and
// each of Values codes as itself.
func TestPublishedTree(t *testing.T) {
	for i, th := range thresholds {
		if Code(th) != byte(i) || Code(math.Nextafter32(th, 2)) != byte(i+1) {
			t.Errorf("pivot %d (%v): codes %d and %d, want %d and %d", i, th, Code(th), Code(math.Nextafter32(th, 2)), i, i+1)
		}
		if mid := (Values[i] + Values[i+1]) / 2; math.Abs(float64(mid-th)) > 1e-6 {
			t.Errorf("pivot %d is %v, not the midpoint %v of the values around it", i, th, mid)
		}
	}
	for c, v := range Values {
		if Code(v) != byte(c) {
			t.Errorf("value %v codes as %d, want %d", v, Code(v), c)
		}
	}
}

// TestFixedVectors: a block of known values quantizes to the codes and
// scale bitsandbytes gives them (computed by hand from its tree: x·(1/absmax)
// against the pivots), packs two per byte high nibble first, and decodes to
// Values·absmax; a shorter last block keeps its own absmax; a block of
// zeros decodes to zeros (−0).
func TestFixedVectors(t *testing.T) {
	src := make([]float32, 64+3)
	src[0], src[1], src[2], src[3], src[4] = 2, -2, 1, -0.5, 0.08 // ·½: 1, −1, 0.5, −0.25, 0.04
	src[64], src[65], src[66] = 0, 0, 0
	dst := make([]byte, Bytes(len(src)))
	if len(dst) != 4*2+34 {
		t.Fatalf("Bytes(67) = %d, want 2 scales and 34 bytes of codes", len(dst))
	}
	Quantize(dst, src)
	if math.Float32frombits(uint32(dst[0])|uint32(dst[1])<<8|uint32(dst[2])<<16|uint32(dst[3])<<24) != 2 {
		t.Fatalf("first absmax: % x", dst[:4])
	}
	codes := dst[8:]
	// 1 → 15, −1 → 0, 0.5 → 12 (0.3893 < 0.5 <= 0.5017), −0.25 → 4 (−0.3397 < −0.25 <= −0.2346),
	// 0.04 → 8 (0.0398 < 0.04), 0 → 7 (the rest of the block).
	want := []byte{15<<4 | 0, 12<<4 | 4, 8<<4 | 7}
	for i, w := range want {
		if codes[i] != w {
			t.Errorf("code byte %d: %#x, want %#x", i, codes[i], w)
		}
	}
	out := make([]float32, len(src))
	Dequantize(out, dst)
	for i, w := range []float32{2, -2, Values[12] * 2, Values[4] * 2, Values[8] * 2, 0} {
		if out[i] != w {
			t.Errorf("value %d decodes to %v, want %v", i, out[i], w)
		}
	}
	for i := 64; i < 67; i++ {
		if out[i] != 0 || !math.Signbit(float64(out[i])) {
			t.Errorf("a zero block's value %d decodes to %v, want -0 (code 0 times absmax 0)", i, out[i])
		}
	}
}

// TestRoundTripIdempotent: quantizing what Dequantize gave gives the same
// bytes (the absmax element decodes to ±absmax exactly, so the scale and
// every code come back), which is what a checkpoint of a frozen NF4 base
// relies on when it stores the dequantized values.
func TestRoundTripIdempotent(t *testing.T) {
	src := make([]float32, 1000)
	for i := range src {
		src[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%7)
	}
	q := make([]byte, Bytes(len(src)))
	Quantize(q, src)
	d := make([]float32, len(src))
	Dequantize(d, q)
	q2 := make([]byte, len(q))
	Quantize(q2, d)
	for i := range q {
		if q[i] != q2[i] {
			t.Fatalf("byte %d: %#x, then %#x", i, q[i], q2[i])
		}
	}
}

// TestCodeBisects: Code's bisection gives the linear count of thresholds
// below x at every threshold, its neighbours in float32, ±1, ±Inf, NaN
// and a million values spread over [-1.2, 1.2].
func TestCodeBisects(t *testing.T) {
	linear := func(x float32) byte {
		c := byte(0)
		for _, th := range thresholds {
			if x > th {
				c++
			}
		}
		return c
	}
	xs := []float32{-1, 1, 0, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for _, th := range thresholds {
		xs = append(xs, th, math.Nextafter32(th, -2), math.Nextafter32(th, 2))
	}
	for i := range 1_000_000 {
		xs = append(xs, -1.2+2.4*float32(i)/1e6)
	}
	for _, x := range xs {
		if got, want := Code(x), linear(x); got != want {
			t.Fatalf("Code(%v) = %d, the linear count %d", x, got, want)
		}
	}
}
