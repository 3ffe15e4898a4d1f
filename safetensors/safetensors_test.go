package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
)

// specials are float32 bit patterns a round trip must keep exactly.
var specials = []uint32{0, 0x80000000, 0x3f800000, 0x7f800000, 0xff800000, 0x7fc00001, 0xffbfffff, 0x00000001, 0x7f7fffff, 0x12345678}

func TestSafetensorsRoundTripBitExact(t *testing.T) {
	f32 := make([]float32, 6*5)
	for i := range f32 {
		f32[i] = math.Float32frombits(specials[i%len(specials)] ^ uint32(i*7919))
	}
	b16 := make([]uint16, 3*7)
	for i := range b16 {
		b16[i] = uint16(i*40503) ^ 0x7fc1 // NaN payloads and all
	}
	i32 := []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}
	f64 := make([]byte, 8)
	binary.LittleEndian.PutUint64(f64, math.Float64bits(-math.Pi))
	tensors := []Tensor{
		{Name: "a.weight", DType: dtype.F32, Shape: []int{6, 5}, Data: dtype.Bytes(f32)},
		{Name: "b \"quoted\" ünïcode", DType: dtype.BF16, Shape: []int{3, 7}, Data: dtype.Bytes(b16)},
		{Name: "empty", DType: dtype.F32, Shape: []int{0, 4}, Data: []byte{}},
		{Name: "ids", DType: dtype.I32, Shape: []int{2}, Data: i32},
		{Name: "scalar", DType: dtype.F64, Shape: []int{}, Data: f64},
	}
	md := map[string]string{"format": "pt", "note": "line\nbreak"}
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := WriteFile(path, tensors, md); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(raw)
	if n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	h, data, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Metadata) != 2 || h.Metadata["note"] != "line\nbreak" || h.Metadata["format"] != "pt" {
		t.Errorf("metadata %v", h.Metadata)
	}
	if len(h.Tensors) != len(tensors) {
		t.Fatalf("%d tensors, want %d", len(h.Tensors), len(tensors))
	}
	for i, want := range tensors {
		got := h.Tensors[i] // written in order, so sorted by offset in the same order
		if got.Name != want.Name || got.DType != DTypeName(want.DType) || !got.HasShape(want.Shape) {
			t.Errorf("tensor %d: %+v, want %s %v %v", i, got, want.Name, want.DType, want.Shape)
		}
		if !bytes.Equal(data[want.Name], want.Data) {
			t.Errorf("tensor %q: bytes differ", want.Name)
		}
	}
	back := dtype.Float32s(data["a.weight"])
	for i := range f32 {
		if math.Float32bits(back[i]) != math.Float32bits(f32[i]) {
			t.Fatalf("f32 %d: %#x, want %#x", i, math.Float32bits(back[i]), math.Float32bits(f32[i]))
		}
	}
	if got := dtype.Uint16s(data[tensors[1].Name]); !equalU16(got, b16) {
		t.Errorf("bf16 values differ")
	}
}

