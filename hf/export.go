package hf

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
)

// Naming is how tensors are named in an exported or imported file.
type Naming string

const (
	// NamesAuto (import only): Hugging Face names when the file holds
	// "wte.weight" or "transformer.wte.weight", else Strata's.
	NamesAuto Naming = ""
	// NamesStrata are the layout's names (model.Layout): "wte", "wpe",
	// "h.{l}.attn.c_attn.weight" ..., "ln_f.weight"; linear weights out×in.
	NamesStrata Naming = "strata"
	// NamesHF are those of Hugging Face transformers' GPT-2 (the keys of
	// openai-community/gpt2's model.safetensors): "wte.weight",
	// "wpe.weight", "h.{l}.ln_1.weight" ..., "ln_f.bias", the four Conv1D
	// weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) stored in×out,
	// the transpose of Strata's. The output head is tied to wte and not
	// written. On import a "transformer." prefix is accepted, and the
	// attention-mask buffers "h.{l}.attn.bias" and "h.{l}.attn.masked_bias"
	// and a tied "lm_head.weight" are skipped.
	NamesHF Naming = "hf"
)

// ParseNaming reads "strata", "hf" (or "huggingface") and "auto".
func ParseNaming(s string) (Naming, error) {
	switch strings.ToLower(s) {
	case "", "auto":
		return NamesAuto, nil
	case "strata":
		return NamesStrata, nil
	case "hf", "huggingface":
		return NamesHF, nil
	}
	return "", fmt.Errorf("hf: unknown naming %q (want strata, hf or auto)", s)
}

// hfName maps a layout tensor to its Hugging Face name and whether its data
// is transposed there.
func hfName(t model.Tensor) (string, bool) {
	switch t.Name {
	case "wte", "wpe":
		return t.Name + ".weight", false
	}
	if len(t.Shape) == 2 && strings.HasPrefix(t.Name, "h.") && !strings.Contains(t.Name, ".lora_") {
		return t.Name, true // Conv1D: in×out (a LoRA adapter's A and B are nn.Linear's, as PEFT stores them)
	}
	return t.Name, false
}

// fileTensor is how a layout tensor appears in a file.
type fileTensor struct {
	chunk      int
	t          model.Tensor
	name       string
	shape      []int
	transposed bool
	// dt is the tensor's dtype in the file when it is its own (a merged
	// export keeps each base tensor's: DirOptions.KeepDTypes); 0: the
	// export's.
	dt dtype.DType
}

func fileTensors(l *model.Layout, names Naming) []fileTensor {
	n := 0
	for _, ch := range l.Chunks {
		n += len(ch.Tensors)
	}
	out := make([]fileTensor, 0, n)
	for c, ch := range l.Chunks {
		for _, t := range ch.Tensors {
			ft := fileTensor{chunk: c, t: t, name: t.Name, shape: t.Shape}
			if names == NamesHF {
				ft.name, ft.transposed = hfName(t)
				if ft.transposed {
					ft.shape = []int{t.Shape[1], t.Shape[0]}
				}
			}
			out = append(out, ft)
		}
	}
	return out
}

// ExportOptions control Export.
type ExportOptions struct {
	DType    dtype.DType       // F32 (default) or BF16 (round to nearest even)
	Names    Naming            // NamesStrata (default) or NamesHF
	Step     int64             // recorded as metadata "step"
	Metadata map[string]string // more metadata; may not override the keys Export writes
}

func (o *ExportOptions) defaults() {
	if o.DType == 0 {
		o.DType = dtype.F32
	}
	if o.Names == NamesAuto {
		o.Names = NamesStrata
	}
}

// Validate says what is wrong with the options (after defaults).
func (o ExportOptions) Validate() error {
	o.defaults()
	if o.DType != dtype.F32 && o.DType != dtype.BF16 {
		return fmt.Errorf("hf: export dtype %v (want f32 or bf16)", o.DType)
	}
	if o.Names != NamesStrata && o.Names != NamesHF {
		return fmt.Errorf("hf: export naming %q (want strata or hf)", o.Names)
	}
	if o.Step < 0 {
		return fmt.Errorf("hf: export step %d is negative", o.Step)
	}
	return nil
}

