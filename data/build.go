package data

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/model"
)

//go:generate go tool stringer -type=Format -linecomment -output=format_string.go

// Format is the format of a data file.
type Format int

const (
	// Text is raw text: one token stream, drawn from as random windows.
	Text Format = iota // text
	// JSONL is one example per line (Convention: {"text"}, {"prompt",
	// "completion"}, {"messages"}, ...), packed into rows.
	JSONL // jsonl
	// Parquet is a table of examples, a row each, in Parquet files (one,
	// a directory or a glob of shards), packed into rows.
	Parquet // parquet
	// Arrow is a table of examples in Arrow IPC files (stream or file
	// format): a datasets.save_to_disk directory, or files as Parquet's.
	Arrow // arrow
)

// Examples says whether the format holds examples (packed into rows), not
// raw text.
func (f Format) Examples() bool { return f != Text }

// MaxLineBytes bounds a JSONL line: one example is held whole while it is
// tokenized.
const MaxLineBytes = 64 << 20

// ErrBinary says a data file is neither text nor a format read as a
// table: read as text, its bytes would train the model on noise.
var ErrBinary = errors.New("a binary file, not text")

// Magic bytes of the table formats.
var (
	parquetMagic     = []byte("PAR1")                 // at the start and the end
	arrowFileMagic   = []byte("ARROW1")               // the IPC file format
	arrowStreamMagic = []byte{0xff, 0xff, 0xff, 0xff} // an IPC stream's first continuation marker
)

// DetectFormat says how a data file is read. By its first bytes, whatever
// its name: Parquet ("PAR1" at the start and the end), Arrow (the IPC
// file's "ARROW1", or a stream's 0xFFFFFFFF continuation marker). Then
// JSONL when its name ends in .jsonl, .json-lines or .jsonlines, or when
// its first line (after whitespace and a UTF-8 byte-order mark) is a JSON
// object with a convention's key ("text", "prompt", "completion",
// "messages", "conversations", "instruction", "output"); raw text
// otherwise, unless its first 64 KiB hold a NUL byte (ErrBinary). A
// directory is a table (Parquet or Arrow shards, or a save_to_disk
// directory), and so is a glob of shards.
func DetectFormat(path string) (Format, error) { return detectFormat(path, nil) }

// detectFormat is DetectFormat knowing the conventions' keys under cols's
// names (Options.Columns).
func detectFormat(path string, cols Columns) (Format, error) {
	fi, err := os.Stat(path) // a Stat first: opening a named pipe would block
	switch {
	case err != nil && isGlob(path):
		files, err := globFiles(path)
		if err != nil {
			return 0, err
		}
		return files[0].format, nil
	case err != nil:
		return 0, fmt.Errorf("data: %w", err)
	case fi.IsDir():
		return dirFormat(path)
	}
	if err := checkRegular(path); err != nil {
		return 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	head, err := r.Peek(1 << 16)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return 0, fmt.Errorf("data: %s: %w", path, err)
	}
	if t, err := tableMagic(f, path, head, fi.Size()); err != nil || t != Text {
		return t, err
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl", ".json-lines", ".jsonlines":
		return JSONL, nil
	}
	if i := bytes.IndexByte(head, 0); i >= 0 {
		return 0, fmt.Errorf("data: %s: %w (a NUL byte at offset %d): give raw text, JSONL, Parquet or Arrow", path, ErrBinary, i)
	}
	head = bytes.TrimLeft(bytes.TrimPrefix(bytes.TrimLeft(head, " \t\r\n"), []byte("\xef\xbb\xbf")), " \t\r\n")
	if len(head) == 0 || head[0] != '{' {
		return Text, nil
	}
	line, _, _ := bytes.Cut(head, []byte("\n"))
	var keys map[string]json.RawMessage
	if json.Unmarshal(line, &keys) == nil {
		for _, c := range conventions {
			for _, k := range c.need {
				if _, ok := keys[cols.name(k)]; ok {
					return JSONL, nil
				}
			}
		}
	}
	return Text, nil
}

