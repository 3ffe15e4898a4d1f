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

func TestBytesSharesMemory(t *testing.T) {
	f := []float32{1.5, -2}
	b := Bytes(f)
	if len(b) != 8 || b[3] != 0x3f || b[2] != 0xc0 {
		t.Fatalf("bytes of float32s: % x", b)
	}
	b[7] = 0x40
	if f[1] != 2 {
		t.Fatalf("the view did not write the floats: %v", f[1])
	}
	if u := Bytes([]uint16{0x3f80}); len(u) != 2 || u[1] != 0x3f {
		t.Fatalf("bytes of uint16s: % x", u)
	}
	if Bytes([]float64(nil)) != nil {
		t.Fatal("an empty slice must give nil")
	}
}
