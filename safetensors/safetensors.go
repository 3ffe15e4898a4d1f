package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/durable"
)

// The safetensors format (github.com/huggingface/safetensors):
//
//	8 bytes   N, the header length, unsigned little-endian
//	N bytes   a UTF-8 JSON object starting with '{', optionally padded with
//	          spaces: {"__metadata__": {"k": "v", ...},
//	                   "name": {"dtype": "F32", "shape": [2, 3],
//	                            "data_offsets": [begin, end]}, ...}
//	rest      the byte buffer; [begin, end) of a tensor is relative to its
//	          start, little-endian, row-major
//
// The tensors, sorted by begin, cover the byte buffer exactly: the first
// starts at 0, each starts where the previous ends, the last ends at the end
// of the file; no gaps, no overlaps. end-begin equals the element count times
// the dtype's size. Names are unique.

// MaxHeaderBytes bounds the JSON header, as the reference implementation
// does (100 MB): a hostile length never makes us allocate more.
const MaxHeaderBytes = 100_000_000

// MetadataKey is the reserved header key of the string-to-string metadata.
const MetadataKey = "__metadata__"

// dtypeBits are the element widths of the dtypes the format defines.
var dtypeBits = map[string]int{
	"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
	"I16": 16, "U16": 16, "F16": 16, "BF16": 16,
	"I32": 32, "U32": 32, "F32": 32,
	"I64": 64, "U64": 64, "F64": 64,
	"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

// DTypeName is the safetensors name of d: "F32", "BF16", "F16", "I32",
// "F64" or "U8".
func DTypeName(d dtype.DType) string {
	switch d {
	case dtype.F32:
		return "F32"
	case dtype.BF16:
		return "BF16"
	case dtype.F16:
		return "F16"
	case dtype.I32:
		return "I32"
	case dtype.F64:
		return "F64"
	case dtype.U8:
		return "U8"
	}
	panic(fmt.Sprintf("safetensors: dtype %v has no safetensors name", d))
}

// ParseDTypeName maps a safetensors dtype name to Strata's dtype; false for
// the dtypes Strata does not compute in (I64, F8_E4M3, ...).
func ParseDTypeName(s string) (dtype.DType, bool) {
	switch s {
	case "F32":
		return dtype.F32, true
	case "BF16":
		return dtype.BF16, true
	case "F16":
		return dtype.F16, true
	case "I32":
		return dtype.I32, true
	case "F64":
		return dtype.F64, true
	}
	return 0, false
}

// TensorInfo is one tensor of a safetensors header.
type TensorInfo struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"` // as in the file: "F32", "BF16", "F16", ...
	Shape []int64 `json:"shape"`
	Begin int64   `json:"begin"` // data_offsets, relative to the byte buffer
	End   int64   `json:"end"`
}

// Elems is the element count: the product of Shape (1 for a scalar).
func (t TensorInfo) Elems() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// HasShape says whether t's shape is shape.
func (t TensorInfo) HasShape(shape []int) bool {
	if len(t.Shape) != len(shape) {
		return false
	}
	for i := range shape {
		if t.Shape[i] != int64(shape[i]) {
			return false
		}
	}
	return true
}

// SizeBytes is End - Begin.
func (t TensorInfo) SizeBytes() int64 { return t.End - t.Begin }

// Header is a validated safetensors header.
type Header struct {
	Metadata    map[string]string
	Tensors     []TensorInfo // sorted by Begin (the order of the bytes)
	HeaderBytes int64        // N: the JSON header with its padding
	DataBytes   int64        // the byte buffer
}

// DataStart is the file offset of the byte buffer: 8 + N.
func (h *Header) DataStart() int64 { return 8 + h.HeaderBytes }