// tableMagic is the format head (a file's first bytes) says, Text when
// it names none. A file that begins as Parquet and does not end as one is
// an error: cut short, or not Parquet.
func tableMagic(f io.ReaderAt, path string, head []byte, size int64) (Format, error) {
	switch {
	case bytes.HasPrefix(head, parquetMagic):
		tail := make([]byte, len(parquetMagic))
		if size < 2*int64(len(tail)) {
			return 0, fmt.Errorf("data: %s: begins with Parquet's magic PAR1 but has %d bytes: a truncated Parquet file", path, size)
		}
		if _, err := f.ReadAt(tail, size-int64(len(tail))); err != nil {
			return 0, fmt.Errorf("data: %s: %w", path, err)
		}
		if !bytes.Equal(tail, parquetMagic) {
			return 0, fmt.Errorf("data: %s: begins with Parquet's magic PAR1 but does not end with it: a truncated or damaged Parquet file", path)
		}
		return Parquet, nil
	case bytes.HasPrefix(head, arrowFileMagic), bytes.HasPrefix(head, arrowStreamMagic):
		return Arrow, nil
	}
	return Text, nil
}

// Options say how a data file becomes tokens.
type Options struct {
	// Tokenizer is the model's; nil: Bytes.
	Tokenizer Tokenizer
	// Chat renders {"messages"} lines; nil: DefaultChatTemplate.
	Chat *ChatTemplate
	// Dir is where the token file is written (os.TempDir() when ""): the
	// run's directory, so that it lands on the run's disk rather than a
	// RAM-backed /tmp. Its name is removed at once; it lives while open.
	Dir string
	// Format, when set, decides over DetectFormat.
	Format *Format
	// Context, when set, stops the tokenizing once it is done (a signal
	// asked the run to stop): it looks every line of JSONL, every chunk
	// of raw text (textChunkBytes), every Parquet row group or Arrow
	// record batch and every tableStopRows rows of one, and every few
	// thousand steps of a chat template's rendering, and Open returns an
	// error that wraps the context's (context.Canceled), the token file
	// removed.
	Context context.Context
	// Columns names the conventions' fields where a file holds them under
	// other names (JSONL keys and table columns alike); nil: their own.
	Columns Columns
	// Splits are the splits of a DatasetDict (a save_to_disk directory
	// with dataset_dict.json) to read, the first it has; nil: TrainSplits.
	Splits []string
}

// The splits a DatasetDict is read from: for training, and for
// evaluation (the first the dictionary has).
var (
	TrainSplits = []string{"train"}
	EvalSplits  = []string{"validation", "test"}
)

// stopped is the error of a tokenizing that o.Context stopped at (the
// line or byte) n, nil while it goes on.
func (o *Options) stopped(path, unit string, n int64) error {
	if o.Context == nil {
		return nil
	}
	if err := o.Context.Err(); err != nil {
		return fmt.Errorf("data: %s: tokenizing stopped at %s %d: %w", path, unit, n, err)
	}
	return nil
}

// Stats describe a tokenized data file.
type Stats struct {
	Format   Format
	Lines    int64            // JSONL lines read (blank ones included)
	Examples int64            // examples kept
	Skipped  int64            // examples with no trained target, left out
	Kinds    [kindCount]int64 // kept examples by kind (KindText, KindCompletion, KindChat)
	// Conventions are the kept examples by convention (ConvText, ...).
	Conventions [conventionCount]int64
	// Tables (Parquet, Arrow): the files read, their row groups or record
	// batches, their rows, the rows left out for a null in a column the
	// convention needs, the convention and its columns (as the files name
	// them), and the DatasetDict split read ("" when none).
	Files      int
	Batches    int64
	Rows       int64
	Nulls      int64
	Convention Convention
	Columns    []string
	Split      string
	Tokens     int64  // tokens of the kept examples (raw text: of the file)
	Trained    int64  // tokens whose prediction counts in the loss
	Width      int    // bytes per id in the token file (0: none written)
	Bytes      int64  // the token file's size (0: none written)
	Source     int64  // the data file's size (a table's: of all its files)
	Template   string // the chat template's source, when a line needed it
	// SplitMarkers are the default template's markers (ChatMLMarkers) the
	// tokenizer has no token for, each encoded as the tokens of its text,
	// when a line needed the template.
	SplitMarkers []string
}

