package safetensors

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzParseHeader: the JSON header alone (FuzzReadHeader reaches it through
// a whole file), against any data size, seeded with the headers of
// TestReadMalformed. It returns a header or an ErrFormat, never panics,
// gives the same answer twice, and a header it accepts tiles [0, dataBytes)
// with its tensors, each as many bytes as its shape and dtype say.
func FuzzParseHeader(f *testing.F) {
	for _, s := range []struct {
		hdr  string
		data int64
	}{
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8},
		{`{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}}    `, 4},
		{`{"b":{"dtype":"F16","shape":[],"data_offsets":[2,4]}, "a" : {"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 4},
		{`[1,2]`, 0}, {`{"a":{"dtype":"F32",`, 0}, {`{} x`, 0}, {`{}`, 0}, {`{}`, -1},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8},
		{`{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, 16},
		{`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}`, 8},
		{`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, 8},
		{`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8},
		{`{"__metadata__":{"n":1}}`, 0}, {"{\"\xff\":1}", 0},
		{`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2},
		{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}}`, 8},
	} {
		f.Add([]byte(s.hdr), s.data)
	}
	f.Fuzz(func(t *testing.T, hdr []byte, dataBytes int64) {
		h, err := ParseHeader(hdr, dataBytes)
		h2, err2 := ParseHeader(hdr, dataBytes)
		if err != nil {
			if h != nil || !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v (ErrFormat: %v) with a header %v", err, errors.Is(err, ErrFormat), h)
			}
			if err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("parsed twice: %v, then %v", err, err2)
			}
			return
		}
		if err2 != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("parsed twice: %+v, then %+v, %v", h, h2, err2)
		}
		var pos int64
		for _, ti := range h.Tensors {
			if ti.Begin != pos || ti.End < ti.Begin {
				t.Fatalf("tensor %q at [%d, %d), expected to start at %d", ti.Name, ti.Begin, ti.End, pos)
			}
			pos = ti.End
		}
		if pos != dataBytes || h.HeaderBytes != int64(len(hdr)) {
			t.Fatalf("tensors end at %d of %d data bytes; header %d of %d bytes", pos, dataBytes, h.HeaderBytes, len(hdr))
		}
	})
}

// TestParseHeaderNegativeData: FuzzParseHeader's first find (seed {} with
// dataBytes -1) indexed the tensors at -1; a negative size is ErrFormat.
func TestParseHeaderNegativeData(t *testing.T) {
	for _, hdr := range []string{`{}`, `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`} {
		if _, err := ParseHeader([]byte(hdr), -1); !errors.Is(err, ErrFormat) {
			t.Errorf("%s over -1 bytes: %v, want ErrFormat", hdr, err)
		}
	}
}