// Tensor returns the tensor called name, or false.
func (h *Header) Tensor(name string) (TensorInfo, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// ErrFormat is matched (errors.Is) by every error about a malformed
// safetensors file.
var ErrFormat = errors.New("malformed safetensors")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// ReadHeader reads and validates the header of a safetensors file of
// sizeBytes bytes. It reads only the header; every offset is checked against
// sizeBytes, so a hostile file gives an error, never a panic or an
// allocation larger than the file.
func ReadHeader(r io.ReaderAt, sizeBytes int64) (*Header, error) {
	if sizeBytes < 8 {
		return nil, formatErr("file of %d bytes is shorter than the 8-byte header length", sizeBytes)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > MaxHeaderBytes {
		return nil, formatErr("header length %d exceeds the limit of %d bytes", n, MaxHeaderBytes)
	}
	if n > uint64(sizeBytes-8) {
		return nil, formatErr("header length %d runs past the end of the file (%d bytes after the length)", n, sizeBytes-8)
	}
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, 8); err != nil {
		return nil, fmt.Errorf("read header of %d bytes: %w", n, err)
	}
	return ParseHeader(buf, sizeBytes-8-int64(n))
}

type rawTensor struct {
	DType       *string   `json:"dtype"`
	Shape       *[]uint64 `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

// ParseHeader validates the JSON header hdr (without the 8-byte length)
// against a byte buffer of dataBytes bytes.
func ParseHeader(hdr []byte, dataBytes int64) (*Header, error) {
	h := &Header{HeaderBytes: int64(len(hdr)), DataBytes: dataBytes}
	if dataBytes < 0 {
		return nil, formatErr("data of %d bytes: a buffer cannot be shorter than nothing", dataBytes)
	}
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, formatErr("header does not start with '{'")
	}
	if !utf8.Valid(hdr) {
		return nil, formatErr("header is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // '{'
		return nil, formatErr("header is not a JSON object: %v", err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, formatErr("header JSON: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, formatErr("header JSON: key %v is not a string", tok)
		}
		if seen[name] {
			return nil, formatErr("tensor %q appears twice in the header", name)
		}
		seen[name] = true
		if name == MetadataKey {
			var md map[string]string
			if err := dec.Decode(&md); err != nil {
				return nil, formatErr("%s is not a map of strings to strings: %v", MetadataKey, err)
			}
			h.Metadata = md
			continue
		}
		var rt rawTensor
		if err := dec.Decode(&rt); err != nil {
			return nil, formatErr("tensor %q: %v", name, err)
		}
		t, err := checkTensor(name, rt)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, formatErr("header JSON: %v", err)
	}
	// Only padding may follow the object.
	rest := hdr[dec.InputOffset():]
	for i, c := range rest {
		if c != ' ' {
			return nil, formatErr("header has byte %#02x after the JSON object at offset %d (only space padding is allowed)", c, dec.InputOffset()+int64(i))
		}
	}
	sort.SliceStable(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	var pos int64
	for i, t := range h.Tensors {
		switch {
		case t.Begin > pos:
			return nil, formatErr("gap: bytes [%d, %d) of the buffer belong to no tensor (next is %q at [%d, %d))", pos, t.Begin, t.Name, t.Begin, t.End)
		case t.Begin < pos:
			prev := h.Tensors[i-1]
			return nil, formatErr("tensor %q at [%d, %d) overlaps %q at [%d, %d)", t.Name, t.Begin, t.End, prev.Name, prev.Begin, prev.End)
		}
		pos = t.End
	}
	if pos != dataBytes {
		if pos > dataBytes {
			last := h.Tensors[len(h.Tensors)-1]
			return nil, formatErr("tensor %q at [%d, %d) runs past the end of the data (%d bytes; file truncated?)", last.Name, last.Begin, last.End, dataBytes)
		}
		return nil, formatErr("the tensors end at byte %d of the data but the file holds %d bytes after the header (trailing bytes)", pos, dataBytes)
	}
	return h, nil
}

func checkTensor(name string, rt rawTensor) (TensorInfo, error) {
	t := TensorInfo{Name: name}
	if rt.DType == nil || rt.Shape == nil || rt.DataOffsets == nil {
		return t, formatErr("tensor %q lacks dtype, shape or data_offsets", name)
	}
	t.DType = *rt.DType
	width, ok := dtypeBits[t.DType]
	if !ok {
		return t, formatErr("tensor %q has unknown dtype %q", name, t.DType)
	}
	if len(*rt.DataOffsets) != 2 {
		return t, formatErr("tensor %q: data_offsets has %d values, want 2", name, len(*rt.DataOffsets))
	}
	b, e := (*rt.DataOffsets)[0], (*rt.DataOffsets)[1]
	if b > e || e > math.MaxInt64 {
		return t, formatErr("tensor %q: data_offsets [%d, %d) are invalid", name, b, e)
	}
	t.Begin, t.End = int64(b), int64(e)
	elems := uint64(1)
	for _, d := range *rt.Shape {
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > math.MaxInt64/8 {
			return t, formatErr("tensor %q: shape %v overflows", name, *rt.Shape)
		}
		elems = lo
		t.Shape = append(t.Shape, int64(d))
	}
	if t.Shape == nil {
		t.Shape = []int64{}
	}
	bitCount := elems * uint64(width)
	if bitCount%8 != 0 {
		return t, formatErr("tensor %q: %d elements of %s do not fill whole bytes", name, elems, t.DType)
	}
	if want := bitCount / 8; want != e-b {
		return t, formatErr("tensor %q: shape %v of %s is %d bytes but data_offsets [%d, %d) hold %d", name, t.Shape, t.DType, want, b, e, e-b)
	}
	return t, nil
}

// Tensor is a tensor to write: Data holds Elems·DType.Size() bytes,
// little-endian, row-major.
type Tensor struct {
	Name  string
	DType dtype.DType
	Shape []int
	Data  []byte
}

func (t Tensor) check() error {
	if t.Name == "" || t.Name == MetadataKey {
		return fmt.Errorf("tensor name %q is reserved or empty", t.Name)
	}
	n := 1
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %q: negative dimension in shape %v", t.Name, t.Shape)
		}
		n *= d
	}
	if want := n * t.DType.Size(); want != len(t.Data) {
		return fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, got %d", t.Name, t.Shape, t.DType, want, len(t.Data))
	}
	return nil
}

// EncodeHeader returns the 8-byte length and the JSON header for tensors
// laid out back to back in the order given, the header padded with spaces
// so that the byte buffer starts on an 8-byte boundary. Keys appear in
// order: __metadata__ (keys sorted), then the tensors.
func EncodeHeader(tensors []Tensor, metadata map[string]string) ([]byte, error) {
	entries := make([]Entry, len(tensors))
	for i, t := range tensors {
		if err := t.check(); err != nil {
			return nil, err
		}
		entries[i] = Entry{Name: t.Name, DType: t.DType, Shape: t.Shape, SizeBytes: int64(len(t.Data))}
	}
	return EncodeEntries(entries, metadata)
}

// Entry is a tensor of a header to write without its data, for a writer
// that streams the data after the header: SizeBytes bytes of DType in
// Shape.
type Entry struct {
	Name      string
	DType     dtype.DType
	Shape     []int
	SizeBytes int64
}

// EncodeEntries is EncodeHeader for tensors whose data is written later,
// back to back in the order given.
func EncodeEntries(entries []Entry, metadata map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("{")
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(`"` + MetadataKey + `":{`)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(&b, k)
			b.WriteByte(':')
			writeJSONString(&b, metadata[k])
		}
		b.WriteString("}")
	}
	seen := map[string]bool{}
	var off int64
	for i, t := range entries {
		if t.Name == "" || t.Name == MetadataKey {
			return nil, fmt.Errorf("tensor name %q is reserved or empty", t.Name)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tensor %q given twice", t.Name)
		}
		seen[t.Name] = true
		if i > 0 || len(metadata) > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, t.Name)
		b.WriteString(`:{"dtype":"` + DTypeName(t.DType) + `","shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		end := off + t.SizeBytes
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	b.WriteString("}")
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	out := make([]byte, 8, 8+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	return append(out, b.Bytes()...), nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always marshals
	b.Write(enc)
}

// Write writes tensors (back to back, in the order given) and
// metadata to w in the safetensors format and returns the bytes written.
func Write(w io.Writer, tensors []Tensor, metadata map[string]string) (int64, error) {
	hdr, err := EncodeHeader(tensors, metadata)
	if err != nil {
		return 0, fmt.Errorf("safetensors: %w", err)
	}
	n, err := w.Write(hdr)
	total := int64(n)
	if err != nil {
		return total, err
	}
	for _, t := range tensors {
		n, err := w.Write(t.Data)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// WriteFile writes a safetensors file at path atomically: a
// temporary file in the same directory, fsync, rename, fsync of the
// directory. A reader sees the old file or the new one, never a part.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	err := durable.WriteFile(path, 1<<20, func(w io.Writer) error {
		_, err := Write(w, tensors, metadata)
		return err
	})
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// File is an open safetensors file with a validated header.
// Close it when done; it is safe for concurrent ReadTensor calls.
type File struct {
	Path   string
	Header *Header
	f      *os.File
}

// Open opens path and validates its header. A path that is not a regular
// file (a FIFO, whose open would wait for a writer; a device) is refused
// before it is opened.
func Open(path string) (*File, error) {
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors: %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !fi.Mode().IsRegular() { // replaced between the two
		f.Close()
		return nil, fmt.Errorf("safetensors: %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	h, err := ReadHeader(f, fi.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return &File{Path: path, Header: h, f: f}, nil
}

// ReadTensor reads t's bytes into dst, which must be t.SizeBytes() long.
func (s *File) ReadTensor(t TensorInfo, dst []byte) error {
	if int64(len(dst)) != t.SizeBytes() {
		panic(fmt.Sprintf("safetensors: ReadTensor %q into %d bytes, want %d", t.Name, len(dst), t.SizeBytes()))
	}
	if _, err := s.f.ReadAt(dst, s.Header.DataStart()+t.Begin); err != nil {
		return fmt.Errorf("safetensors: %s: read tensor %q at [%d, %d): %w", s.Path, t.Name, t.Begin, t.End, err)
	}
	return nil
}

// Close closes the file.
func (s *File) Close() error { return s.f.Close() }

// ReadAt reads len(b) bytes of tensor t from byte off of its data (a part
// of a tensor: a reader that streams a large tensor block by block).
func (s *File) ReadAt(t TensorInfo, b []byte, off int64) error {
	if _, err := s.f.ReadAt(b, s.Header.DataStart()+t.Begin+off); err != nil {
		return fmt.Errorf("safetensors: %s: read tensor %q at [%d, %d): %w", s.Path, t.Name, t.Begin+off, t.Begin+off+int64(len(b)), err)
	}
	return nil
}

// ReadFile reads a whole file: its header and every tensor's bytes, keyed
// by name.
func ReadFile(path string) (*Header, map[string][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	h, data, err := Parse(b)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return h, data, nil
}

// Parse validates a whole file held in memory and returns each tensor's
// bytes as a sub-slice of b.
func Parse(b []byte) (*Header, map[string][]byte, error) {
	h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, nil, err
	}
	data := b[h.DataStart():]
	out := make(map[string][]byte, len(h.Tensors))
	for _, t := range h.Tensors {
		out[t.Name] = data[t.Begin:t.End:t.End]
	}
	return h, out, nil
}
