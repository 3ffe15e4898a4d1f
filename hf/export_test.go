package hf

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

func tinyLayout(t testing.TB) *model.Layout {
	t.Helper()
	s, err := model.Lookup("tiny")
	if err != nil {
		t.Fatal(err)
	}
	l, err := model.NewLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestExportImportF32(t *testing.T) {
	l := tinyLayout(t)
	chunks := l.Init(7)
	chunks[1][3] = float32(math.Inf(-1))
	chunks[0][0] = float32(math.Copysign(0, -1))
	for _, names := range []Naming{NamesStrata, NamesHF} {
		path := filepath.Join(t.TempDir(), "m.safetensors")
		if err := Export(path, l, chunks, ExportOptions{Names: names, Step: 12}); err != nil {
			t.Fatal(err)
		}
		back, h, err := Import(path, l, ImportOptions{}) // auto-detects the naming
		if err != nil {
			t.Fatal(err)
		}
		if h.Metadata[MetaStep] != "12" || h.Metadata[MetaLayers] != "2" || h.Metadata["format"] != "pt" || h.Metadata[MetaNames] != string(names) {
			t.Errorf("%s: metadata %v", names, h.Metadata)
		}
		for c := range chunks {
			for i := range chunks[c] {
				if math.Float32bits(back[c][i]) != math.Float32bits(chunks[c][i]) {
					t.Fatalf("%s: chunk %d element %d: %v, want %v", names, c, i, back[c][i], chunks[c][i])
				}
			}
		}
	}
}

// TestExportHFNames checks the Hugging Face GPT-2 names and the Conv1D
// transpose against values placed by hand.
func TestExportHFNames(t *testing.T) {
	l := tinyLayout(t)
	chunks := make([][]float32, len(l.Chunks))
	for c, ch := range l.Chunks {
		chunks[c] = make([]float32, ch.Len)
	}
	fc, _ := l.Chunks[model.BlockChunk(1)].Tensor("h.1.mlp.c_fc.weight") // 4C×C out×in
	c := l.Shape.Dim
	chunks[model.BlockChunk(1)][fc.Offset+5*c+2] = 3 // out 5, in 2
	path := filepath.Join(t.TempDir(), "hf.safetensors")
	if err := Export(path, l, chunks, ExportOptions{Names: NamesHF}); err != nil {
		t.Fatal(err)
	}
	h, data, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.1.attn.c_attn.bias", "ln_f.bias"} {
		if _, ok := h.Tensor(name); !ok {
			t.Errorf("no tensor %s", name)
		}
	}
	ti, _ := h.Tensor("h.1.mlp.c_fc.weight")
	if !ti.HasShape([]int{c, 4 * c}) {
		t.Fatalf("c_fc shape %v, want in×out [%d %d]", ti.Shape, c, 4*c)
	}
	v := dtype.Float32s(data["h.1.mlp.c_fc.weight"])
	if v[2*4*c+5] != 3 { // in 2, out 5
		t.Errorf("Conv1D layout: [2][5] = %v, want 3", v[2*4*c+5])
	}
	if len(h.Tensors) != 2+12*l.Shape.Layers+2 {
		t.Errorf("%d tensors", len(h.Tensors))
	}
}

