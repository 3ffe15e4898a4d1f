package dtype

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCodecTable: every codec's size is DType.Bytes, its name DType's
// String, its block decoding Dequantize's bits; a dtype with no codec is
// refused by CodecOf, never handed another format's codec.
func TestCodecTable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range Codecs {
		if got, err := CodecOf(c.DType); err != nil || got.Name != c.Name {
			t.Errorf("CodecOf(%s): %v, %v", c.DType, got, err)
		}
		if c.Name != c.DType.String() {
			t.Errorf("codec %s: DType's String is %s", c.Name, c.DType)
		}
		if named, ok := CodecNamed(c.Name); !ok || named.DType != c.DType {
			t.Errorf("CodecNamed(%q): %v %v", c.Name, named, ok)
		}
		for _, n := range []int{1, 63, 64, 65, 200, 1000} {
			if c.Bytes(n) != c.DType.Bytes(n) {
				t.Errorf("%s n %d: codec %d bytes, DType %d", c.Name, n, c.Bytes(n), c.DType.Bytes(n))
			}
			src := make([]float32, n)
			for i := range src {
				src[i] = float32(r.NormFloat64())
			}
			q := make([]byte, c.Bytes(n))
			c.Quantize(q, src)
			want := make([]float32, n)
			c.Dequantize(want, q)
			blocks := c.Blocks(n)
			for lo := 0; lo < blocks; lo++ {
				hi := min(blocks, lo+1+lo%3)
				got := make([]float32, min(hi*c.BlockSize, n)-lo*c.BlockSize)
				c.DequantizeBlocks(got, q, n, lo, hi)
				if !slices.Equal(got, want[lo*c.BlockSize:lo*c.BlockSize+len(got)]) {
					t.Fatalf("%s n %d: blocks [%d, %d) differ from Dequantize", c.Name, n, lo, hi)
				}
			}
		}
	}
	for _, d := range []DType{F32, BF16, F16, I32, F64, U8, Q8, Rem16, DType(200)} {
		if c, err := CodecOf(d); err == nil {
			t.Errorf("CodecOf(%s) = %s, want an error", d, c.Name)
		}
		if d.Coded() {
			t.Errorf("%s is Coded", d)
		}
	}
	if _, ok := CodecNamed("bf16"); ok {
		t.Error(`CodecNamed("bf16") found a codec`)
	}
}
