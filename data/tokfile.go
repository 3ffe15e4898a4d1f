package data

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// The token file: a dataset tokenized once, read in windows with pread.
//
//	header   64 bytes, little-endian: "STRATATK", version 1 (u32), width
//	         (u32: 1, 2 or 4 bytes per id), vocabulary size, examples,
//	         tokens, and the offsets of the three sections (u64 each)
//	ids      tokens × width bytes: every example's ids, one after another
//	mask     one bit per token (bit i%8 of byte i/8): 1 when predicting the
//	         token counts in the loss
//	offsets  (examples + 1) × u64: the first token of each example, then
//	         the token count
//
// The width is the smallest that holds the vocabulary: a byte up to 256
// ids, two up to 65536, else four. The writer streams: ids go to the file
// as they come, the mask bits and offsets to two scratch files appended at
// the end, so nothing grows with the dataset but the files.

const (
	tokMagic      = "STRATATK"
	tokVersion    = 1
	tokHeaderSize = 64
)

// widthFor is the bytes per id of a vocabulary of vocab ids.
func widthFor(vocab int) int {
	switch {
	case vocab <= 1<<8:
		return 1
	case vocab <= 1<<16:
		return 2
	}
	return 4
}

// tokenWriter writes a token file.
type tokenWriter struct {
	f, maskF, offF *os.File
	ids, mask, off *bufio.Writer
	width, vocab   int
	tokens         int64
	examples       int64
	bits           byte // the mask byte being filled
	open           bool // an example written in parts is not finished
	buf            []byte
}

// newTokenWriter creates a token file in dir (os.TempDir when "") for a
// vocabulary of vocab ids. The file and its scratch files are removed
// from the directory at once: they live while they are open.
func newTokenWriter(dir string, vocab int) (*tokenWriter, error) {
	w := &tokenWriter{width: widthFor(vocab), vocab: vocab}
	for _, f := range []**os.File{&w.f, &w.maskF, &w.offF} {
		var err error
		if *f, err = os.CreateTemp(dir, "strata-*.tokens"); err != nil {
			w.close()
			return nil, fmt.Errorf("data: token file: %w", err)
		}
		os.Remove((*f).Name())
	}
	if _, err := w.f.Write(make([]byte, tokHeaderSize)); err != nil {
		w.close()
		return nil, fmt.Errorf("data: token file: %w", err)
	}
	w.ids, w.mask, w.off = bufio.NewWriterSize(w.f, 1<<16), bufio.NewWriterSize(w.maskF, 1<<12), bufio.NewWriterSize(w.offF, 1<<12)
	return w, nil
}

func (w *tokenWriter) close() {
	for _, f := range []*os.File{w.f, w.maskF, w.offF} {
		if f != nil {
			f.Close()
		}
	}
}

// add appends one example (train may be nil: every token trained).
func (w *tokenWriter) add(ids []int32, train []bool) error { return w.write(ids, train, true) }

// addPart appends ids to an example written in parts (every token
// trained), the last part with last.
func (w *tokenWriter) addPart(ids []int32, last bool) error { return w.write(ids, nil, last) }

func (w *tokenWriter) write(ids []int32, train []bool, end bool) error {
	if !w.open {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(w.tokens))
		if _, err := w.off.Write(b[:]); err != nil {
			return err
		}
		w.open = true
	}
	if need := len(ids) * w.width; cap(w.buf) < need {
		w.buf = make([]byte, need)
	}
	buf := w.buf[:len(ids)*w.width]
	for i, id := range ids {
		switch w.width {
		case 1:
			buf[i] = byte(id)
		case 2:
			binary.LittleEndian.PutUint16(buf[2*i:], uint16(id))
		default:
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(id))
		}
	}
	if _, err := w.ids.Write(buf); err != nil {
		return err
	}
	for i := range ids {
		if train == nil || train[i] {
			w.bits |= 1 << (w.tokens % 8)
		}
		w.tokens++
		if w.tokens%8 == 0 {
			if err := w.mask.WriteByte(w.bits); err != nil {
				return err
			}
			w.bits = 0
		}
	}
	if end {
		w.examples++
		w.open = false
	}
	return nil
}

