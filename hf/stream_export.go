package hf

import (
	"fmt"
	"io"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/internal/durable"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
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
	// begin, when set, is called before tensor fts[i] is written (ExportDir
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
		panic(fmt.Sprintf("hf: export: chunk %d handed over, want chunk %d of %d (every chunk once, in order)", c, w.next, len(w.l.Chunks)))
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
	dt := ft.dtypeOr(w.dt)
	if !ft.transposed && n > 0 {
		switch {
		case dt == dtype.F32 && src.f32 != nil:
			_, err := w.w.Write(dtype.Bytes(src.f32[off : off+n]))
			return err
		case dt == dtype.BF16 && src.b16 != nil:
			_, err := w.w.Write(dtype.Bytes(src.b16[off : off+n]))
			return err
		}
	}
	out := w.buf[:n*dt.Size()]
	encodeTensor(out, dt, src, ft)
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
	entries := make([]safetensors.Entry, len(fts))
	maxBytes := 0
	for i, ft := range fts {
		n := ft.t.Len * opts.DType.Size()
		entries[i] = safetensors.Entry{Name: ft.name, DType: opts.DType, Shape: ft.shape, SizeBytes: int64(n)}
		maxBytes = max(maxBytes, n)
	}
	hdr, err := safetensors.EncodeEntries(entries, md)
	if err != nil {
		return fmt.Errorf("hf: export: %w", err)
	}
	err = durable.WriteFile(path, 1<<20, func(bw io.Writer) error {
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
	if err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}
