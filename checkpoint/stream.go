package checkpoint

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/safetensors"
	"github.com/strata-ai/strata/shard"
)

// Streaming save and load: a checkpoint goes to and from disk one chunk of
// one state at a time, so host memory does not grow with the model.
//
// The unit is the "whole" of chunk c in state k: every rank's shard of it
// side by side, Devices·ShardElems elements (the chunk zero-padded), rank
// r's shard at whole[r·n : (r+1)·n], n = ShardElems·DType.Size(). A save
// pulls each whole from a ChunkFunc and writes rank r's shard to rank r's
// file; a load reads each whole from the rank files (resharded if asked)
// and hands it to a ChunkFunc. Both keep two such buffers, so that the
// disk works on one while the caller fills or consumes the other.

// ChunkFunc fills (SaveStream) or consumes (Reader.Read) whole, chunk c of
// state States[k] across all ranks, as described above. It is called from
// the goroutine that called SaveStream or Read, one call at a time, chunks
// in order and, within a chunk, states in order. whole is reused after the
// call returns: keep no reference to it.
type ChunkFunc func(c, k int, whole []byte) error

// verifyBlockBytes is the read size of the CRC-32C pass of a load.
const verifyBlockBytes = 256 << 10

// wholeBytes is the size of the whole of chunk c in state k.
func (st *State) wholeBytes(c, k int) int {
	return st.Devices * shardBytes(st.States[k], st.Chunks[c].ShardElems)
}

// MaxWholeBytes is the largest whole over every chunk and state: a
// streaming save or load holds two buffers of this size, whatever the
// number of chunks.
func (st *State) MaxWholeBytes() int {
	n := 0
	for c := range st.Chunks {
		for k := range st.States {
			n = max(n, st.wholeBytes(c, k))
		}
	}
	return n
}

// Meta returns st without Data: the description SaveStream needs.
func (st *State) Meta() *State {
	m := *st
	m.Data = nil
	return &m
}

// bufStats counts the buffers the streaming save and load allocate, so
// tests can check the memory bound.
var bufStats struct {
	mu                       sync.Mutex
	totalBytes, largestBytes int64
}

func allocBuf(n int) []byte {
	bufStats.mu.Lock()
	bufStats.totalBytes += int64(n)
	bufStats.largestBytes = max(bufStats.largestBytes, int64(n))
	bufStats.mu.Unlock()
	return make([]byte, n)
}

// SaveStream writes, like SaveWith, the checkpoint of the state meta
// describes (meta.Data is ignored), the same files byte for byte, with the
// shards pulled from fill instead of memory: fill gets each whole zeroed
// and must write every rank's shard of it (see ChunkFunc). The rank files
// are written, each by its own goroutine, while fill produces the next
// whole. Host memory: two buffers of meta.MaxWholeBytes(), whatever the
// model's size.
func SaveStream(dir string, meta *State, fill ChunkFunc, opts Options) error {
	if err := meta.validateMeta(); err != nil {
		return err
	}
	return save(dir, meta, fill, opts)
}

// rankWriter is one rank file being written.
type rankWriter struct {
	path string
	f    *os.File
	crc  uint32
	n    int64
}

func (w *rankWriter) write(p []byte) error {
	// CRC-32C a block at a time just before it is written, while it is in
	// the caches.
	const block = 1 << 20
	for off := 0; off < len(p); off += block {
		b := p[off:min(off+block, len(p))]
		w.crc = crc32.Update(w.crc, castagnoli, b)
		n, err := w.f.Write(b)
		w.n += int64(n)
		if err != nil {
			return pathError("write", w.path, err)
		}
	}
	return nil
}

// pathError is err about path, naming path once: an *fs.PathError about
// it already does ("write F: no space left on device").
func pathError(op, path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path {
		return err
	}
	return fmt.Errorf("%s %s: %w", op, path, err)
}