// finish completes the file and returns it opened for reading.
func (w *tokenWriter) finish() (*TokenFile, error) {
	defer func() {
		w.maskF.Close()
		w.offF.Close()
	}()
	err := func() error {
		if w.tokens%8 != 0 {
			if err := w.mask.WriteByte(w.bits); err != nil {
				return err
			}
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(w.tokens))
		if _, err := w.off.Write(b[:]); err != nil {
			return err
		}
		for _, bw := range []*bufio.Writer{w.ids, w.mask, w.off} {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		maskOff := tokHeaderSize + w.tokens*int64(w.width)
		offOff := maskOff + (w.tokens+7)/8
		for _, part := range []*os.File{w.maskF, w.offF} {
			if _, err := part.Seek(0, io.SeekStart); err != nil {
				return err
			}
			if _, err := io.Copy(w.f, part); err != nil {
				return err
			}
		}
		h := make([]byte, tokHeaderSize)
		copy(h, tokMagic)
		binary.LittleEndian.PutUint32(h[8:], tokVersion)
		binary.LittleEndian.PutUint32(h[12:], uint32(w.width))
		for i, v := range []int64{int64(w.vocab), w.examples, w.tokens, tokHeaderSize, maskOff, offOff} {
			binary.LittleEndian.PutUint64(h[16+8*i:], uint64(v))
		}
		_, err := w.f.WriteAt(h, 0)
		return err
	}()
	if err != nil {
		w.f.Close()
		return nil, fmt.Errorf("data: write token file: %w", err)
	}
	tf, err := newTokenFile(w.f, w.f.Name())
	if err != nil {
		w.f.Close()
		return nil, err
	}
	return tf, nil
}

// TokenFile is a token file open for reading: every read is a pread of
// the window asked for, so memory does not depend on its size. Safe for
// concurrent reads; Close once.
type TokenFile struct {
	f                       *os.File
	name                    string
	width, vocab            int
	examples, tokens        int64
	idsOff, maskOff, offOff int64
}

// ErrTokenFile says a token file is damaged or not one.
var ErrTokenFile = errors.New("data: not a valid token file")

func newTokenFile(f *os.File, name string) (*TokenFile, error) {
	h := make([]byte, tokHeaderSize)
	if _, err := f.ReadAt(h, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenFile, name, err)
	}
	if string(h[:8]) != tokMagic || binary.LittleEndian.Uint32(h[8:]) != tokVersion {
		return nil, fmt.Errorf("%w: %s: bad magic or version", ErrTokenFile, name)
	}
	t := &TokenFile{f: f, name: name, width: int(binary.LittleEndian.Uint32(h[12:]))}
	v := make([]int64, 6)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(h[16+8*i:]))
	}
	t.vocab, t.examples, t.tokens, t.idsOff, t.maskOff, t.offOff = int(v[0]), v[1], v[2], v[3], v[4], v[5]
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", name, err)
	}
	if (t.width != 1 && t.width != 2 && t.width != 4) || t.maskOff != t.idsOff+t.tokens*int64(t.width) ||
		t.offOff != t.maskOff+(t.tokens+7)/8 || fi.Size() != t.offOff+8*(t.examples+1) {
		return nil, fmt.Errorf("%w: %s: sections do not match the header", ErrTokenFile, name)
	}
	return t, nil
}

// Examples is the number of examples.
func (t *TokenFile) Examples() int64 { return t.examples }

// Tokens is the number of tokens of all examples.
func (t *TokenFile) Tokens() int64 { return t.tokens }

// Width is the bytes per id.
func (t *TokenFile) Width() int { return t.width }

// Bytes is the file's size.
func (t *TokenFile) Bytes() int64 { return t.offOff + 8*(t.examples+1) }

// Close closes the file (its name was removed when it was written).
func (t *TokenFile) Close() error { return t.f.Close() }