// Source is an open data file: raw text as a corpus of windows, or JSONL
// as a token file of examples.
type Source struct {
	Path   string
	Stats  Stats
	Corpus model.Corpus // Text: model.FileCorpus (bytes) or the token file's ids
	File   *TokenFile   // JSONL, or Text with a tokenizer other than bytes
	closer io.Closer
}

// Close closes the file(s) the source reads.
func (s *Source) Close() error {
	if s.closer == nil {
		return nil
	}
	c := s.closer
	s.closer = nil
	return c.Close()
}

// Open opens a data file for training or evaluation: raw text tokenized
// with the byte-level tokenizer is read in place (model.OpenCorpus);
// anything else is tokenized in one streaming pass into a token file in
// o.Dir. A bad JSONL line is an error naming the file, the line and what
// is wrong; a file with nothing to train on is an error too.
func Open(path string, o Options) (*Source, error) {
	if o.Tokenizer == nil {
		o.Tokenizer = Bytes{}
	}
	format := Text
	if o.Format != nil {
		format = *o.Format
	} else {
		var err error
		if format, err = detectFormat(path, o.Columns); err != nil {
			return nil, err
		}
	}
	if format == Parquet || format == Arrow {
		return openTable(path, format, o)
	}
	if err := checkRegular(path); err != nil {
		return nil, err
	}
	if format == Text && isBytes(o.Tokenizer) {
		c, err := model.OpenCorpus(path)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		if c.Len() == 0 {
			c.Close()
			return nil, fmt.Errorf("data: %s: %w", path, ErrEmpty)
		}
		return &Source{Path: path, Corpus: c, closer: c, Stats: Stats{Format: Text, Tokens: c.Len(), Trained: c.Len(), Source: c.Len()}}, nil
	}
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w, err := newTokenWriter(o.Dir, o.Tokenizer.VocabSize())
	if err != nil {
		return nil, err
	}
	var st Stats
	if format == JSONL {
		st, err = buildJSONL(w, f, path, o)
	} else {
		st, err = buildText(w, f, path, o)
	}
	if err != nil {
		w.close()
		return nil, err
	}
	tf, err := w.finish()
	if err != nil {
		return nil, err
	}
	st.Width, st.Bytes = tf.Width(), tf.Bytes()
	if fi, err := f.Stat(); err == nil {
		st.Source = fi.Size()
	}
	s := &Source{Path: path, Stats: st, File: tf, closer: tf}
	if format == Text {
		s.Corpus = tokenCorpus{tf}
	}
	return s, nil
}

// ErrEmpty says a data file has nothing to train on.
var ErrEmpty = errors.New("nothing to train on")

// checkRegular refuses what is not a regular file (a device such as
// /dev/zero, a pipe, a directory), naming it and what it is: rows are
// drawn from a file of known size, and a pipe could be read only once.
func checkRegular(path string) error {
	fi, err := os.Stat(path) // a Stat: opening a named pipe would block
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	what := model.FileKind(fi.Mode())
	if what == "" {
		return nil
	}
	return fmt.Errorf("data: %s: %w (%s): give a regular file", path, model.ErrNotRegular, what)
}

// openRegular opens a data file, refusing what is not a regular file.
func openRegular(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("data: %s: %w: give a regular file", path, model.ErrNotRegular)
	}
	return f, nil
}

// buildJSONL tokenizes a JSONL file line by line into w.
func buildJSONL(w *tokenWriter, r io.Reader, path string, o Options) (Stats, error) {
	st := Stats{Format: JSONL}
	enc := newEncoder(o.Tokenizer, o.Chat)
	enc.ctx, enc.cols = o.Context, o.Columns
	br := bufio.NewReaderSize(r, 1<<16)
	var line []byte
	for {
		if err := o.stopped(path, "line", st.Lines+1); err != nil {
			return st, err
		}
		chunk, err := br.ReadSlice('\n')
		line = append(line[:0], chunk...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(line) > MaxLineBytes {
				return st, fmt.Errorf("data: %s:%d: a line of more than %d bytes", path, st.Lines+1, MaxLineBytes)
			}
			chunk, err = br.ReadSlice('\n')
			line = append(line, chunk...)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return st, fmt.Errorf("data: %s: read line %d: %w", path, st.Lines+1, err)
		}
		if len(line) == 0 && err != nil {
			break
		}
		st.Lines++
		if st.Lines == 1 { // a byte-order mark before the first line: read as utf-8-sig
			line = bytes.TrimPrefix(line, utf8BOM)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if lerr := addLine(w, enc, &st, line, fmt.Sprintf("%s:%d", path, st.Lines)); lerr != nil {
				return st, fmt.Errorf("data: %w", lerr)
			}
		}
		if err != nil {
			break
		}
	}
	if st.Examples == 0 {
		return st, fmt.Errorf("data: %s: %w: %d lines, %d examples without a trained token (a prompt without a completion, a conversation without the assistant's turn, text of one token)", path, ErrEmpty, st.Lines, st.Skipped)
	}
	if st.Kinds[KindChat] > 0 {
		st.Template = enc.chat.Source()
		st.SplitMarkers = enc.chat.SplitMarkers(o.Tokenizer)
	}
	return st, nil
}

