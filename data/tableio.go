package data

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// batches reads a table file one batch at a time: a Parquet row group or
// an Arrow record batch, of the columns asked for only.
type batches interface {
	// schema is the file's columns.
	schema() *arrow.Schema
	// unit names a batch in errors: "row group", "record batch".
	unit() string
	// next reads the next batch's columns cols (indices into schema's
	// fields), io.EOF after the last; an error names the batch and, when
	// one column's pages are bad, the column.
	next(ctx context.Context, cols []int) (batch, error)
	close() error
}

// batch is one batch's columns, held until release: a Parquet row group
// is read in batches of up to parquetBatchRows rows.
type batch struct {
	index int  // the row group or record batch, in its file
	ends  bool // the last batch of its row group (an Arrow batch is whole)
	rows  int
	cols  []arrow.Array
}

func (b batch) release() {
	for _, c := range b.cols {
		c.Release()
	}
}

// openBatches opens a table file for reading with mem.
func openBatches(tf tableFile, mem memory.Allocator) (batches, error) {
	f, err := os.Open(tf.path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if tf.format == Parquet {
		return openParquet(f, tf.path, mem)
	}
	return openArrow(f, tf.path, mem)
}

// recovered turns a panic of arrow-go's readers on damaged bytes into an
// error (they index by offsets the file gives).
func recovered(err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("damaged data: %v", p)
	}
}

// parquetBatchRows are the rows of a Parquet batch. A row group of
// Hugging Face's shards holds tens of MB of text (8,192 rows of
// conversations: 18 MB; datasets' default of 100 MB of rows); read whole
// it was the reader's live heap, and with the collector's slack 50 MiB of
// RSS over the JSONL path's. 1,024 rows (about 2 MB of conversations)
// keep it to a few MiB, and a batch still spans many pages.
const parquetBatchRows = 1024

// parquetStreamBytes is the read buffer of a column chunk: its pages are
// read through it as they are decoded, not the whole chunk at once.
const parquetStreamBytes = 1 << 20

// parquetBatches reads a Parquet file a row group at a time, each column
// of it with pqarrow (strings as the file's Arrow schema says: plain or
// dictionary-encoded, string or large_string), parquetBatchRows rows at
// a time.
type parquetBatches struct {
	path string
	pf   *file.Reader
	fr   *pqarrow.FileReader
	sc   *arrow.Schema
	mem  memory.Allocator
	rg   int // the next row group to open
	// The row group being read: its index, rows not yet read and one
	// reader per column asked for (released when it ends).
	cur     int
	left    int64
	readers []*pqarrow.ColumnReader
}

func openParquet(f *os.File, path string, mem memory.Allocator) (b *parquetBatches, err error) {
	defer func() {
		if err != nil {
			f.Close()
			err = fmt.Errorf("data: %s: not a readable Parquet file: %w", path, err)
		}
	}()
	defer recovered(&err)
	props := parquet.NewReaderProperties(mem)
	props.BufferedStreamEnabled, props.BufferSize = true, parquetStreamBytes
	pf, err := file.NewParquetReader(f, file.WithReadProps(props))
	if err != nil {
		return nil, err
	}
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, mem)
	if err != nil {
		return nil, err
	}
	sc, err := fr.Schema()
	if err != nil {
		return nil, err
	}
	return &parquetBatches{path: path, pf: pf, fr: fr, sc: sc, mem: mem}, nil
}

func (p *parquetBatches) schema() *arrow.Schema { return p.sc }
func (p *parquetBatches) unit() string          { return "row group" }
func (p *parquetBatches) close() error {
	p.releaseReaders()
	return p.pf.Close()
}

func (p *parquetBatches) releaseReaders() {
	for _, r := range p.readers {
		r.Release()
	}
	p.readers = p.readers[:0]
}

func (p *parquetBatches) next(ctx context.Context, cols []int) (batch, error) {
	for p.left == 0 {
		p.releaseReaders()
		if p.rg == p.pf.NumRowGroups() {
			return batch{}, io.EOF
		}
		p.cur, p.left = p.rg, p.pf.MetaData().RowGroup(p.rg).NumRows()
		p.rg++
		if p.left == 0 {
			continue
		}
		for _, c := range cols {
			r, err := p.open(ctx, p.cur, c)
			if err != nil {
				p.left = 0
				return batch{}, fmt.Errorf("row group %d, column %q: %w", p.cur, p.sc.Field(c).Name, err)
			}
			p.readers = append(p.readers, r)
		}
	}
	n := min(p.left, parquetBatchRows)
	p.left -= n
	b := batch{index: p.cur, rows: int(n), ends: p.left == 0}
	for i, r := range p.readers {
		a, err := p.read(r, n)
		if err == nil && a.Len() != b.rows {
			a.Release()
			err = fmt.Errorf("%d values for %d rows", a.Len(), b.rows)
		}
		if err != nil {
			b.release()
			p.left = 0
			return batch{}, fmt.Errorf("row group %d, column %q: %w", b.index, p.sc.Field(cols[i]).Name, err)
		}
		b.cols = append(b.cols, a)
	}
	return b, nil
}

