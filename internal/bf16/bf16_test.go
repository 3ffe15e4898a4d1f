package bf16

import (
	"math"
	"testing"
)

func TestRoundNearestEven(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1.0 exact
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81}, // above tie
		{0x3f807fff, 0x3f80}, // below tie
		{0x7f7fffff, 0x7f80}, // max float rounds to +Inf
		{0x7f800000, 0x7f80}, // +Inf
		{0xff800000, 0xff80}, // -Inf
		{0x00000001, 0x0000}, // tiny denormal to zero
		{0x80000000, 0x8000}, // -0
	}
	for _, c := range cases {
		if got := FromFloat32(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("FromFloat32(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

func TestNaNStaysNaN(t *testing.T) {
	for _, b := range []uint32{0x7fc00000, 0x7f800001, 0xffffffff, 0x7fffffff, 0x7f80ffff} {
		h := FromFloat32(math.Float32frombits(b))
		if f := ToFloat32(h); !math.IsNaN(float64(f)) {
			t.Errorf("NaN %#08x became %#04x (%v)", b, h, f)
		}
		if h>>15 != uint16(b>>31) {
			t.Errorf("NaN %#08x lost its sign: %#04x", b, h)
		}
	}
}

func TestRoundTripExact(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := ToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := FromFloat32(f); got != uint16(h) {
			t.Fatalf("round trip of %#04x gave %#04x", h, got)
		}
	}
}
