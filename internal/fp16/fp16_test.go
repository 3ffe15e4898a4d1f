package fp16

import (
	"bytes"
	"encoding/binary"
	"math"
	"os/exec"
	"testing"
)

// TestAgainstNumpy compares FromFloat32 with numpy's float32 → float16
// cast (round to nearest even) on every binary16 value, every midpoint
// between neighbours and the float32 on either side of it, the overflow
// and underflow edges and a million random bit patterns.
func TestAgainstNumpy(t *testing.T) {
	var stderr bytes.Buffer
	cmd := exec.Command("/usr/bin/python3", "testdata/boundaries.py")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("testdata/boundaries.py (Debian's python3-numpy, which .ci/run installs): %v\n%s", err, stderr.String())
	}
	n := len(out) / 8
	if n < 1<<20 {
		t.Fatalf("numpy gave %d cases", n)
	}
	bad := 0
	for i := range n {
		in := binary.LittleEndian.Uint32(out[8*i:])
		want := uint16(binary.LittleEndian.Uint32(out[8*i+4:]))
		if got := FromFloat32(math.Float32frombits(in)); got != want {
			if bad++; bad <= 10 {
				t.Errorf("FromFloat32(%#08x = %g) = %#04x, numpy %#04x", in, math.Float32frombits(in), got, want)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d conversions differ from numpy", bad, n)
	}
}

func TestEdges(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3c00},
		{Max, 0x7bff},
		{65519.99, 0x7bff},                      // under the midpoint to 2^16: stays finite
		{65520, 0x7c00},                         // the midpoint: ties to even, which is +Inf
		{float32(math.Inf(-1)), 0xfc00},         //
		{float32(math.Ldexp(1, -24)), 0x0001},   // the smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},   // half of it: ties to even, zero
		{float32(math.Ldexp(1.5, -25)), 0x0001}, // above the tie
		{float32(math.Copysign(0, -1)), 0x8000}, //
	}
	for _, c := range cases {
		if got := FromFloat32(c.in); got != c.want {
			t.Errorf("FromFloat32(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	for _, b := range []uint32{0x7fc00000, 0x7f800001, 0xffffffff} {
		if f := Round(math.Float32frombits(b)); !math.IsNaN(float64(f)) {
			t.Errorf("NaN %#08x became %v", b, f)
		}
	}
	for h := range 1 << 16 {
		f := ToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := FromFloat32(f); got != uint16(h) {
			t.Fatalf("round trip of %#04x gave %#04x", h, got)
		}
	}
}