func TestExportBF16(t *testing.T) {
	l := tinyLayout(t)
	f := l.Init(3)
	b := make([][]uint16, len(f))
	for c := range f {
		b[c] = make([]uint16, len(f[c])+100) // padded, as a gathered chunk is
		bf16.FromFloat32s(b[c], f[c])
	}
	dir := t.TempDir()
	// bf16 in, BF16 out: identical bits; bf16 in, F32 out: exact widening;
	// f32 in, BF16 out: rounding to nearest even.
	if err := Export(filepath.Join(dir, "a"), l, b, ExportOptions{DType: dtype.BF16}); err != nil {
		t.Fatal(err)
	}
	if err := Export(filepath.Join(dir, "b"), l, b, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Export(filepath.Join(dir, "c"), l, f, ExportOptions{DType: dtype.BF16}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		got, h, err := Import(filepath.Join(dir, name), l, ImportOptions{Names: NamesStrata})
		if err != nil {
			t.Fatal(err)
		}
		wantDT := map[string]string{"a": "BF16", "b": "F32", "c": "BF16"}[name]
		if h.Tensors[0].DType != wantDT {
			t.Errorf("%s: dtype %s, want %s", name, h.Tensors[0].DType, wantDT)
		}
		for c := range f {
			for i := range f[c] {
				if want := bf16.ToFloat32(b[c][i]); math.Float32bits(got[c][i]) != math.Float32bits(want) {
					t.Fatalf("%s: chunk %d %d: %v, want %v", name, c, i, got[c][i], want)
				}
			}
		}
	}
}

func TestImportErrors(t *testing.T) {
	l := tinyLayout(t)
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	if err := Export(small, l, l.Init(1), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	// A layout with one more layer: 12 tensors missing, and the metadata differs.
	s3 := l.Shape
	s3.Layers = 3
	l3, _ := model.NewLayout(s3)
	_, _, err := Import(small, l3, ImportOptions{})
	for _, want := range []string{"12 missing: h.2.ln_1.weight", "and 4 more", "n_layer 2 (layout 3)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	// Unexpected tensors, a wrong shape and a wrong dtype.
	tensors := []safetensors.Tensor{
		{Name: "extra", DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)},
		{Name: "wte", DType: dtype.F32, Shape: []int{2, 2}, Data: make([]byte, 16)},
		{Name: "wpe", DType: dtype.I32, Shape: []int{l.Shape.MaxSeq, l.Shape.Dim}, Data: make([]byte, 4*l.Shape.MaxSeq*l.Shape.Dim)},
	}
	bad := filepath.Join(dir, "bad")
	if err := safetensors.WriteFile(bad, tensors, nil); err != nil {
		t.Fatal(err)
	}
	_, _, err = Import(bad, l, ImportOptions{})
	for _, want := range []string{"wte has shape [2 2], the layout wants [256 32]", "wpe has dtype I32", "1 unexpected: extra", "26 missing"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	t.Log(err)
	if err := Export(small, l, l.Init(1)[:2], ExportOptions{}); err == nil {
		t.Error("export with too few chunks: no error")
	}
	if err := Export(small, l, l.Init(1), ExportOptions{Metadata: map[string]string{MetaStep: "1"}}); err == nil {
		t.Error("export overriding step metadata: no error")
	}
}

// TestImportHFPrefixAndBuffers reads a file as transformers saves
// GPT2LMHeadModel: a "transformer." prefix, attention-mask buffers and a
// tied lm_head.
func TestImportHFPrefixAndBuffers(t *testing.T) {
	l := tinyLayout(t)
	want := l.Init(5)
	path := filepath.Join(t.TempDir(), "hf")
	if err := Export(path, l, want, ExportOptions{Names: NamesHF}); err != nil {
		t.Fatal(err)
	}
	h, data, err := safetensors.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, ti := range h.Tensors {
		shape := make([]int, len(ti.Shape))
		for i, d := range ti.Shape {
			shape[i] = int(d)
		}
		ts = append(ts, safetensors.Tensor{Name: "transformer." + ti.Name, DType: dtype.F32, Shape: shape, Data: data[ti.Name]})
	}
	T := l.Shape.MaxSeq
	ts = append(ts, safetensors.Tensor{Name: "transformer.h.0.attn.bias", DType: dtype.F32, Shape: []int{1, 1, T, T}, Data: make([]byte, 4*T*T)},
		safetensors.Tensor{Name: "lm_head.weight", DType: dtype.F32, Shape: []int{l.Shape.Vocab, l.Shape.Dim}, Data: data["wte.weight"]})
	if err := safetensors.WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	got, _, err := Import(path, l, ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for c := range want {
		for i := range want[c] {
			if got[c][i] != want[c][i] {
				t.Fatalf("chunk %d %d: %v, want %v", c, i, got[c][i], want[c][i])
			}
		}
	}
}

// legacyChunks is the in-memory export's source before streaming: every
// chunk at once, fp32 or bf16.
type legacyChunks struct {
	f32 [][]float32
	b16 [][]uint16
}

func (s legacyChunks) put(out []byte, dt dtype.DType, dst, c, src int) {
	switch {
	case dt == dtype.F32 && s.f32 != nil:
		dtype.Float32s(out)[dst] = s.f32[c][src]
	case dt == dtype.F32:
		dtype.Float32s(out)[dst] = bf16.ToFloat32(s.b16[c][src])
	case s.f32 != nil:
		dtype.Uint16s(out)[dst] = bf16.FromFloat32(s.f32[c][src])
	default:
		dtype.Uint16s(out)[dst] = s.b16[c][src]
	}
}

// legacyExport is Export as it was before ExportStream (the whole model
// in memory, encoded element by element), kept to check that the
// streaming writer writes the same bytes.
func legacyExport(t *testing.T, path string, l *model.Layout, src legacyChunks, opts ExportOptions) {
	t.Helper()
	opts.defaults()
	md, err := exportMetadata(l, opts)
	if err != nil {
		t.Fatal(err)
	}
	fts := fileTensors(l, opts.Names)
	entries := make([]safetensors.Entry, len(fts))
	for i, ft := range fts {
		entries[i] = safetensors.Entry{Name: ft.name, DType: opts.DType, Shape: ft.shape, SizeBytes: int64(ft.t.Len * opts.DType.Size())}
	}
	hdr, err := safetensors.EncodeEntries(entries, md)
	if err != nil {
		t.Fatal(err)
	}
	out := append([]byte(nil), hdr...)
	for _, ft := range fts {
		b := make([]byte, ft.t.Len*opts.DType.Size())
		rows, cols := 1, ft.t.Len
		if ft.transposed {
			rows, cols = ft.t.Shape[0], ft.t.Shape[1]
		}
		for r := range rows {
			for c := range cols {
				dst := r*cols + c
				if ft.transposed {
					dst = c*rows + r
				}
				src.put(b, opts.DType, dst, ft.chunk, ft.t.Offset+r*cols+c)
			}
		}
		out = append(out, b...)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sameFile(t *testing.T, what, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		i := 0
		for i < min(len(x), len(y)) && x[i] == y[i] {
			i++
		}
		t.Errorf("%s: %d bytes vs %d, first difference at byte %d", what, len(x), len(y), i)
	}
}

// TestExportStreamSameBytes: Export of fp32 and of bf16 chunks (ExportStream
// handed the chunks) write the files the whole-model export wrote, byte
// for byte, for Strata and Hugging Face names, F32 and BF16 files, from
// fp32 and bf16 chunks (padded, and with a NaN, an infinity and -0 in
// them, which are copied or rounded like any value).
func TestExportStreamSameBytes(t *testing.T) {
	l := tinyLayout(t)
	f := l.Init(11)
	b := make([][]uint16, len(f))
	for c := range f {
		f[c] = append(f[c], 1, 2, 3) // padding, ignored
		b[c] = make([]uint16, len(f[c]))
		bf16.FromFloat32s(b[c], f[c])
	}
	f[1][4] = float32(math.NaN())
	f[2][7] = float32(math.Inf(1))
	f[0][1] = float32(math.Copysign(0, -1))
	dir := t.TempDir()
	for _, names := range []Naming{NamesStrata, NamesHF} {
		for _, dt := range []dtype.DType{dtype.F32, dtype.BF16} {
			opts := ExportOptions{Names: names, DType: dt, Step: 5, Metadata: map[string]string{"run": "x"}}
			for _, in := range []string{"f32", "bf16"} {
				what := fmt.Sprintf("%s names, %v file, %s chunks", names, dt, in)
				got, want := filepath.Join(dir, "got"), filepath.Join(dir, "want")
				var err error
				if in == "f32" {
					err = Export(got, l, f, opts)
					legacyExport(t, want, l, legacyChunks{f32: f}, opts)
				} else {
					err = Export(got, l, b, opts)
					legacyExport(t, want, l, legacyChunks{b16: b}, opts)
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				sameFile(t, what, got, want)
			}
		}
	}
}

// TestExportStreamErrors: a produce that fails or hands over too few
// chunks leaves no file (nor a temporary one); a chunk too short is an
// error naming it; a chunk out of order panics.
func TestExportStreamErrors(t *testing.T) {
	l := tinyLayout(t)
	f := l.Init(1)
	dir := t.TempDir()
	path := filepath.Join(dir, "m.safetensors")
	boom := errors.New("boom")
	for _, tc := range []struct {
		what    string
		produce func(w *ExportWriter) error
		want    string
	}{
		{"failing produce", func(w *ExportWriter) error {
			if err := w.F32(0, f[0]); err != nil {
				return err
			}
			return boom
		}, "boom"},
		{"too few chunks", func(w *ExportWriter) error { return w.F32(0, f[0]) }, fmt.Sprintf("1 of the layout's %d chunks handed over", len(l.Chunks))},
		{"short chunk", func(w *ExportWriter) error { return w.F32(0, f[0][:10]) }, fmt.Sprintf("chunk 0 (%s) has 10 elements, layout needs %d", l.Chunks[0].Name, l.Chunks[0].Len)},
	} {
		err := ExportStream(path, l, ExportOptions{}, tc.produce)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "hf: write "+path) {
			t.Errorf("%s: error %v, want it to say %q", tc.what, err, tc.want)
		}
		if tc.what == "failing produce" && !errors.Is(err, boom) {
			t.Errorf("%s: %v does not wrap produce's error", tc.what, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: left %d files in %s", tc.what, len(ents), dir)
		}
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "chunk 1 handed over, want chunk 0") {
			t.Errorf("chunk out of order: recovered %v", r)
		}
	}()
	ExportStream(path, l, ExportOptions{}, func(w *ExportWriter) error { return w.F32(1, f[1]) })
}

// TestExportStreamMemoryBound is the must-show of ExportStream's bound:
// exporting a model of 7M parameters (28 MB of fp32 weights in 66 chunks,
// 770 tensors) from chunks produced one at a time into one buffer (as
// `strata train --out` does) allocates on the heap, in all (the Go
// runtime's count of every byte allocated while it runs, not just the live
// peak), at most the largest tensor (0.15 MB), the 1 MiB write buffer, 2
// KiB per tensor for the header and its bookkeeping (names, shapes, the
// layout; they grow with the number of tensors, not their size) and 512
// KiB for the rest: 3.3 MB. The file is then compared with the
// whole-model export's.
func TestExportStreamMemoryBound(t *testing.T) {
	l, err := model.NewLayout(model.Shape{Name: "bound", Layers: 64, Dim: 96, Heads: 4, Vocab: 64, MaxSeq: 16})
	if err != nil {
		t.Fatal(err)
	}
	weights := 4 * l.ParamCount()
	tensor := 0
	for _, ch := range l.Chunks {
		for _, ts := range ch.Tensors {
			tensor = max(tensor, 4*ts.Len)
		}
	}
	const writeBuf = 1 << 20
	overhead := 512<<10 + 2<<10*len(fileTensors(l, NamesStrata))
	dir := t.TempDir()
	got, want := filepath.Join(dir, "got"), filepath.Join(dir, "want")
	opts := ExportOptions{Names: NamesHF}

	// From chunks produced one at a time into one buffer.
	maxLen := 0
	for _, ch := range l.Chunks {
		maxLen = max(maxLen, ch.Len)
	}
	buf := make([]float32, maxLen)
	gen := func(c int) []float32 {
		v := buf[:l.Chunks[c].Len]
		for i := range v {
			v[i] = float32(c) + float32(i%1000)/1000
		}
		return v
	}
	bound := tensor + writeBuf + overhead
	if weights < int64(5*bound) {
		t.Fatalf("weights %d bytes are not much larger than the bound %d", weights, bound)
	}
	before := heapAllocated()
	err = ExportStream(got, l, opts, func(w *ExportWriter) error {
		for c := range l.Chunks {
			if err := w.F32(c, gen(c)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	used := heapAllocated() - before
	t.Logf("ExportStream of %d bytes of weights: %d bytes allocated (bound %d)", weights, used, bound)
	if used > uint64(bound) {
		t.Errorf("ExportStream allocated %d bytes, over the bound %d", used, bound)
	}
	all := make([][]float32, len(l.Chunks))
	for c := range all {
		all[c] = append([]float32(nil), gen(c)...)
	}
	legacyExport(t, want, l, legacyChunks{f32: all}, opts)
	sameFile(t, "ExportStream", got, want)
}

// heapAllocated is the bytes the process has allocated on the heap so far.
func heapAllocated() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}