// Metadata keys written by Export (besides the "format": "pt" that
// transformers requires to load a file).
const (
	MetaShape  = "strata.shape" // the shape's name
	MetaModel  = "strata.model" // a custom model's name (model.CustomLayout), instead of the shape's keys
	MetaLayers = "n_layer"
	MetaDim    = "n_embd"
	MetaHeads  = "n_head"
	MetaVocab  = "vocab_size"
	MetaMaxSeq = "max_seq_len"
	MetaStep   = "step"
	MetaNames  = "strata.names" // "strata" or "hf"
)

// exportMetadata is the metadata of an export of layout l: for a decoder
// of package model its shape, for a custom model (whose tensors have only
// the names its layout gives: NamesHF is refused) its name (MetaModel).
func exportMetadata(l *model.Layout, o ExportOptions) (map[string]string, error) {
	s := l.Shape
	md := map[string]string{
		"format":   "pt",
		MetaShape:  s.Name,
		MetaLayers: strconv.Itoa(s.Layers),
		MetaDim:    strconv.Itoa(s.Dim),
		MetaHeads:  strconv.Itoa(s.Heads),
		MetaVocab:  strconv.Itoa(s.Vocab),
		MetaMaxSeq: strconv.Itoa(s.MaxSeq),
		MetaStep:   strconv.FormatInt(o.Step, 10),
		MetaNames:  string(o.Names),
	}
	if l.Custom() {
		if o.Names == NamesHF {
			return nil, fmt.Errorf("hf: export of %q under Hugging Face names: it is a custom model, whose tensors have only the names of its layout (use strata names)", l.Name)
		}
		md = map[string]string{"format": "pt", MetaModel: l.Name, MetaStep: md[MetaStep], MetaNames: md[MetaNames]}
	}
	for k, v := range o.Metadata {
		if _, ok := md[k]; ok {
			return nil, fmt.Errorf("hf: export metadata key %q is written by Export", k)
		}
		md[k] = v
	}
	return md, nil
}

// chunkData is one chunk's values, as float32 or bf16: exactly one of
// f32 and b16 is set (an empty chunk may have neither).
type chunkData struct {
	f32 []float32
	b16 []uint16
}

func (s chunkData) len() int {
	if s.f32 != nil {
		return len(s.f32)
	}
	return len(s.b16)
}

// put writes element src at element dst of out in dt.
func (s chunkData) put(out []byte, dt dtype.DType, dst, src int) {
	switch {
	case dt == dtype.F32 && s.f32 != nil:
		dtype.Float32s(out)[dst] = s.f32[src]
	case dt == dtype.F32:
		dtype.Float32s(out)[dst] = bf16.ToFloat32(s.b16[src])
	case dt == dtype.F16 && s.f32 != nil:
		dtype.Narrow(dtype.F16, dtype.Uint16s(out)[dst:dst+1], s.f32[src:src+1])
	case dt == dtype.F16:
		dtype.Narrow(dtype.F16, dtype.Uint16s(out)[dst:dst+1], []float32{bf16.ToFloat32(s.b16[src])})
	case s.f32 != nil:
		dtype.Uint16s(out)[dst] = bf16.FromFloat32(s.f32[src])
	default:
		dtype.Uint16s(out)[dst] = s.b16[src]
	}
}

