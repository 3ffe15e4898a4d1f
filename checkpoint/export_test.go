package checkpoint

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/model"
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
	h, data, err := ReadSafetensorsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.1.attn.c_attn.bias", "ln_f.bias"} {
		if _, ok := h.Tensor(name); !ok {
			t.Errorf("no tensor %s", name)
		}
	}
	ti, _ := h.Tensor("h.1.mlp.c_fc.weight")
	if !sameShape(ti.Shape, []int{c, 4 * c}) {
		t.Fatalf("c_fc shape %v, want in×out [%d %d]", ti.Shape, c, 4*c)
	}
	v := Float32s(data["h.1.mlp.c_fc.weight"])
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
	if err := ExportBF16(filepath.Join(dir, "a"), l, b, ExportOptions{DType: dtype.BF16}); err != nil {
		t.Fatal(err)
	}
	if err := ExportBF16(filepath.Join(dir, "b"), l, b, ExportOptions{}); err != nil {
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
	tensors := []Tensor{
		{Name: "extra", DType: dtype.F32, Shape: []int{1}, Data: make([]byte, 4)},
		{Name: "wte", DType: dtype.F32, Shape: []int{2, 2}, Data: make([]byte, 16)},
		{Name: "wpe", DType: dtype.I32, Shape: []int{l.Shape.MaxSeq, l.Shape.Dim}, Data: make([]byte, 4*l.Shape.MaxSeq*l.Shape.Dim)},
	}
	bad := filepath.Join(dir, "bad")
	if err := WriteSafetensorsFile(bad, tensors, nil); err != nil {
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
	h, data, err := ReadSafetensorsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []Tensor
	for _, ti := range h.Tensors {
		shape := make([]int, len(ti.Shape))
		for i, d := range ti.Shape {
			shape[i] = int(d)
		}
		ts = append(ts, Tensor{Name: "transformer." + ti.Name, DType: dtype.F32, Shape: shape, Data: data[ti.Name]})
	}
	T := l.Shape.MaxSeq
	ts = append(ts, Tensor{Name: "transformer.h.0.attn.bias", DType: dtype.F32, Shape: []int{1, 1, T, T}, Data: make([]byte, 4*T*T)},
		Tensor{Name: "lm_head.weight", DType: dtype.F32, Shape: []int{l.Shape.Vocab, l.Shape.Dim}, Data: data["wte.weight"]})
	if err := WriteSafetensorsFile(path, ts, map[string]string{"format": "pt"}); err != nil {
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