// writeRankFiles writes the files of ranks lo..hi−1 into tmp, pulling
// their shards from fill (each whole holds those ranks' shards only, side
// by side), and returns their sizes and CRC-32Cs.
func writeRankFiles(tmp string, meta *State, lo, hi int, fill ChunkFunc, opts *Options) (_ []FileInfo, err error) {
	ws := make([]*rankWriter, hi-lo)
	defer func() {
		for _, w := range ws {
			if w != nil && w.f != nil {
				w.f.Close()
			}
		}
	}()
	for i := range ws {
		r := lo + i
		entries := make([]safetensors.Entry, 0, len(meta.Chunks)*len(meta.States))
		for c, ch := range meta.Chunks {
			for _, s := range meta.States {
				dt, n := fileTensor(s, ch.ShardElems)
				entries = append(entries, safetensors.Entry{Name: tensorName(c, s.Kind), DType: dt, Shape: []int{int(n)}, SizeBytes: int64(shardBytes(s, ch.ShardElems))})
			}
		}
		md := map[string]string{"format": FormatName, "strata.rank": strconv.Itoa(r), "strata.devices": strconv.Itoa(meta.Devices), hf.MetaStep: strconv.FormatInt(meta.Step, 10)}
		hdr, err := safetensors.EncodeEntries(entries, md)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(tmp, rankFileName(r))
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return nil, err
		}
		ws[i] = &rankWriter{path: path, f: f}
		if err := ws[i].write(hdr); err != nil {
			return nil, err
		}
	}

	type job struct {
		c, k  int
		whole []byte
	}
	free := make(chan []byte, 2)
	for range 2 {
		free <- allocBuf(meta.MaxWholeBytes() / meta.Devices * (hi - lo))
	}
	jobs := make(chan job)
	failed := make(chan struct{})
	done := make(chan struct{})
	var werr error
	go func() { // the writer: each whole's shards to the rank files, a goroutine per rank
		defer close(done)
		for j := range jobs {
			if werr == nil {
				if werr = writeShards(ws, meta, j.c, j.k, j.whole, opts); werr != nil {
					close(failed)
				}
			}
			free <- j.whole[:cap(j.whole)]
		}
	}()
	var ferr error
fill:
	for c := range meta.Chunks {
		for k, s := range meta.States {
			var buf []byte
			select {
			case <-failed:
				break fill
			case buf = <-free:
			}
			whole := buf[:meta.wholeBytes(c, k)/meta.Devices*(hi-lo)]
			clear(whole)
			if err := fill(c, k, whole); err != nil {
				ferr = fmt.Errorf("chunk %d %s: %w", c, s.Kind, err)
				break fill
			}
			jobs <- job{c, k, whole}
		}
	}
	close(jobs)
	<-done
	if err := errors.Join(ferr, werr); err != nil {
		return nil, err
	}

	infos := make([]FileInfo, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for r, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := w.f.Sync()
			if cerr := w.f.Close(); err == nil {
				err = cerr
			}
			w.f = nil
			if err != nil {
				errs[r] = pathError("write", w.path, err)
			}
			infos[r] = FileInfo{Rank: lo + r, Name: filepath.Base(w.path), SizeBytes: w.n, CRC32C: w.crc}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return infos, nil
}