func (t *TokenFile) readAt(b []byte, off int64) error {
	if _, err := t.f.ReadAt(b, off); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("data: token file %s: read %d bytes at offset %d: %w", t.name, len(b), off, err)
	}
	return nil
}

// Span returns the tokens [start, end) of example i.
func (t *TokenFile) Span(i int64) (start, end int64, err error) {
	if i < 0 || i >= t.examples {
		panic(fmt.Sprintf("data: example %d of %d", i, t.examples))
	}
	var b [16]byte
	if err := t.readAt(b[:], t.offOff+8*i); err != nil {
		return 0, 0, err
	}
	return int64(binary.LittleEndian.Uint64(b[:])), int64(binary.LittleEndian.Uint64(b[8:])), nil
}

// Longer counts the examples of more than n tokens and the pieces of n
// tokens overlapping by one they are split into (Packed's rows of seq
// columns: n = seq+1), reading the offset table a block at a time.
func (t *TokenFile) Longer(n int64) (examples, pieces int64, err error) {
	const block = 8192 // offsets per read
	buf := make([]byte, 8*(block+1))
	for i := int64(0); i < t.examples; i += block {
		k := min(block, t.examples-i)
		b := buf[:8*(k+1)]
		if err := t.readAt(b, t.offOff+8*i); err != nil {
			return 0, 0, err
		}
		for j := int64(0); j < k; j++ {
			l := int64(binary.LittleEndian.Uint64(b[8*j+8:])) - int64(binary.LittleEndian.Uint64(b[8*j:]))
			if l > n {
				examples++
				pieces += (l - 2 + n - 1) / (n - 1) // ceil((l-1)/(n-1)): targets per piece n-1
			}
		}
	}
	return examples, pieces, nil
}

// Read reads tokens off .. off+len(ids)-1: their ids, and into train (when
// not nil, as long as ids) their loss bits.
func (t *TokenFile) Read(off int64, ids []int32, train []bool) error {
	return t.read(off, ids, train, nil)
}

// read is Read with a scratch buffer for the bytes (nil: one is made).
func (t *TokenFile) read(off int64, ids []int32, train []bool, scratch *[]byte) error {
	n := int64(len(ids))
	if off < 0 || off+n > t.tokens {
		return fmt.Errorf("data: token file %s: read %d tokens at %d of %d", t.name, n, off, t.tokens)
	}
	var own []byte
	if scratch == nil {
		scratch = &own
	}
	need := n * int64(t.width)
	if train != nil {
		need = max(need, (off+n+7)/8-off/8)
	}
	if int64(cap(*scratch)) < need {
		*scratch = make([]byte, need)
	}
	buf := (*scratch)[:n*int64(t.width)]
	if err := t.readAt(buf, t.idsOff+off*int64(t.width)); err != nil {
		return err
	}
	for i := range ids {
		switch t.width {
		case 1:
			ids[i] = int32(buf[i])
		case 2:
			ids[i] = int32(binary.LittleEndian.Uint16(buf[2*i:]))
		default:
			ids[i] = int32(binary.LittleEndian.Uint32(buf[4*i:]))
		}
	}
	if train == nil || n == 0 {
		return nil
	}
	lo, hi := off/8, (off+n+7)/8
	bits := (*scratch)[:hi-lo]
	if err := t.readAt(bits, t.maskOff+lo); err != nil {
		return err
	}
	for i := range n {
		p := off + i - lo*8
		train[i] = bits[p/8]&(1<<(p%8)) != 0
	}
	return nil
}

// tokenCorpus is a token file as a model.Corpus: its ids in order (raw
// text tokenized by a tokenizer other than bytes).
type tokenCorpus struct{ *TokenFile }

// Len is the number of tokens.
func (c tokenCorpus) Len() int64 { return c.tokens }

// Read reads ids off .. off+len(dst)-1.
func (c tokenCorpus) Read(off int64, dst []int32) error { return c.TokenFile.Read(off, dst, nil) }