func equalU16(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// fileFrom builds a safetensors file by hand: the header string as given,
// its length in 8 bytes little-endian, then data.
func fileFrom(header string, data []byte) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

// TestReadHandCrafted reads a file built from the specification alone, as
// another implementation (the Python safetensors package) lays it out:
// keys not in offset order, whitespace in the JSON, padding, a scalar.
func TestReadHandCrafted(t *testing.T) {
	hdr := `{"b": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]},` +
		` "__metadata__": {"format": "pt"},` +
		` "a": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}, "s": {"dtype":"I32","shape":[],"data_offsets":[12,16]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	var data []byte
	data = binary.LittleEndian.AppendUint32(data, math.Float32bits(1.5))
	data = binary.LittleEndian.AppendUint32(data, math.Float32bits(-2))
	data = binary.LittleEndian.AppendUint16(data, 0x3f80) // 1.0
	data = binary.LittleEndian.AppendUint16(data, 0xc040) // -3.0
	data = binary.LittleEndian.AppendUint32(data, 42)
	h, tensors, err := Parse(fileFrom(hdr, data))
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata["format"] != "pt" {
		t.Errorf("metadata %v", h.Metadata)
	}
	var names []string
	for _, ti := range h.Tensors {
		names = append(names, ti.Name)
	}
	if strings.Join(names, ",") != "a,b,s" {
		t.Errorf("tensors in offset order: %v", names)
	}
	if got := dtype.Float32s(tensors["a"]); got[0] != 1.5 || got[1] != -2 {
		t.Errorf("a = %v", got)
	}
	if got := dtype.Uint16s(tensors["b"]); got[0] != 0x3f80 || got[1] != 0xc040 {
		t.Errorf("b = %#x", got)
	}
	if s, _ := h.Tensor("s"); len(s.Shape) != 0 || s.Elems() != 1 || binary.LittleEndian.Uint32(tensors["s"]) != 42 {
		t.Errorf("scalar s: %+v", s)
	}
	// Our writer produces exactly the compact form of the same file.
	mine, err := EncodeHeader([]Tensor{
		{Name: "a", DType: dtype.F32, Shape: []int{1, 2}, Data: data[:8]},
		{Name: "b", DType: dtype.BF16, Shape: []int{2}, Data: data[8:12]},
	}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}}`
	if got := strings.TrimRight(string(mine[8:]), " "); got != want {
		t.Errorf("header\n got %s\nwant %s", got, want)
	}
}

func TestReadMalformed(t *testing.T) {
	good := fileFrom(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8))
	hugeLen := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(hugeLen, 1<<40)
	pastEnd := append([]byte(nil), good...)
	binary.LittleEndian.PutUint64(pastEnd, uint64(len(good)))
	cases := []struct {
		name string
		file []byte
		want string // in the error
	}{
		{"empty file", nil, "shorter than the 8-byte"},
		{"truncated length", good[:5], "shorter than the 8-byte"},
		{"header length beyond limit", hugeLen, "exceeds the limit"},
		{"header length beyond file", pastEnd, "runs past the end of the file"},
		{"truncated data", good[:len(good)-3], `tensor "a" at [0, 8) runs past the end of the data (5 bytes`},
		{"trailing bytes", append(append([]byte(nil), good...), 0), "trailing bytes"},
		{"not an object", fileFrom(`[1,2]`, nil), "does not start with '{'"},
		{"bad json", fileFrom(`{"a":{"dtype":"F32",`, nil), "tensor \"a\""},
		{"junk after object", fileFrom(`{} x`, nil), "only space padding"},
		{"overlap", fileFrom(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), `tensor "b" at [4, 8) overlaps "a" at [0, 8)`},
		{"gap", fileFrom(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), "gap: bytes [0, 4)"},
		{"unknown dtype", fileFrom(`{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, make([]byte, 16)), `tensor "a" has unknown dtype "F128"`},
		{"shape bytes mismatch", fileFrom(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), `tensor "a": shape [3] of F32 is 12 bytes but data_offsets [0, 8) hold 8`},
		{"shape overflow", fileFrom(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, make([]byte, 8)), "overflows"},
		{"negative dim", fileFrom(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}`, make([]byte, 8)), `tensor "a"`},
		{"reversed offsets", fileFrom(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, make([]byte, 8)), "are invalid"},
		{"three offsets", fileFrom(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, make([]byte, 8)), "has 3 values"},
		{"missing field", fileFrom(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, make([]byte, 8)), "lacks dtype, shape or data_offsets"},
		{"duplicate name", fileFrom(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), `"a" appears twice`},
		{"metadata not strings", fileFrom(`{"__metadata__":{"n":1}}`, nil), "__metadata__ is not a map of strings"},
		{"invalid utf-8", fileFrom("{\"\xff\":1}", nil), "not valid UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Parse(c.file)
			if err == nil {
				t.Fatalf("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if c.name != "truncated length" && c.name != "empty file" && !errors.Is(err, ErrFormat) {
				t.Errorf("error %q is not ErrFormat", err)
			}
			t.Log(err)
		})
	}
	if _, _, err := Parse(good); err != nil {
		t.Errorf("the good file: %v", err)
	}
}

func TestWriteRejectsBadTensors(t *testing.T) {
	bad := [][]Tensor{
		{{Name: "a", DType: dtype.F32, Shape: []int{3}, Data: make([]byte, 8)}},
		{{Name: "", DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)}},
		{{Name: MetadataKey, DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)}},
		{{Name: "a", DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)}, {Name: "a", DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)}},
	}
	for i, ts := range bad {
		if _, err := Write(&bytes.Buffer{}, ts, nil); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
}

func FuzzReadHeader(f *testing.F) {
	f.Add(fileFrom(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(fileFrom(`{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}}    `, make([]byte, 4)))
	f.Add(fileFrom(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)))
	f.Add(fileFrom(`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, make([]byte, 2)))
	f.Add(fileFrom(`{}`, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	hdr, _ := EncodeHeader([]Tensor{{Name: "x", DType: dtype.F64, Shape: []int{1}, Data: make([]byte, 8)}}, map[string]string{"k": "v"})
	f.Add(append(hdr, make([]byte, 8)...))
	f.Fuzz(func(t *testing.T, file []byte) {
		h, err := ReadHeader(bytes.NewReader(file), int64(len(file)))
		if err != nil {
			return
		}
		// A header that validates describes the file exactly.
		var pos int64
		for _, ti := range h.Tensors {
			if ti.Begin != pos || ti.End < ti.Begin {
				t.Fatalf("tensor %q at [%d, %d), expected to start at %d", ti.Name, ti.Begin, ti.End, pos)
			}
			pos = ti.End
		}
		if h.DataStart()+pos != int64(len(file)) {
			t.Fatalf("tensors end at %d, file is %d bytes", h.DataStart()+pos, len(file))
		}
		if _, _, err := Parse(file); err != nil {
			t.Fatalf("Parse after ReadHeader: %v", err)
		}
	})
}