// Export writes every named tensor of layout from chunks (host values,
// one slice per chunk, each at least the chunk's length; padding beyond it
// is ignored) to a safetensors file at path, atomically, with metadata: the
// shape (strata.shape, n_layer, n_embd, n_head, vocab_size, max_seq_len),
// step, strata.names and format "pt". The chunks are fp32 ([]float32) or
// bf16 bits ([]uint16: the engine's parameter copies); the file's dtype is
// opts.DType, to which every value converts (bf16 widens to F32 exactly,
// fp32 rounds to BF16 to nearest even). It is ExportStream handed the
// chunks one by one.
func Export[T float32 | uint16](path string, layout *model.Layout, chunks [][]T, opts ExportOptions) error {
	lens := make([]int, len(chunks))
	for c, ch := range chunks {
		lens[c] = len(ch)
	}
	if err := checkChunks(layout, lens, opts); err != nil {
		return err
	}
	return ExportStream(path, layout, opts, func(w *ExportWriter) error {
		for c, ch := range chunks {
			if err := w.put(c, chunkOf(ch)); err != nil {
				return err
			}
		}
		return nil
	})
}

// chunkOf is the chunkData of fp32 or bf16 values.
func chunkOf[T float32 | uint16](v []T) chunkData {
	switch v := any(v).(type) {
	case []float32:
		return chunkData{f32: v}
	case []uint16:
		return chunkData{b16: v}
	}
	panic("unreachable")
}

// checkChunks refuses, before a file is created, options ExportStream
// refuses and chunks of the wrong number or length.
func checkChunks(l *model.Layout, lens []int, opts ExportOptions) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	if len(lens) != len(l.Chunks) {
		return fmt.Errorf("hf: export: %d chunks given, layout has %d", len(lens), len(l.Chunks))
	}
	for c, ch := range l.Chunks {
		if lens[c] < ch.Len {
			return fmt.Errorf("hf: export: chunk %d (%s) has %d elements, layout needs %d", c, ch.Name, lens[c], ch.Len)
		}
	}
	return nil
}

// encodeTensor writes ft's values from its chunk's data src into out in
// dt, transposed when the file stores it so.
func encodeTensor(out []byte, dt dtype.DType, src chunkData, ft fileTensor) {
	off := ft.t.Offset
	if !ft.transposed {
		if dt == dtype.F32 && src.f32 != nil {
			copy(dtype.Float32s(out), src.f32[off:off+ft.t.Len])
			return
		}
		if dt == dtype.BF16 && src.b16 != nil {
			copy(dtype.Uint16s(out), src.b16[off:off+ft.t.Len])
			return
		}
		if dt.Half() && src.f32 != nil {
			dtype.Narrow(dt, dtype.Uint16s(out), src.f32[off:off+ft.t.Len])
			return
		}
		for i := range ft.t.Len {
			src.put(out, dt, i, off+i)
		}
		return
	}
	rows, cols := ft.t.Shape[0], ft.t.Shape[1] // Strata: rows×cols; file: cols×rows
	if dt == dtype.F32 && src.f32 != nil {
		transpose(dtype.Float32s(out), src.f32[off:off+ft.t.Len], rows, cols)
		return
	}
	for r := range rows {
		for c := range cols {
			src.put(out, dt, c*rows+r, off+r*cols+c)
		}
	}
}

// ImportOptions control Import.
type ImportOptions struct {
	Names Naming // NamesAuto (default), NamesStrata or NamesHF
}