// addLine encodes one line and writes it, or counts it as skipped.
func addLine(w *tokenWriter, enc *encoder, st *Stats, line []byte, where string) error {
	ex, conv, err := enc.lineConv(line, where)
	if err != nil {
		return err
	}
	return addExample(w, st, ex, conv)
}

// addExample writes an example of convention conv, or counts it as
// skipped when nothing of it is trained.
func addExample(w *tokenWriter, st *Stats, ex example, conv Convention) error {
	n := ex.targets()
	if n == 0 {
		st.Skipped++
		return nil
	}
	if err := w.add(ex.ids, ex.train); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	st.Examples++
	st.Kinds[conventions[conv].kind]++
	st.Conventions[conv]++
	st.Tokens += int64(len(ex.ids))
	st.Trained += int64(n)
	return nil
}

// textChunkBytes is how much raw text is tokenized at a time.
const textChunkBytes = 1 << 20

// buildText tokenizes raw text into w as one example, a chunk at a time.
// A chunk ends after a line break between two non-space characters: the
// pre-tokenizers of GPT-2, Llama-3 and Qwen2 split on both sides of it
// there too, so the ids are those of the whole text tokenized at once.
// Nothing is added (no BOS, no EOS).
func buildText(w *tokenWriter, r io.Reader, path string, o Options) (Stats, error) {
	st := Stats{Format: Text}
	tok := o.Tokenizer
	var read int64
	var ids []int32
	buf := make([]byte, 0, 2*textChunkBytes)
	tmp := make([]byte, textChunkBytes)
	for eof := false; !eof; {
		if err := o.stopped(path, "byte", read); err != nil {
			return st, err
		}
		n, err := io.ReadFull(r, tmp)
		read += int64(n)
		buf = append(buf, tmp[:n]...)
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			eof = true
		case err != nil:
			return st, fmt.Errorf("data: %s: %w", path, err)
		}
		cut := len(buf)
		if !eof {
			if cut = textCut(buf); cut < 0 {
				if len(buf) > MaxLineBytes {
					return st, fmt.Errorf("data: %s: more than %d bytes without a line break to cut the text at", path, MaxLineBytes)
				}
				continue
			}
		}
		more, err := encode(tok, string(buf[:cut]), false, path)
		if err != nil {
			return st, fmt.Errorf("data: %w", err)
		}
		ids = append(ids, more...)
		buf = append(buf[:0], buf[cut:]...)
		// One example is one token stream: write it in pieces, keeping no
		// more than a chunk's ids (the offsets name only its start).
		if err := w.addPart(ids, eof); err != nil {
			return st, fmt.Errorf("data: write token file: %w", err)
		}
		st.Tokens += int64(len(ids))
		ids = ids[:0]
	}
	if st.Tokens < 2 {
		return st, fmt.Errorf("data: %s: %w: %d tokens", path, ErrEmpty, st.Tokens)
	}
	st.Examples, st.Trained = 1, st.Tokens-1
	return st, nil
}

// textCut is where to cut raw text: after the last line break that sits
// between two non-space bytes, -1 when there is none.
func textCut(b []byte) int {
	space := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' }
	for i := len(b) - 1; i > 1; i-- {
		if b[i-1] == '\n' && !space(b[i]) && !space(b[i-2]) {
			return i
		}
	}
	return -1
}
