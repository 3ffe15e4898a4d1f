package hf

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// weights is where every tensor of a layout lies in a set of open
// safetensors files (one, or the shards of a Hugging Face directory),
// checked against the layout: name, shape and a dtype import reads (F32,
// BF16, F16). readChunk reads one chunk from them with pread, a block at
// a time, so a model's weights pass through host memory one chunk at a
// time whatever their size.
type weights struct {
	layout *model.Layout
	files  []*safetensors.File
	chunks [][]placedTensor // [c]: chunk c's tensors, in layout order
	buf    []byte           // one read block
	f32    []float32        // a block widened, for a transposed tensor
}

// placedTensor is a layout tensor and where it is stored.
type placedTensor struct {
	fileTensor
	file int // index into weights.files
	info safetensors.TensorInfo
}

// importDTypes are the dtypes import widens to fp32, each exactly.
var importDTypes = map[string]int{"F32": 4, "BF16": 2, "F16": 2}

// weightNames says how a set of files names a layout's tensors: names (the
// layout's, or Hugging Face's less their prefix), canon mapping a file's
// tensor name to that form (false: a buffer to skip), and the name a
// missing tensor is reported under.
type weightNames struct {
	names   Naming
	canon   func(fileName string) (string, bool)
	display func(name string) string
}

// matchWeights places every tensor of l in files as wn names them and
// lists every problem: a tensor missing, found twice, of the wrong shape or
// dtype, and the files' tensors the layout lacks. Each problem names the
// tensor as the file does and, with several files, the file.
func matchWeights(l *model.Layout, files []*safetensors.File, wn weightNames) (*weights, []string) {
	type where struct {
		file int
		info safetensors.TensorInfo
	}
	var problems []string
	fileName := func(i int) string {
		if len(files) == 1 {
			return ""
		}
		return shortPath(files[i].Path) + ": "
	}
	inFiles := map[string]where{}
	for i, f := range files {
		for _, t := range f.Header.Tensors {
			name, ok := wn.canon(t.Name)
			if !ok {
				continue
			}
			if prev, dup := inFiles[name]; dup {
				problems = append(problems, fmt.Sprintf("%s%s and %s%s are the same tensor", fileName(prev.file), prev.info.Name, fileName(i), t.Name))
				continue
			}
			inFiles[name] = where{i, t}
		}
	}
	w := &weights{layout: l, files: files, chunks: make([][]placedTensor, len(l.Chunks))}
	var missing []string
	for _, ft := range fileTensors(l, wn.names) {
		at, ok := inFiles[ft.name]
		if !ok {
			missing = append(missing, wn.display(ft.name))
			continue
		}
		delete(inFiles, ft.name)
		t := at.info
		if _, ok := importDTypes[t.DType]; !ok {
			problems = append(problems, fmt.Sprintf("%s%s has dtype %s (import reads F32, BF16 or F16)", fileName(at.file), t.Name, t.DType))
		}
		if !t.HasShape(ft.shape) {
			problems = append(problems, fmt.Sprintf("%s%s has shape %v, the layout wants %v", fileName(at.file), t.Name, t.Shape, ft.shape))
		}
		w.chunks[ft.chunk] = append(w.chunks[ft.chunk], placedTensor{fileTensor: ft, file: at.file, info: t})
	}
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("%d missing: %s", len(missing), listSome(missing)))
	}
	if len(inFiles) > 0 {
		var extra []string
		for _, at := range inFiles {
			extra = append(extra, fileName(at.file)+at.info.Name)
		}
		sort.Strings(extra)
		problems = append(problems, fmt.Sprintf("%d unexpected: %s", len(extra), listSome(extra)))
	}
	return w, problems
}