// writeShards writes each rank's shard of whole (chunk c, state k) to its
// file, the ranks in parallel.
func writeShards(ws []*rankWriter, meta *State, c, k int, whole []byte, opts *Options) error {
	per := shardBytes(meta.States[k], meta.Chunks[c].ShardElems)
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for r, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = w.write(whole[r*per : (r+1)*per])
			if errs[r] == nil && c == len(meta.Chunks)/2 && k == len(meta.States)-1 {
				if err := opts.at("write " + filepath.Base(w.path)); err != nil {
					errs[r] = fmt.Errorf("write %s: %w", w.path, err)
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Reader is an open checkpoint whose rank files have been verified (size,
// CRC-32C, every tensor's name, dtype and shape); Read streams it chunk by
// chunk. Close it when done. It holds one open file per rank and no data.
type Reader struct {
	meta  *State // Data nil
	dir   string
	paths []string
	files []*os.File
	offs  [][][]int64 // [r][c][k]: file offset of rank r's tensor chunk.c.States[k]
	src   *hf.Source  // the manifest's Source
	chat  *data.ChatTemplate
	buf   []byte // ReadChunk's bf16 block
	// lora is the layout with its adapters, for ReadChunk's merge (a LoRA
	// checkpoint's; nil until the first merge).
	lora *model.Layout
}

// Open opens the checkpoint at path (the directory Save wrote into, whose
// "latest" names the checkpoint, or a checkpoint directory itself) and
// verifies every rank file in a streaming pass: its size and CRC-32C first
// (an error names the file and matches ErrChecksum), then the header's
// tensors. Nothing is read into memory but the headers.
func Open(path string) (*Reader, error) { return open(path, nil) }

// OpenFor is Open for a run: it refuses, before reading the rank files, a
// checkpoint of another shape or without the run's states.
func OpenFor(path string, e Expect) (*Reader, error) { return open(path, &e) }

func open(path string, e *Expect) (_ *Reader, err error) {
	m, dir, err := ReadManifest(path)
	if err != nil {
		return nil, err
	}
	specs, err := m.specs()
	if err != nil {
		return nil, err
	}
	meta := &State{Step: m.Step, Devices: m.Devices, Stage: m.Stage, Shape: m.Shape, Model: m.Model, LoRA: m.LoRA, FP16: m.FP16, ShardAlignElems: m.ShardAlignElems,
		Config: []byte(m.Config), Chunks: m.Chunks, States: specs}
	if err := meta.validateMeta(); err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", dir, err)
	}
	if e != nil {
		if err := meta.Match(*e); err != nil {
			return nil, fmt.Errorf("%w (checkpoint %s)", err, path)
		}
	}
	rd := &Reader{meta: meta, dir: dir, paths: make([]string, m.Devices), files: make([]*os.File, m.Devices), offs: make([][][]int64, m.Devices), src: m.Source, chat: m.ChatTemplate}
	defer func() {
		if err != nil {
			rd.Close()
		}
	}()
	errs := make([]error, m.Devices)
	var wg sync.WaitGroup
	for r := range m.Devices {
		rd.paths[r] = filepath.Join(dir, m.Files[r].Name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd.files[r], rd.offs[r], errs[r] = openRankFile(rd.paths[r], m.Files[r], meta)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("checkpoint: load %s: %w", dir, err)
	}
	return rd, nil
}

// openRankFile verifies the rank file at path and returns it open with the
// offset of each of its tensors.
func openRankFile(path string, fi FileInfo, meta *State) (_ *os.File, _ [][]int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := verifyOpen(f, path, fi); err != nil {
		return nil, nil, err
	}
	h, err := safetensors.ReadHeader(f, fi.SizeBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if want := len(meta.Chunks) * len(meta.States); len(h.Tensors) != want {
		return nil, nil, fmt.Errorf("%s: %d tensors, the manifest implies %d", path, len(h.Tensors), want)
	}
	byName := make(map[string]safetensors.TensorInfo, len(h.Tensors))
	for _, t := range h.Tensors {
		byName[t.Name] = t
	}
	offs := make([][]int64, len(meta.Chunks))
	for c, ch := range meta.Chunks {
		offs[c] = make([]int64, len(meta.States))
		for k, s := range meta.States {
			name := tensorName(c, s.Kind)
			t, ok := byName[name]
			if !ok {
				return nil, nil, fmt.Errorf("%s: tensor %s missing", path, name)
			}
			if dt, n := fileTensor(s, ch.ShardElems); t.DType != safetensors.DTypeName(dt) || len(t.Shape) != 1 || t.Shape[0] != n {
				return nil, nil, fmt.Errorf("%s: tensor %s is %s %v, the manifest says %s [%d]", path, name, t.DType, t.Shape, safetensors.DTypeName(dt), n)
			}
			offs[c][k] = h.DataStart() + t.Begin
		}
	}
	return f, offs, nil
}

// verifyOpen checks the size of the open file f against fi, then its
// CRC-32C, reading it from the start in blocks of verifyBlockBytes.
func verifyOpen(f *os.File, path string, fi FileInfo) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != fi.SizeBytes {
		return fmt.Errorf("%s: %d bytes, the manifest says %d (truncated or replaced): %w", path, st.Size(), fi.SizeBytes, ErrChecksum)
	}
	buf := make([]byte, verifyBlockBytes)
	var crc uint32
	var off int64
	for off < fi.SizeBytes {
		b := buf[:min(int64(len(buf)), fi.SizeBytes-off)]
		if _, err := f.ReadAt(b, off); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s: ends at %d, the manifest says %d bytes (truncated): %w", path, off, fi.SizeBytes, ErrChecksum)
			}
			return fmt.Errorf("%s: read at %d: %w", path, off, err)
		}
		crc = crc32.Update(crc, castagnoli, b)
		off += int64(len(b))
	}
	if crc != fi.CRC32C {
		return fmt.Errorf("%s: crc32c %#08x, the manifest says %#08x (file corrupted): %w", path, crc, fi.CRC32C, ErrChecksum)
	}
	return nil
}

// State is the checkpoint's description as saved (step, devices, stage,
// shape, alignment, config, chunks, states), without Data.
func (rd *Reader) State() *State { return rd.meta.Meta() }

// Dir is the checkpoint's directory.
func (rd *Reader) Dir() string { return rd.dir }

// Read streams the checkpoint to fn as the run to describes it: for every
// chunk c and every state to.States[k], the whole of to.Devices ranks with
// shards of ShardElems(chunk, to.Devices, to.ShardAlignElems) elements.
// Saved for the same device count and alignment, the shards are the saved
// bytes; otherwise the checkpoint is resharded on the fly: the chunk's
// elements are read from the source shards that hold them into their
// place in the whole (the element i of a chunk is at the same place in the
// whole whatever the device count), and the new padding is zero. Host
// memory: two buffers of the largest whole. An error stops the stream: fn
// may have consumed some chunks (Open has verified every file, so only an
// I/O error or fn's own can stop it midway).
func (rd *Reader) Read(to Expect, fn ChunkFunc) error {
	meta := rd.meta
	if err := meta.Match(to); err != nil {
		return fmt.Errorf("%w (checkpoint %s)", err, rd.dir)
	}
	if to.Devices < 1 || to.ShardAlignElems < 1 {
		return fmt.Errorf("checkpoint: read for %d devices with alignment %d", to.Devices, to.ShardAlignElems)
	}
	dst := &State{Devices: to.Devices, ShardAlignElems: to.ShardAlignElems, States: to.States, Chunks: make([]ChunkInfo, len(meta.Chunks))}
	for c, ch := range meta.Chunks {
		ch.ShardElems = ShardElems(ch.Elems, to.Devices, to.ShardAlignElems)
		dst.Chunks[c] = ch
	}
	src := make([]int, len(to.States)) // to.States[k] is meta.States[src[k]]
	for k, s := range to.States {
		src[k] = meta.StateIndex(s.Kind)
	}
	verbatim := to.Devices == meta.Devices && to.ShardAlignElems == meta.ShardAlignElems
	var convBuf []byte // a whole of the checkpoint's, for the states read through fp32

	type job struct {
		c, k  int
		whole []byte
		err   error
	}
	free := make(chan []byte, 2)
	for range 2 {
		free <- allocBuf(dst.MaxWholeBytes())
	}
	full := make(chan job)
	stop := make(chan struct{})
	go func() { // the reader: each whole from the rank files
		defer close(full)
		for c := range dst.Chunks {
			for k := range dst.States {
				var buf []byte
				select {
				case <-stop:
					return
				case buf = <-free:
				}
				whole := buf[:dst.wholeBytes(c, k)]
				var err error
				from, fromElems := meta.States[src[k]], meta.Chunks[c].ShardElems
				if to, toElems := dst.States[k], dst.Chunks[c].ShardElems; needsConversion(from, to, fromElems, toElems) {
					convBuf = slices.Grow(convBuf[:0], meta.wholeBytes(c, src[k]))[:meta.wholeBytes(c, src[k])]
					if err = rd.readWhole(c, src[k], convBuf, true); err == nil {
						convertChunk(from, to, fromElems, toElems, meta.Devices, dst.Devices, meta.Chunks[c].Elems, convBuf, whole)
					}
				} else {
					err = rd.readWhole(c, src[k], whole, verbatim)
				}
				select {
				case full <- job{c, k, whole, err}:
				case <-stop:
					return
				}
				if err != nil {
					return
				}
			}
		}
	}()
	var err error
	for j := range full {
		if j.err != nil {
			err = fmt.Errorf("checkpoint: load %s: %w", rd.dir, j.err)
			break
		}
		if err = fn(j.c, j.k, j.whole); err != nil {
			break
		}
		free <- j.whole[:cap(j.whole)]
	}
	close(stop)
	for range full { // let the reader finish
	}
	return err
}

// readWhole reads chunk c of the checkpoint's state k into whole: each
// saved shard whole (verbatim), or each shard's part of the chunk's
// elements into its place, the rest zero. The ranks' files are read in
// parallel.
func (rd *Reader) readWhole(c, k int, whole []byte, verbatim bool) error {
	meta := rd.meta
	shardElems, elems := meta.Chunks[c].ShardElems, meta.Chunks[c].Elems
	if !verbatim {
		clear(whole)
	}
	errs := make([]error, meta.Devices)
	var wg sync.WaitGroup
	for r := range meta.Devices {
		per := shardBytes(meta.States[k], shardElems)
		lo, hi := r*per, (r+1)*per
		if !verbatim { // elements: not a Q8 state (convertChunk reshards those)
			sz := meta.States[k].DType.Size()
			lo, hi = r*shardElems*sz, min((r+1)*shardElems, elems)*sz
		}
		if lo >= hi {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := whole[lo:hi]
			if _, err := rd.files[r].ReadAt(p, rd.offs[r][c][k]); err != nil {
				errs[r] = fmt.Errorf("%s: read tensor %s (%d bytes at %d): %w", rd.paths[r], tensorName(c, meta.States[k].Kind), len(p), rd.offs[r][c][k], err)
				return
			}
			if verbatim && meta.States[k].DType == dtype.Q8 {
				// int8 moments: scales and codes as the encoder writes them
				// (the CRC only says the file is as it was written).
				if err := momentView(meta.States[k], shardElems, p).Check(); err != nil {
					errs[r] = fmt.Errorf("%s: tensor %s: %w; not a state Strata saves: resume from another checkpoint", rd.paths[r], tensorName(c, meta.States[k].Kind), err)
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Shape is the checkpoint's model shape (zero for a custom model's: see
// State.Model).
func (rd *Reader) Shape() model.Shape { return rd.meta.Shape }

// readBlockBytes bounds the block ReadChunk reads a bf16 chunk through.
const readBlockBytes = 4 << 20

// Source is the manifest's Source: where the run's initial weights came
// from; nil when it started from the seeded initialisation.
func (rd *Reader) Source() *hf.Source { return rd.src }

// ChatTemplate is the manifest's ChatTemplate: the run's chat template,
// nil when it recorded none.
func (rd *Reader) ChatTemplate() *data.ChatTemplate { return rd.chat }

// ReadChunk fills dst, exactly the length of chunk c, with the
// checkpoint's weights of chunk c as fp32: the master weights when it holds
// them, else the params (bf16 widened exactly), each rank's part of the
// chunk read from its file with pread (bf16 through a block of at most
// 4 MiB). Weights only: the optimizer's moments are not read. It makes a
// Reader a source of initial weights for another run (engine.Options.Init)
// and of the weights eval and generate load. A LoRA checkpoint's block
// chunk comes with its adapters merged in (model.Layout.MergeLoRA: the
// model the run trained), its adapter chunks as they are.
func (rd *Reader) ReadChunk(c int, dst []float32) error {
	if err := rd.readChunk(c, dst); err != nil {
		return err
	}
	meta := rd.meta
	if meta.LoRA == nil {
		return nil
	}
	if rd.lora == nil {
		l, err := meta.Layout()
		if err != nil {
			return err
		}
		rd.lora = l
	}
	l := rd.lora
	layer := l.ChunkLayer(c) // a block's chunk, or one of its experts'
	if layer < 0 {
		return nil
	}
	a := l.AdapterChunk(layer)
	adapter := make([]float32, l.Chunks[a].Len)
	if err := rd.readChunk(a, adapter); err != nil {
		return err
	}
	return l.MergeLoRA(c, dst, adapter)
}

func (rd *Reader) readChunk(c int, dst []float32) error {
	meta := rd.meta
	if c < 0 || c >= len(meta.Chunks) || len(dst) != meta.Chunks[c].Elems {
		panic(fmt.Sprintf("checkpoint: read chunk %d into %d values (%d chunks)", c, len(dst), len(meta.Chunks)))
	}
	k := meta.StateIndex(shard.Master)
	if k < 0 {
		k = meta.StateIndex(shard.Param)
	}
	if k < 0 {
		return fmt.Errorf("checkpoint: %s holds neither master weights nor params (%s)", rd.dir, specList(meta.States))
	}
	dt := meta.States[k].DType
	shardElems := meta.Chunks[c].ShardElems
	for r := range meta.Devices {
		lo, hi := r*shardElems, min((r+1)*shardElems, len(dst))
		for at := lo; at < hi; {
			n := hi - at
			var b []byte
			if dt == dtype.F32 {
				b = dtype.Bytes(dst[at : at+n])
			} else {
				n = min(n, readBlockBytes/dt.Size())
				if cap(rd.buf) < n*dt.Size() {
					rd.buf = make([]byte, n*dt.Size())
				}
				b = rd.buf[:n*dt.Size()]
			}
			off := rd.offs[r][c][k] + int64((at-lo)*dt.Size())
			if _, err := rd.files[r].ReadAt(b, off); err != nil {
				return fmt.Errorf("checkpoint: %s: read tensor %s (%d bytes at %d): %w", rd.paths[r], tensorName(c, meta.States[k].Kind), len(b), off, err)
			}
			if dt.Half() {
				dtype.Widen(dt, dst[at:at+n], dtype.Uint16s(b))
			}
			at += n
		}
	}
	return nil
}

// Close closes the rank files.
func (rd *Reader) Close() error {
	var errs []error
	for i, f := range rd.files {
		if f != nil {
			errs = append(errs, f.Close())
			rd.files[i] = nil
		}
	}
	return errors.Join(errs...)
}
