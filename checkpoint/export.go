package checkpoint

import (
	"context"
	"fmt"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// A training checkpoint's weights out: as one safetensors file
// (ExportCheckpoint, ExportState) or a Hugging Face directory (hf.ExportDir),
// through package hf's writers.

// ExportCheckpoint writes the weights of the training checkpoint at src (a
// directory whose "latest" names one, or a checkpoint directory) to a
// safetensors file at dst: the fp32 master weights when it holds them,
// else the params, as ExportState of the loaded checkpoint writes them,
// the same bytes. It streams: every rank file's size and CRC-32C is
// verified first (Open), then the chunks are read one at a time, all
// ranks' shards side by side (Reader.Read), and written as they come.
// opts.Step 0 means the checkpoint's step. It returns the checkpoint's
// description. Host memory: the Reader's two buffers of the largest
// padded chunk of the exported state, 256 KiB per rank file for the CRC
// pass, and hf.ExportStream's buffers, whatever the model's size. ctx is
// checked before each chunk: a cancelled export writes no dst.
func ExportCheckpoint(ctx context.Context, dst, src string, opts hf.ExportOptions) (*State, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cw, err := openCheckpointWeights(ctx, src)
	if err != nil {
		return nil, err
	}
	defer cw.rd.Close()
	if opts.Step == 0 {
		opts.Step = cw.meta.Step
	}
	if err := hf.ExportStream(dst, cw.layout, opts, cw.produce); err != nil {
		return nil, err
	}
	return cw.meta, nil
}

// checkpointWeights are the weights of an open training checkpoint, to
// hand to an hf.ExportWriter: the fp32 master weights when it holds them,
// else the params.
type checkpointWeights struct {
	ctx    context.Context // checked before each chunk
	rd     *Reader
	meta   *State
	layout *model.Layout
	k      int // the state exported
}

func openCheckpointWeights(ctx context.Context, src string) (*checkpointWeights, error) {
	rd, err := Open(src)
	if err != nil {
		return nil, err
	}
	meta := rd.State()
	k := meta.StateIndex(shard.Master)
	if k < 0 {
		k = meta.StateIndex(shard.Param)
	}
	if k < 0 {
		rd.Close()
		return nil, fmt.Errorf("checkpoint: export: the checkpoint holds neither master weights nor params (%s)", specList(meta.States))
	}
	l, err := meta.Layout()
	if err != nil {
		rd.Close()
		return nil, err
	}
	return &checkpointWeights{ctx: ctx, rd: rd, meta: meta, layout: l, k: k}, nil
}

// produce hands every chunk of the exported state to w, all ranks'
// shards side by side (element i of the chunk is element i of the whole).
func (cw *checkpointWeights) produce(w *hf.ExportWriter) error {
	meta, spec := cw.meta, cw.meta.States[cw.k]
	to := Expect{Shape: meta.Shape, Model: meta.Model, LoRA: meta.LoRA, Chunks: meta.Chunks, Devices: meta.Devices, ShardAlignElems: meta.ShardAlignElems, States: []StateSpec{spec}}
	return cw.rd.Read(to, func(c, _ int, whole []byte) error {
		if err := ctxErr(cw.ctx); err != nil {
			return err
		}
		b := whole[:meta.Chunks[c].Elems*spec.DType.Size()]
		switch spec.DType {
		case dtype.BF16:
			return w.BF16(c, dtype.Uint16s(b))
		case dtype.F16: // fp16 params without master weights: widened exactly
			v := make([]float32, len(b)/2)
			dtype.Widen(dtype.F16, v, dtype.Uint16s(b))
			return w.F32(c, v)
		}
		return w.F32(c, dtype.Float32s(b))
	})
}

// ExportHF writes the weights of the training checkpoint at src
// (as ExportCheckpoint names and reads it: every rank file verified first,
// then the fp32 master weights, else the params, one chunk at a time) as a
// Hugging Face model directory at dst (hf.ExportDir). opts.Source nil takes
// the checkpoint's own (Manifest.Source): the tokenizer and config.json
// of the model its run started from; opts.ChatTemplate nil, the
// template it recorded (Manifest.ChatTemplate). It returns the checkpoint's
// description as well. ctx is checked before each chunk.
//
// A LoRA checkpoint is written merged: every adapted weight W +
// scaling·B·A. When its run started from a Hugging Face directory
// (Manifest.Source, no Init), W is that directory's, as PEFT merges an
// adapter into its base: with opts.DType 0 every tensor keeps its dtype
// there (hf.DirOptions.KeepDTypes), an untouched one byte for byte, and
// the merged ones are rounded once, to their base's dtype. Otherwise (the
// directory gone, or of another shape: a Note says so; a run from a
// Strata checkpoint or the seeded initialisation) W is the checkpoint's
// frozen base, in the run's precision.
func ExportHF(ctx context.Context, dst, src string, opts hf.DirOptions) (*hf.DirExport, *State, error) {
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	cw, err := openCheckpointWeights(ctx, src)
	if err != nil {
		return nil, nil, err
	}
	defer cw.rd.Close()
	if opts.Source == nil {
		opts.Source = cw.rd.Source()
	}
	if opts.ChatTemplate == nil {
		opts.ChatTemplate = cw.rd.ChatTemplate()
	}
	l, produce := cw.layout, cw.produce
	var note string
	if l.LoRA != nil {
		l, produce = l.Base(), cw.produceMerged(nil)
		base, why := cw.openBase(opts.Source)
		if base != nil {
			defer base.Close()
			produce = cw.produceMerged(base)
			if opts.DType == 0 {
				opts.KeepDTypes = base
			}
		}
		note = why
	}
	out, err := hf.ExportDir(dst, l, opts, produce)
	if err != nil {
		return nil, nil, err
	}
	if note != "" {
		out.Notes = append(out.Notes, note)
	}
	return out, cw.meta, nil
}

// openBase opens the Hugging Face directory a LoRA run started from
// (source, without Init), the base its adapters merge into; nil for
// another source, with a note when the directory is there no more or is
// of another model than the run's base.
func (cw *checkpointWeights) openBase(source *hf.Source) (*hf.Model, string) {
	if source == nil || source.Format != hf.SourceHF || source.Init != "" {
		return nil, ""
	}
	base := cw.layout.Base()
	m, err := hf.Open(source.Path)
	if err != nil {
		return nil, fmt.Sprintf("the adapters are merged into the run's frozen base (in its precision), not into the base model's own weights: %v", err)
	}
	if !sameChunks(m.Layout, base) {
		m.Close()
		return nil, fmt.Sprintf("the adapters are merged into the run's frozen base (in its precision): the base model %s is now %s, the run's was %s", source.Path, m.Layout.Shape, base.Shape)
	}
	return m, ""
}

// sameChunks says whether a and b lay out the same tensors.
func sameChunks(a, b *model.Layout) bool {
	if len(a.Chunks) != len(b.Chunks) {
		return false
	}
	for c := range a.Chunks {
		x, y := a.Chunks[c], b.Chunks[c]
		if x.Len != y.Len || len(x.Tensors) != len(y.Tensors) {
			return false
		}
		for i := range x.Tensors {
			if x.Tensors[i].Name != y.Tensors[i].Name || x.Tensors[i].Offset != y.Tensors[i].Offset || x.Tensors[i].Len != y.Tensors[i].Len {
				return false
			}
		}
	}
	return true
}

// produceMerged hands w the base chunks of a LoRA checkpoint with the
// adapters merged in, one chunk at a time, in fp32: W from base (each
// value exactly as its file stores it) when it is set, else the
// checkpoint's own (Reader.ReadChunk).
func (cw *checkpointWeights) produceMerged(base *hf.Model) func(w *hf.ExportWriter) error {
	return func(w *hf.ExportWriter) error {
		l := cw.layout
		most := 0
		for _, ch := range l.Chunks {
			most = max(most, ch.Len)
		}
		buf, adapter := make([]float32, most), make([]float32, most)
		for c, ch := range l.Base().Chunks {
			if err := ctxErr(cw.ctx); err != nil {
				return err
			}
			v := buf[:ch.Len]
			switch {
			case base == nil:
				if err := cw.rd.ReadChunk(c, v); err != nil {
					return err
				}
			default:
				if err := base.ReadChunk(c, v); err != nil {
					return err
				}
				if layer := l.ChunkLayer(c); layer >= 0 { // a block's chunk, or one of its experts'
					a := l.AdapterChunk(layer)
					if err := cw.rd.readChunk(a, adapter[:l.Chunks[a].Len]); err != nil {
						return err
					}
					if err := l.MergeLoRA(c, v, adapter[:l.Chunks[a].Len]); err != nil {
						return err
					}
				}
			}
			if err := w.F32(c, v); err != nil {
				return err
			}
		}
		return nil
	}
}

// ExportPEFT writes the LoRA adapters of the training checkpoint at src
// (opened as ExportHF opens one) as a PEFT adapter directory at dst
// (hf.ExportPEFT), the base named by the run's source (its --init
// directory or checkpoint, hf.Source.BaseModel; "" for a run from the
// seeded initialisation). A checkpoint
// without adapters is refused. It returns the files written and
// hf.ExportPEFT's notes. ctx is checked before each chunk.
func ExportPEFT(ctx context.Context, dst, src string, dt dtype.DType) (files, notes []string, _ *State, _ error) {
	cw, err := openCheckpointWeights(ctx, src)
	if err != nil {
		return nil, nil, nil, err
	}
	defer cw.rd.Close()
	if cw.layout.LoRA == nil {
		return nil, nil, nil, fmt.Errorf("checkpoint: export --format peft: %s was not trained with LoRA (strata.lora): it has no adapters; --format hf exports its weights", cw.rd.dir)
	}
	read := func(c int, dst []float32) error {
		if err := ctxErr(ctx); err != nil {
			return err
		}
		return cw.rd.ReadChunk(c, dst)
	}
	files, notes, err = hf.ExportPEFT(dst, cw.layout, cw.rd.Source().BaseModel(), dt, read)
	return files, notes, cw.meta, err
}

// ExportState writes the model's weights from a training checkpoint as a
// safetensors file (hf.Export): the fp32 master weights when the checkpoint
// has them (the exact values the optimizer holds), else the params.
func ExportState(path string, st *State, opts hf.ExportOptions) error {
	if err := st.Validate(); err != nil {
		return err
	}
	l, err := st.Layout()
	if err != nil {
		return err
	}
	k := st.StateIndex(shard.Master)
	if k < 0 {
		k = st.StateIndex(shard.Param)
	}
	if k < 0 {
		return fmt.Errorf("checkpoint: export: the checkpoint holds neither master weights nor params (%s)", specList(st.States))
	}
	if opts.Step == 0 {
		opts.Step = st.Step
	}
	if st.States[k].DType == dtype.BF16 {
		chunks := make([][]uint16, len(st.Chunks))
		for c := range st.Chunks {
			chunks[c] = dtype.Uint16s(st.Gather(c, k))
		}
		return hf.Export(path, l, chunks, opts)
	}
	chunks := make([][]float32, len(st.Chunks))
	for c := range st.Chunks {
		if st.States[k].DType == dtype.F16 { // fp16 params without master weights: widened exactly
			g := dtype.Uint16s(st.Gather(c, k))
			chunks[c] = make([]float32, len(g))
			dtype.Widen(dtype.F16, chunks[c], g)
			continue
		}
		chunks[c] = dtype.Float32s(st.Gather(c, k))
	}
	return hf.Export(path, l, chunks, opts)
}