// shortPath is a file's name without its directory.
func shortPath(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// readBlockBytes is the most readChunk reads at once (a transposed tensor
// whose file row is longer reads one row at a time).
const readBlockBytes = 4 << 20

// readChunk fills dst, exactly chunk c's length, with its fp32 values.
func (w *weights) readChunk(c int, dst []float32) error {
	if c < 0 || c >= len(w.chunks) || len(dst) != w.layout.Chunks[c].Len {
		panic(fmt.Sprintf("hf: read chunk %d into %d values (layout: %d chunks)", c, len(dst), len(w.layout.Chunks)))
	}
	for _, p := range w.chunks[c] {
		if err := w.readTensor(p, dst[p.t.Offset:p.t.Offset+p.t.Len]); err != nil {
			return err
		}
	}
	return nil
}

// readTensor reads p into dst: an F32 tensor stored as the layout stores it
// straight into dst's memory, anything else through one block of the
// file's bytes at a time, widened (and transposed back) into place.
func (w *weights) readTensor(p placedTensor, dst []float32) error {
	f := w.files[p.file]
	size := importDTypes[p.info.DType]
	if len(dst) == 0 {
		return nil
	}
	if p.info.DType == "F32" && !p.transposed {
		return f.ReadAt(p.info, dtype.Bytes(dst), 0)
	}
	blockElems, rows, cols := p.blockElems(), 0, 0
	if p.transposed {
		rows, cols = p.t.Shape[0], p.t.Shape[1] // Strata rows×cols; the file holds cols×rows
	}
	if w.buf == nil {
		w.alloc()
	}
	for start := 0; start < len(dst); start += blockElems {
		n := min(blockElems, len(dst)-start)
		b := w.buf[:n*size]
		if err := f.ReadAt(p.info, b, int64(start*size)); err != nil {
			return err
		}
		if !p.transposed {
			widen(dst[start:start+n], b, p.info.DType)
			continue
		}
		// The block is file rows start/rows ... of rows elements each:
		// Strata's columns from start/rows on.
		src := dtype.Float32s(b)
		if p.info.DType != "F32" {
			src = w.f32[:n]
			widen(src, b, p.info.DType)
		}
		transposeStrided(dst[start/rows:], cols, src, n/rows, rows)
	}
	return nil
}

// blockElems is the elements readTensor reads of p at once: the whole
// tensor, or less for one larger than readBlockBytes; whole file rows of
// a transposed tensor (a row is one column of Strata's rows×cols, rows
// long).
func (p placedTensor) blockElems() int {
	size, rowElems := importDTypes[p.info.DType], 1
	if p.transposed {
		rowElems = p.t.Shape[0]
	}
	n := max(rowElems, readBlockBytes/size/rowElems*rowElems)
	return min(n, p.t.Len)
}

// alloc makes the read buffers once, of the largest block any tensor
// needs, so that reading allocates nothing per chunk.
func (w *weights) alloc() {
	var bufBytes, f32Elems int
	for _, ps := range w.chunks {
		for _, p := range ps {
			n := p.blockElems()
			bufBytes = max(bufBytes, n*importDTypes[p.info.DType])
			if p.transposed {
				f32Elems = max(f32Elems, n)
			}
		}
	}
	w.buf = make([]byte, bufBytes)
	w.f32 = make([]float32, f32Elems)
}

// widen converts b, little-endian values of dtype dt, to dst exactly.
func widen(dst []float32, b []byte, dt string) {
	switch dt {
	case "F32":
		copy(dst, dtype.Float32s(b))
	case "BF16":
		bf16.ToFloat32s(dst, dtype.Uint16s(b))
	case "F16":
		for i, h := range dtype.Uint16s(b)[:len(dst)] {
			dst[i] = F16ToFloat32(h)
		}
	default:
		panic("hf: widen " + dt)
	}
}

// F16ToFloat32 widens an IEEE 754 binary16 exactly: subnormals become
// normal float32s, infinities stay infinite, and a NaN keeps its sign and
// payload (shifted into the top of float32's mantissa, as the hardware
// conversions do).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0: // normal: rebias 15 -> 127
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign) // ±0
	}
	// Subnormal: mant·2^-24, exact in float32.
	f := float32(mant) * (1.0 / (1 << 24))
	return math.Float32frombits(sign | math.Float32bits(f))
}