// Import reads a safetensors file into one fp32 slice per chunk of layout
// (each exactly the chunk's length). Every tensor of the layout must be in
// the file under its name (see Naming) with its shape and dtype F32, BF16
// or F16 (widened exactly); a file tensor the layout lacks is an error too.
// The error lists every problem found. It returns the file's header as
// well (metadata: step and shape of an Export). It reads a block of at
// most 4 MiB at a time (Open reads a Hugging Face directory chunk by
// chunk).
func Import(path string, layout *model.Layout, opts ImportOptions) ([][]float32, *safetensors.Header, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	h := f.Header
	names := opts.Names
	if names == NamesAuto {
		names = NamesStrata
		for _, t := range h.Tensors {
			switch t.Name {
			case "wte.weight", "transformer.wte.weight", "model.embed_tokens.weight":
				names = NamesHF
			}
		}
	}
	if names != NamesStrata && names != NamesHF {
		return nil, nil, fmt.Errorf("hf: import naming %q (want strata, hf or auto)", names)
	}
	if names == NamesHF && layout.Custom() {
		return nil, nil, fmt.Errorf("hf: import %s under Hugging Face names into %q, a custom model, whose tensors have only the names of its layout", path, layout.Name)
	}
	wn := weightNames{names: names, canon: func(n string) (string, bool) { return n, true }, display: func(n string) string { return n }}
	if names == NamesHF {
		wn.canon = hfCanon(layout.Shape)
	}
	w, problems := matchWeights(layout, []*safetensors.File{f}, wn)
	if msg := shapeMismatch(h.Metadata, layout); msg != "" {
		problems = append([]string{msg}, problems...)
	}
	if len(problems) > 0 {
		return nil, h, fmt.Errorf("hf: import %s as %s (%s names): %s", path, layout.Name, names, strings.Join(problems, "; "))
	}
	out := make([][]float32, len(layout.Chunks))
	for c, ch := range layout.Chunks {
		out[c] = make([]float32, ch.Len)
		if err := w.readChunk(c, out[c]); err != nil {
			return nil, h, err
		}
	}
	return out, h, nil
}

// hfCanon maps a Hugging Face tensor name of a model of shape s to the
// name fileTensors gives it under NamesHF (the prefix "transformer." of
// GPT-2, "model." of the Llama family, dropped), or false for what import
// skips: GPT-2's attention-mask buffers (attn.bias, attn.masked_bias) and
// tied lm_head, the Llama family's rotary_emb.inv_freq buffers and a tied
// lm_head (transformers ties it to the embedding whatever the file holds).
func hfCanon(s model.Shape) func(string) (string, bool) {
	if !s.IsLlama() {
		return func(n string) (string, bool) {
			n = strings.TrimPrefix(n, "transformer.")
			if n == "lm_head.weight" || strings.HasSuffix(n, ".attn.bias") || strings.HasSuffix(n, ".attn.masked_bias") {
				return "", false
			}
			return n, true
		}
	}
	return func(n string) (string, bool) {
		if n == "lm_head.weight" && s.TiedHead() || strings.HasSuffix(n, ".rotary_emb.inv_freq") {
			return "", false
		}
		return strings.TrimPrefix(n, "model."), true
	}
}

// hfPrefixed is the name transformers gives a tensor named n by
// fileTensors under NamesHF: "transformer." or "model." before it
// (lm_head.weight has none).
func hfPrefixed(s model.Shape, n string) string {
	switch {
	case !s.IsLlama():
		return "transformer." + n
	case n == "lm_head.weight":
		return n
	}
	return "model." + n
}

// shapeMismatch compares the shape (a custom model's name) recorded in an
// Export's metadata with layout l's.
func shapeMismatch(md map[string]string, l *model.Layout) string {
	if md == nil {
		return ""
	}
	if n, ok := md[MetaModel]; ok && n != l.Name || !ok && l.Custom() && md[MetaShape] != "" {
		return fmt.Sprintf("the file's metadata records another model: %s %q, %s %q (layout %q)", MetaModel, n, MetaShape, md[MetaShape], l.Name)
	}
	s := l.Shape
	want := map[string]int{MetaLayers: s.Layers, MetaDim: s.Dim, MetaHeads: s.Heads, MetaVocab: s.Vocab, MetaMaxSeq: s.MaxSeq}
	var diffs []string
	for _, k := range []string{MetaLayers, MetaDim, MetaHeads, MetaVocab, MetaMaxSeq} {
		v, ok := md[k]
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(v); err != nil || n != want[k] {
			diffs = append(diffs, fmt.Sprintf("%s %s (layout %d)", k, v, want[k]))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return "the file's metadata records another shape: " + strings.Join(diffs, ", ")
}

func listSome(names []string) string {
	const show = 8
	if len(names) <= show {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:show], ", ") + fmt.Sprintf(" and %d more", len(names)-show)
}