// open is a reader of column c (its leaves) in row group rg: a
// ColumnReader released by the caller (RowGroup(rg).Column(c) would leave
// its buffers to the garbage collector).
func (p *parquetBatches) open(ctx context.Context, rg, c int) (r *pqarrow.ColumnReader, err error) {
	defer recovered(&err)
	leaves := map[int]bool{}
	var leaf func(f *pqarrow.SchemaField)
	leaf = func(f *pqarrow.SchemaField) {
		if f.IsLeaf() {
			leaves[f.ColIndex] = true
		}
		for i := range f.Children {
			leaf(&f.Children[i])
		}
	}
	leaf(&p.fr.Manifest.Fields[c])
	return p.fr.GetFieldReader(ctx, c, leaves, []int{rg})
}

// read reads the next n rows of r's column as one array.
func (p *parquetBatches) read(r *pqarrow.ColumnReader, n int64) (a arrow.Array, err error) {
	defer recovered(&err)
	ch, err := r.NextBatch(n)
	if err != nil {
		return nil, err
	}
	defer ch.Release()
	switch chunks := ch.Chunks(); len(chunks) {
	case 0:
		return array.MakeArrayOfNull(p.mem, ch.DataType(), 0), nil
	case 1:
		chunks[0].Retain()
		return chunks[0], nil
	default: // a batch's strings past 2 GiB
		return array.Concatenate(chunks, p.mem)
	}
}

// arrowBatches reads an Arrow IPC stream (save_to_disk's format) or file
// a record batch at a time.
type arrowBatches struct {
	f      *os.File
	stream *ipc.Reader     // the stream format
	file   *ipc.FileReader // the file format
	i      int
}

func openArrow(f *os.File, path string, mem memory.Allocator) (b *arrowBatches, err error) {
	defer func() {
		if err != nil {
			f.Close()
			err = fmt.Errorf("data: %s: not a readable Arrow IPC file: %w", path, err)
		}
	}()
	defer recovered(&err)
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	head := make([]byte, len(arrowFileMagic))
	_, err = f.ReadAt(head, 0)
	fileFormat := err == nil && string(head) == string(arrowFileMagic)
	if err := checkArrowSchema(f, fi.Size(), fileFormat); err != nil {
		return nil, err
	}
	// No message is larger than the file: a damaged length is an error,
	// not an allocation of it (and a large record batch is no error).
	opts := []ipc.Option{ipc.WithAllocator(mem), ipc.WithMetadataSizeLimit(min(fi.Size(), arrowMetaBytesMax)), ipc.WithBodySizeLimit(fi.Size())}
	if fileFormat {
		r, err := ipc.NewFileReader(f, opts...)
		if err != nil {
			return nil, err
		}
		return &arrowBatches{f: f, file: r}, nil
	}
	r, err := ipc.NewReader(f, opts...)
	if err != nil {
		return nil, err
	}
	return &arrowBatches{f: f, stream: r}, nil
}

func (a *arrowBatches) schema() *arrow.Schema {
	if a.file != nil {
		return a.file.Schema()
	}
	return a.stream.Schema()
}

func (a *arrowBatches) unit() string { return "record batch" }

func (a *arrowBatches) close() error {
	if a.file != nil {
		a.file.Close()
	} else {
		a.stream.Release()
	}
	return a.f.Close()
}

func (a *arrowBatches) next(_ context.Context, cols []int) (b batch, err error) {
	defer func() {
		if err != nil && err != io.EOF {
			err = fmt.Errorf("record batch %d: %w", a.i, err)
		}
	}()
	defer recovered(&err)
	var rec arrow.RecordBatch
	if a.file != nil {
		if a.i == a.file.NumRecords() {
			return batch{}, io.EOF
		}
		if rec, err = a.file.RecordBatchAt(a.i); err != nil {
			return batch{}, err
		}
	} else {
		if !a.stream.Next() {
			if err := a.stream.Err(); err != nil {
				return batch{}, err
			}
			return batch{}, io.EOF
		}
		rec = a.stream.RecordBatch()
		rec.Retain()
	}
	defer rec.Release()
	b = batch{index: a.i, rows: int(rec.NumRows()), ends: true}
	a.i++
	for _, c := range cols {
		col := rec.Column(c)
		col.Retain()
		b.cols = append(b.cols, col)
	}
	return b, nil
}
