package dtype

import (
	"math"
	"testing"
)

func TestViewsShareMemory(t *testing.T) {
	b := make([]byte, 16)
	f := Float32s(b)
	if len(f) != 4 {
		t.Fatalf("len %d", len(f))
	}
	f[1] = 1.5
	if got := math.Float32frombits(uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24); got != 1.5 {
		t.Fatalf("float32 view did not write the bytes: %v", got)
	}
	if u := Uint16s(b); len(u) != 8 || u[3] != 0x3fc0 {
		t.Fatalf("uint16 view: %v", u)
	}
	if len(Int32s(b)) != 4 || len(Float64s(b)) != 2 {
		t.Fatal("lengths")
	}
	if Float32s(nil) != nil || Float64s(b[:7]) != nil || Uint16s(b[:1]) != nil {
		t.Fatal("short inputs must give nil")
	}
}
