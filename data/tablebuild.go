package data

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// tableStopRows is how often, in rows of a batch, Options.Context is
// looked at (and at every batch).
const tableStopRows = 4096

// tableBuild tokenizes a table's rows into a token file, one batch held
// at a time.
type tableBuild struct {
	w   *tokenWriter
	enc *encoder
	o   Options
	mem memory.Allocator
	st  Stats
	// live counts the batches held, peakLive the most at once: streaming
	// holds one (TestTableStreams).
	live, peakLive int
}

func newTableBuild(w *tokenWriter, o Options, mem memory.Allocator) *tableBuild {
	enc := newEncoder(o.Tokenizer, o.Chat)
	enc.ctx, enc.cols = o.Context, o.Columns
	return &tableBuild{w: w, enc: enc, o: o, mem: mem}
}

// build reads every file of t (path names it).
func (b *tableBuild) build(path string, t *table) (Stats, error) {
	b.st = Stats{Format: t.files[0].format, Files: len(t.files), Split: t.split}
	for i, tf := range t.files {
		b.st.Source += tf.size
		if err := b.file(tf, i == 0); err != nil {
			return b.st, err
		}
	}
	st := &b.st
	if st.Examples == 0 {
		return *st, fmt.Errorf("data: %s: %w: %d rows, %d with a null %s, %d without a trained token", path, ErrEmpty, st.Rows, st.Nulls, strings.Join(st.Columns, " or "), st.Skipped)
	}
	if st.Kinds[KindChat] > 0 {
		st.Template = b.enc.chat.Source()
		st.SplitMarkers = b.enc.chat.SplitMarkers(b.o.Tokenizer)
	}
	return *st, nil
}

// file reads one file of the table; the first decides the convention.
func (b *tableBuild) file(tf tableFile, first bool) error {
	src, err := openBatches(tf, b.mem)
	if err != nil {
		return err
	}
	defer src.close()
	sc := src.schema()
	cols := b.enc.cols
	if first {
		conv, err := cols.pick(func(name string) bool { return len(sc.FieldIndices(name)) > 0 }, "a table")
		if err != nil {
			return fmt.Errorf("data: %s: no usable column among its columns %s: %w; name others with --data-columns (FIELD=COLUMN)", tf.path, columnNames(sc), err)
		}
		b.st.Convention = conv
	}
	conv := b.st.Convention
	tr := &tableRow{path: tf.path}
	var idx []int
	for i, f := range append(append([]string{}, conventions[conv].need...), conventions[conv].optional...) {
		name := cols.name(f)
		fi := sc.FieldIndices(name)
		switch {
		case len(fi) == 0 && i < len(conventions[conv].need):
			return fmt.Errorf("data: %s: no column %q (%s, as the first file's); its columns are %s", tf.path, name, conv, columnNames(sc))
		case len(fi) == 0:
			continue
		case len(fi) > 1:
			return fmt.Errorf("data: %s: %d columns named %q", tf.path, len(fi), name)
		}
		if err := cols.checkType(conv, f, sc.Field(fi[0]).Type); err != nil {
			return fmt.Errorf("data: %s: column %q is %s, want %s", tf.path, name, sc.Field(fi[0]).Type, err)
		}
		idx = append(idx, fi[0])
		tr.names = append(tr.names, name)
		if first {
			b.st.Columns = append(b.st.Columns, name)
		}
	}
	var row int64 // in the file
	for {
		if err := b.o.stopped(tf.path, src.unit(), b.st.Batches); err != nil {
			return err
		}
		bt, err := src.next(b.ctx(), idx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("data: %s: %w", tf.path, err)
		}
		b.hold(1)
		err = b.rows(bt, tr, conv, &row)
		bt.release()
		b.hold(-1)
		if err != nil {
			return err
		}
		if bt.ends {
			b.st.Batches++
		}
	}
}

// ctx is Options.Context, else one that never stops.
func (b *tableBuild) ctx() context.Context {
	if b.o.Context != nil {
		return b.o.Context
	}
	return context.Background()
}

// hold counts batches taken (n = 1) and released (-1).
func (b *tableBuild) hold(n int) {
	b.live += n
	b.peakLive = max(b.peakLive, b.live)
}

// rows tokenizes the rows of one batch; row counts them in the file.
func (b *tableBuild) rows(bt batch, tr *tableRow, conv Convention, row *int64) error {
	tr.cols = bt.cols
	for i := range bt.rows {
		if i%tableStopRows == tableStopRows-1 {
			if err := b.o.stopped(tr.path, "row", *row); err != nil {
				return err
			}
		}
		tr.i = i
		ex, null, err := b.enc.example(conv, tr, fmt.Sprintf("%s: row %d", tr.path, *row))
		*row++
		b.st.Rows++
		if err != nil {
			return fmt.Errorf("data: %w", err)
		}
		if null {
			b.st.Nulls++
			continue
		}
		if err := addExample(b.w, &b.st, ex, conv); err != nil {
			return fmt.Errorf("data: %w", err)
		}
	}
	return nil
}

// columnNames lists a schema's columns.
func columnNames(sc *arrow.Schema) string {
	var names []string
	for _, f := range sc.Fields() {
		names = append(names, f.Name)
	}
	if len(names) == 0 {
		return "(none)"
	}
	return strings.Join(names, ", ")
}

