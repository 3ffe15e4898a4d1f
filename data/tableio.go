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

// batch is one batch's columns, held until release.
type batch struct {
	index int // in its file
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

// parquetBatches reads a Parquet file a row group at a time, each column
// of it with pqarrow (strings as the file's Arrow schema says: plain or
// dictionary-encoded, string or large_string).
type parquetBatches struct {
	path string
	pf   *file.Reader
	fr   *pqarrow.FileReader
	sc   *arrow.Schema
	mem  memory.Allocator
	rg   int
}

func openParquet(f *os.File, path string, mem memory.Allocator) (b *parquetBatches, err error) {
	defer func() {
		if err != nil {
			f.Close()
			err = fmt.Errorf("data: %s: not a readable Parquet file: %w", path, err)
		}
	}()
	defer recovered(&err)
	pf, err := file.NewParquetReader(f, file.WithReadProps(parquet.NewReaderProperties(mem)))
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
func (p *parquetBatches) close() error          { return p.pf.Close() }

func (p *parquetBatches) next(ctx context.Context, cols []int) (batch, error) {
	if p.rg == p.pf.NumRowGroups() {
		return batch{}, io.EOF
	}
	b := batch{index: p.rg, rows: int(p.pf.MetaData().RowGroup(p.rg).NumRows())}
	p.rg++
	for _, c := range cols {
		a, err := p.column(ctx, b.index, c)
		if err == nil && a.Len() != b.rows {
			a.Release()
			err = fmt.Errorf("%d values in a row group of %d rows", a.Len(), b.rows)
		}
		if err != nil {
			b.release()
			return batch{}, fmt.Errorf("row group %d, column %q: %w", b.index, p.sc.Field(c).Name, err)
		}
		b.cols = append(b.cols, a)
	}
	return b, nil
}

// column reads column c of row group rg as one array.
func (p *parquetBatches) column(ctx context.Context, rg, c int) (a arrow.Array, err error) {
	defer recovered(&err)
	// GetFieldReader, not RowGroup(rg).Column(c).Read, which leaves its
	// column reader (and its buffers) to the garbage collector.
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
	rdr, err := p.fr.GetFieldReader(ctx, c, leaves, []int{rg})
	if err != nil {
		return nil, err
	}
	defer rdr.Release()
	ch, err := p.fr.ReadColumn([]int{rg}, rdr)
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
	default: // a row group's strings past 2 GiB
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
	b = batch{index: a.i, rows: int(rec.NumRows())}
	a.i++
	for _, c := range cols {
		col := rec.Column(c)
		col.Retain()
		b.cols = append(b.cols, col)
	}
	return b, nil
}
