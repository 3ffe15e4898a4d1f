package checkpoint

import (
	"fmt"
	"io"
	"unsafe"

	"github.com/strata-ai/strata/internal/dtype"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/shard"
)

// Streaming export: a model's weights go to one safetensors file chunk by
// chunk, so host memory does not grow with the model. The header comes
// first (every tensor's name, dtype and shape follow from the layout and
// the options), then the tensors in header order, which is the layout's:
// chunk by chunk, and within a chunk by offset. A chunk's tensors lie
// contiguously in it, so each chunk is encoded (and a Conv1D weight
// transposed) as soon as it is handed over, and can be dropped after.

// ExportWriter takes a model's chunks during ExportStream, in order, each
// once, and writes the tensors of each as it gets them. It holds one
// buffer of the largest tensor in the file's dtype.
type ExportWriter struct {
	w    io.Writer
	l    *model.Layout
	dt   dtype.DType
	fts  []fileTensor // in file order
	at   int          // fts[at] is the next tensor to write
	next int          // the next chunk expected
	buf  []byte
	// begin, when set, is called before tensor fts[i] is written (ExportHF
	// starts each weight file there, setting w); nil for one file.
	begin func(i int) error
}

// F32 writes the tensors of chunk c from its fp32 values (at least the
// chunk's length; padding beyond it is ignored). data is not kept after
// the call returns.
func (w *ExportWriter) F32(c int, data []float32) error {
	return w.put(c, chunkData{f32: data})
}

// BF16 is F32 from bf16 values; to an F32 file every value widens exactly.
func (w *ExportWriter) BF16(c int, data []uint16) error {
	return w.put(c, chunkData{b16: data})
}

func (w *ExportWriter) put(c int, src chunkData) error {
	if c != w.next || c >= len(w.l.Chunks) {
		panic(fmt.Sprintf("checkpoint: export: chunk %d handed over, want chunk %d of %d (every chunk once, in order)", c, w.next, len(w.l.Chunks)))
	}
	ch := w.l.Chunks[c]
	if src.len() < ch.Len {
		return fmt.Errorf("export: chunk %d (%s) has %d elements, layout needs %d", c, ch.Name, src.len(), ch.Len)
	}
	w.next++
	for ; w.at < len(w.fts) && w.fts[w.at].chunk == c; w.at++ {
		ft := w.fts[w.at]
		if w.begin != nil {
			if err := w.begin(w.at); err != nil {
				return err
			}
		}
		if err := w.writeTensor(src, ft); err != nil {
			return fmt.Errorf("export: tensor %s: %w", ft.name, err)
		}
	}
	return nil
}

// writeTensor writes ft from its chunk's data: straight from src's memory
// when the bytes are the same, else encoded into the buffer.
func (w *ExportWriter) writeTensor(src chunkData, ft fileTensor) error {
	off, n := ft.t.Offset, ft.t.Len
	if littleEndian && !ft.transposed && n > 0 {
		switch {
		case w.dt == dtype.F32 && src.f32 != nil:
			_, err := w.w.Write(unsafe.Slice((*byte)(unsafe.Pointer(&src.f32[off])), 4*n))
			return err
		case w.dt == dtype.BF16 && src.b16 != nil:
			_, err := w.w.Write(unsafe.Slice((*byte)(unsafe.Pointer(&src.b16[off])), 2*n))
			return err
		}
	}
	out := w.buf[:n*w.dt.Size()]
	encodeTensor(out, w.dt, src, ft)
	_, err := w.w.Write(out)
	return err
}

// ExportStream writes every named tensor of layout to a safetensors file
// at path, atomically, as Export does and the same bytes, with the chunks
// handed over by produce: it must call w.F32 or w.BF16 for every chunk of
// the layout, in order, and return nil, or the file is not written (a
// chunk out of order is a broken contract and panics). The header is
// written before produce runs. Host memory: one buffer of the largest
// tensor in the file's dtype and a 1 MiB write buffer, whatever the
// model's size, besides what produce holds (one chunk at a time is
// enough).
func ExportStream(path string, layout *model.Layout, opts ExportOptions, produce func(w *ExportWriter) error) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	opts.defaults()
	md, err := exportMetadata(layout, opts)
	if err != nil {
		return err
	}
	fts := fileTensors(layout, opts.Names)
	entries := make([]entry, len(fts))
	maxBytes := 0
	for i, ft := range fts {
		n := ft.t.Len * opts.DType.Size()
		entries[i] = entry{name: ft.name, dt: opts.DType, shape: ft.shape, sizeBytes: int64(n)}
		maxBytes = max(maxBytes, n)
	}
	hdr, err := encodeHeader(entries, md)
	if err != nil {
		return fmt.Errorf("checkpoint: export: %w", err)
	}
	return writeFileAtomic(path, func(bw io.Writer) error {
		if _, err := bw.Write(hdr); err != nil {
			return err
		}
		w := &ExportWriter{w: bw, l: layout, dt: opts.DType, fts: fts, buf: make([]byte, maxBytes)}
		if err := produce(w); err != nil {
			return err
		}
		if w.next != len(layout.Chunks) {
			return fmt.Errorf("export: %d of the layout's %d chunks handed over", w.next, len(layout.Chunks))
		}
		return nil
	})
}

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
// pass, and ExportStream's buffers, whatever the model's size.
func ExportCheckpoint(dst, src string, opts ExportOptions) (*State, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cw, err := openCheckpointWeights(src)
	if err != nil {
		return nil, err
	}
	defer cw.rd.Close()
	if opts.Step == 0 {
		opts.Step = cw.meta.Step
	}
	if err := ExportStream(dst, cw.layout, opts, cw.produce); err != nil {
		return nil, err
	}
	return cw.meta, nil
}

// checkpointWeights are the weights of an open training checkpoint, to
// hand to an ExportWriter: the fp32 master weights when it holds them,
// else the params.
type checkpointWeights struct {
	rd     *Reader
	meta   *State
	layout *model.Layout
	k      int // the state exported
}

func openCheckpointWeights(src string) (*checkpointWeights, error) {
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
	return &checkpointWeights{rd: rd, meta: meta, layout: l, k: k}, nil
}

// produce hands every chunk of the exported state to w, all ranks'
// shards side by side (element i of the chunk is element i of the whole).
func (cw *checkpointWeights) produce(w *ExportWriter) error {
	meta, spec := cw.meta, cw.meta.States[cw.k]
	to := Expect{Shape: meta.Shape, Model: meta.Model, Chunks: meta.Chunks, Devices: meta.Devices, ShardAlignElems: meta.ShardAlignElems, States: []StateSpec{spec}}
	return cw.rd.Read(to, func(c, _ int, whole []byte) error {
		b := whole[:meta.Chunks[c].Elems*spec.DType.Size()]
		if spec.DType == dtype.BF16 {
			return w.BF16(c, bf16sOf(b))
		}
		return w.F32(c, float32sOf(b))
	})
}

// float32sOf is b's little-endian fp32 values: b itself when the host's
// layout and b's alignment allow, else a copy.
func float32sOf(b []byte) []float32 {
	if v := float32View(b); v != nil && 4*len(v) == len(b) {
		return v
	}
	return Float32s(b)
}

// bf16sOf is float32sOf for bf16.
func bf16sOf(b []byte) []uint16 {
	if littleEndian && len(b) >= 2 && len(b)%2 == 0 && uintptr(unsafe.Pointer(&b[0]))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
	}
	return BF16s(b)
}