// checkType says what type field f of convention conv wants (an error
// whose text is the type wanted) when dt is not one it reads: a string
// (string, large_string, string_view, or a dictionary of them), or for a
// conversation a list of structs with string role and content (from and
// value) under c's names, their other fields of types the chat template
// can take.
func (c Columns) checkType(conv Convention, f string, dt arrow.DataType) error {
	tf, ok := turnFields[conv]
	if !ok || f != conventions[conv].need[0] {
		if !stringType(dt) {
			return errors.New("string")
		}
		return nil
	}
	role, content := c.name(tf[0]), c.name(tf[1])
	want := fmt.Errorf("list<struct<%s: string, %s: string>>", role, content)
	l, ok := dt.(arrow.ListLikeType)
	if !ok || (dt.ID() != arrow.LIST && dt.ID() != arrow.LARGE_LIST) {
		return want
	}
	st, ok := l.Elem().(*arrow.StructType)
	if !ok {
		return want
	}
	for _, k := range []string{role, content} {
		if i, ok := st.FieldIdx(k); !ok || !stringType(st.Field(i).Type) {
			return want
		}
	}
	if !valueType(st) {
		return fmt.Errorf("%s (its other fields of string, number, bool, list or struct types)", want)
	}
	return nil
}

// stringType says whether dt is read as a string.
func stringType(dt arrow.DataType) bool {
	switch dt.ID() {
	case arrow.STRING, arrow.LARGE_STRING, arrow.STRING_VIEW:
		return true
	case arrow.DICTIONARY:
		return stringType(dt.(*arrow.DictionaryType).ValueType)
	}
	return false
}

// valueType says whether tableValue reads every value of type dt.
func valueType(dt arrow.DataType) bool {
	switch dt.ID() {
	case arrow.NULL, arrow.BOOL, arrow.INT8, arrow.INT16, arrow.INT32, arrow.INT64,
		arrow.UINT8, arrow.UINT16, arrow.UINT32, arrow.UINT64, arrow.FLOAT32, arrow.FLOAT64:
		return true
	case arrow.LIST, arrow.LARGE_LIST:
		return valueType(dt.(arrow.ListLikeType).Elem())
	case arrow.STRUCT:
		for _, f := range dt.(*arrow.StructType).Fields() {
			if !valueType(f.Type) {
				return false
			}
		}
		return true
	}
	return stringType(dt)
}

// tableRow is a table's columns (those of a convention, by their names in
// the file) at one row of a batch.
type tableRow struct {
	path  string
	names []string
	cols  []arrow.Array
	i     int
}

func (r *tableRow) col(name string) arrow.Array {
	for j, n := range r.names {
		if n == name {
			return r.cols[j]
		}
	}
	return nil
}

func (r *tableRow) str(name string) (s string, ok bool, err error) {
	a := r.col(name)
	if a == nil || a.IsNull(r.i) {
		return "", false, nil
	}
	v, err := tableValue(a, r.i, 0)
	if err != nil {
		return "", false, fmt.Errorf("column %q: %w", name, err)
	}
	return v.(string), true, nil
}

func (r *tableRow) value(name string) (v any, ok bool, err error) {
	a := r.col(name)
	if a == nil || a.IsNull(r.i) {
		return nil, false, nil
	}
	if v, err = tableValue(a, r.i, 0); err != nil {
		return nil, false, fmt.Errorf("column %q: %w", name, err)
	}
	return v, true, nil
}

// tableValue is value i of a as the chat template's values, as the same
// value in a JSONL line decodes (decodeOrdered): a string, int64 (every
// integer type), float64, bool, nil (null), []any (a list), *object (a
// struct, its fields in order). A string that is not UTF-8 is an error,
// as in a JSONL line. The types are those valueType allows.
func tableValue(a arrow.Array, i, depth int) (v any, err error) {
	defer recovered(&err)
	if depth > 1000 {
		return nil, errors.New("nested more than 1000 deep")
	}
	if a.IsNull(i) {
		return nil, nil
	}
	switch a := a.(type) {
	case array.StringLike:
		s := a.Value(i)
		if !utf8.ValidString(s) {
			for j := 0; ; {
				r, n := utf8.DecodeRuneInString(s[j:])
				if r == utf8.RuneError && n <= 1 {
					return nil, fmt.Errorf("invalid UTF-8 at byte %d of a string (%#02x)", j, s[j])
				}
				j += n
			}
		}
		return s, nil
	case *array.Dictionary:
		return tableValue(a.Dictionary(), a.GetValueIndex(i), depth+1)
	case *array.Boolean:
		return a.Value(i), nil
	case *array.Int8:
		return int64(a.Value(i)), nil
	case *array.Int16:
		return int64(a.Value(i)), nil
	case *array.Int32:
		return int64(a.Value(i)), nil
	case *array.Int64:
		return a.Value(i), nil
	case *array.Uint8:
		return int64(a.Value(i)), nil
	case *array.Uint16:
		return int64(a.Value(i)), nil
	case *array.Uint32:
		return int64(a.Value(i)), nil
	case *array.Uint64:
		return int64(a.Value(i)), nil
	case *array.Float32:
		return float64(a.Value(i)), nil
	case *array.Float64:
		return a.Value(i), nil
	case *array.List, *array.LargeList:
		l := a.(array.ListLike)
		start, end := l.ValueOffsets(i)
		if start < 0 || end < start || end > int64(l.ListValues().Len()) {
			return nil, fmt.Errorf("damaged data: a list at [%d, %d) of %d values", start, end, l.ListValues().Len())
		}
		out := make([]any, 0, end-start)
		for j := start; j < end; j++ {
			x, err := tableValue(l.ListValues(), int(j), depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		return out, nil
	case *array.Struct:
		st := a.DataType().(*arrow.StructType)
		d := newObject()
		for k, f := range st.Fields() {
			x, err := tableValue(a.Field(k), i, depth+1)
			if err != nil {
				return nil, err
			}
			d.set(f.Name, x)
		}
		return d, nil
	}
	return nil, fmt.Errorf("a value of type %s", a.DataType())
}
