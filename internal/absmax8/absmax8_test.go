package absmax8

import (
	"math"
	"testing"
)

// TestFixedVectors: a block's largest magnitude codes as ±127, the others
// as x/(absmax/127) rounded to nearest even, the codes after the steps;
// decoding gives code·step; a zero block codes and decodes to 0.
func TestFixedVectors(t *testing.T) {
	src := make([]float32, 64+2)
	f := float32(2) / 127
	src[0], src[1], src[2], src[3] = 2, -2, 63.5*f, 0.5*f // 127, -127, 63.5 → 64 (even), 0.5 → 0
	q := make([]byte, Bytes(len(src)))
	if len(q) != 8+66 {
		t.Fatalf("Bytes(66) = %d", len(q))
	}
	Quantize(q, src)
	if got := math.Float32frombits(uint32(q[0]) | uint32(q[1])<<8 | uint32(q[2])<<16 | uint32(q[3])<<24); got != f {
		t.Fatalf("step %v, want %v", got, f)
	}
	codes := q[8:]
	for i, w := range []int8{127, -127, 64, 0, 0} {
		if int8(codes[i]) != w {
			t.Errorf("code %d: %d, want %d", i, int8(codes[i]), w)
		}
	}
	out := make([]float32, len(src))
	Dequantize(out, q)
	for i, w := range []float32{127 * f, -127 * f, 64 * f, 0} {
		if out[i] != w {
			t.Errorf("value %d: %v, want %v", i, out[i], w)
		}
	}
	if out[64] != 0 || out[65] != 0 || codes[64] != 0 {
		t.Errorf("the zero block: %v, %v", out[64], out[65])
	}
}

// TestRoundTripIdempotent: quantizing the decoded values gives the same
// bytes; the step's round trip holds for every mantissa.
func TestRoundTripIdempotent(t *testing.T) {
	src := make([]float32, 100000)
	for i := range src {
		src[i] = float32(math.Sin(float64(i)*0.37)) * float32(1+i%7) * float32(math.Exp(float64(i%13-6)))
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
	for m := uint32(0); m < 1<<23; m += 7 {
		a := math.Float32frombits(0x3f800000 | m)
		f := a / 127
		if (f*127)/127 != f {
			t.Fatalf("absmax %v: step %v does not come back", a, f)
		}
	}
}
