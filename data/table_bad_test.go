package data

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"

	"github.com/strata-ai/strata/model"
)

// textRows is n rows of a text column, each about size bytes.
func textRows(n, size int) []tableRowJS {
	rows := make([]tableRowJS, n)
	for i := range rows {
		rows[i] = tableRowJS{"text": fmt.Sprintf("%06d ", i) + strings.Repeat(string(rune('a'+i%26)), size)}
	}
	return rows
}

// TestTableRefused: each bad table is one error naming the file and what
// is wrong: no usable column (the columns found), a column of another
// type (the type found and the type wanted), a damaged page (the row
// group and the column), a file state.json names that is missing, a
// Parquet file cut short, a ShareGPT role it does not know, a later
// shard without the first's columns, only null rows, a directory with
// nothing to read, a DatasetDict's split without its state.json.
func TestTableRefused(t *testing.T) {
	dir := t.TempDir()
	text := []tableField{{Name: "text", Type: "string"}}
	writeTables(t, dir,
		tableFixture{Name: "cols.parquet", Format: "parquet", Schema: []tableField{{Name: "question", Type: "string"}, {Name: "n", Type: "int64"}}, Rows: []tableRowJS{{"question": "q", "n": 1}}},
		tableFixture{Name: "int.parquet", Format: "parquet", Schema: []tableField{{Name: "text", Type: "int64"}}, Rows: []tableRowJS{{"text": 5}}},
		tableFixture{Name: "msgs.arrow", Format: "arrow-stream", Schema: []tableField{{Name: "messages", Type: "list<string>"}}, Rows: []tableRowJS{{"messages": []any{"hi"}}}},
		tableFixture{Name: "role.parquet", Format: "parquet", Schema: []tableField{{Name: "messages", Type: "list<struct<role:int64,content:string>>"}}, Rows: []tableRowJS{{"messages": []any{map[string]any{"role": 1, "content": "x"}}}}},
		tableFixture{Name: "pages.parquet", Format: "parquet", Compression: "none", Dictionary: ptr(false), RowGroupRows: 10, Schema: text, Rows: textRows(30, 100)},
		tableFixture{Name: "cut.parquet", Format: "parquet", Schema: text, Rows: textRows(10, 10)},
		tableFixture{Name: "narrator.arrow", Format: "arrow-file", Schema: []tableField{{Name: "conversations", Type: "list<struct<from:string,value:string>>"}},
			Rows: []tableRowJS{{"conversations": []any{map[string]any{"from": "human", "value": "a"}, map[string]any{"from": "gpt", "value": "b"}}},
				{"conversations": []any{map[string]any{"from": "narrator", "value": "a"}}}}},
		tableFixture{Name: "nulls.parquet", Format: "parquet", Schema: text, Rows: []tableRowJS{{"text": nil}, {}}},
		tableFixture{Name: "shards/a.parquet", Format: "parquet", Schema: text, Rows: textRows(3, 10)},
		tableFixture{Name: "shards/b.parquet", Format: "parquet", Schema: []tableField{{Name: "body", Type: "string"}}, Rows: []tableRowJS{{"body": "x"}}},
		tableFixture{Name: "saved/data-00000-of-00002.arrow", Format: "arrow-stream", Schema: text, Rows: textRows(3, 10)},
	)
	p := func(name string) string { return filepath.Join(dir, name) }

	// A damaged page header: the second row group's column chunk.
	pf, err := file.OpenParquetFile(p("pages.parquet"), false)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := pf.MetaData().RowGroup(1).ColumnChunk(0)
	if err != nil {
		t.Fatal(err)
	}
	at := cc.DataPageOffset()
	pf.Close()
	f, err := os.OpenFile(p("pages.parquet"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, at)
	f.Close()

	b, _ := os.ReadFile(p("cut.parquet"))
	os.WriteFile(p("cut.parquet"), b[:len(b)-20], 0o644)
	os.WriteFile(p("saved/state.json"), []byte(`{"_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}`), 0o644)
	os.Mkdir(p("empty"), 0o755)
	os.MkdirAll(p("dict/train"), 0o755)
	os.WriteFile(p("dict/dataset_dict.json"), []byte(`{"splits": ["train"]}`), 0o644)

	for _, c := range []struct {
		path string
		want []string
		is   error
	}{
		{p("cols.parquet"), []string{p("cols.parquet") + ": no usable column among its columns question, n", `"text"`, `"messages"`, `"conversations"`, "--data-columns"}, nil},
		{p("int.parquet"), []string{p("int.parquet") + `: column "text" is int64, want string`}, nil},
		{p("msgs.arrow"), []string{p("msgs.arrow") + `: column "messages" is list<item: utf8, nullable>, want list<struct<role: string, content: string>>`}, nil},
		{p("role.parquet"), []string{p("role.parquet") + `: column "messages" is list<`, "want list<struct<role: string, content: string>>"}, nil},
		{p("pages.parquet"), []string{p("pages.parquet") + `: row group 1, column "text": `}, nil},
		{p("cut.parquet"), []string{p("cut.parquet"), "does not end with it"}, nil},
		{p("narrator.arrow"), []string{p("narrator.arrow") + `: row 1: message 1: "from" is "narrator", not one of ShareGPT's`}, nil},
		{p("nulls.parquet"), []string{p("nulls.parquet"), "2 rows, 2 with a null text"}, ErrEmpty},
		{p("shards"), []string{p("shards/b.parquet") + `: no column "text"`, "its columns are body"}, nil},
		{p("saved"), []string{p("saved") + ": state.json names data-00001-of-00002.arrow, which is missing"}, os.ErrNotExist},
		{p("empty"), []string{p("empty"), "directory"}, model.ErrNotRegular},
		{p("dict"), []string{p("dict") + ": the DatasetDict's split train has no state.json"}, os.ErrNotExist},
	} {
		s, err := Open(c.path, Options{Dir: t.TempDir()})
		if err == nil {
			s.Close()
			t.Errorf("%s: opened", c.path)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", c.path, err, w)
			}
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%s: %v, want errors.Is %v", c.path, err, c.is)
		}
	}
}

// TestDetectTables: Parquet and Arrow are known by their magic bytes
// whatever their names (a .jsonl or .txt that is Parquet is read as
// Parquet, never as text), and a text file whose first 64 KiB hold a NUL
// byte is refused as binary, naming it.
func TestDetectTables(t *testing.T) {
	dir := t.TempDir()
	rows := textRows(5, 10)
	text := []tableField{{Name: "text", Type: "string"}}
	writeTables(t, dir,
		tableFixture{Name: "a.jsonl", Format: "parquet", Schema: text, Rows: rows},
		tableFixture{Name: "a.txt", Format: "parquet", Schema: text, Rows: rows},
		tableFixture{Name: "a.bin", Format: "arrow-stream", Schema: text, Rows: rows},
		tableFixture{Name: "a", Format: "arrow-file", Schema: text, Rows: rows},
	)
	for name, want := range map[string]Format{"a.jsonl": Parquet, "a.txt": Parquet, "a.bin": Arrow, "a": Arrow} {
		path := filepath.Join(dir, name)
		if f, err := DetectFormat(path); err != nil || f != want {
			t.Errorf("DetectFormat(%s): %v %v, want %v", name, f, err, want)
		}
		s, err := Open(path, Options{Dir: t.TempDir()})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if s.Stats.Format != want || s.Stats.Examples != 5 {
			t.Errorf("%s: read as %s with %d examples, want %s with 5", name, s.Stats.Format, s.Stats.Examples, want)
		}
		s.Close()
	}
	// JSONL by its first line: the new conventions' keys, and keys
	// --data-columns names.
	for _, c := range []struct{ line, cols string }{
		{`{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}`, ""},
		{`{"instruction": "a", "output": "b"}`, ""},
		{`{"question": "a", "answer": "b"}`, "prompt=question,completion=answer"},
	} {
		cols, _ := ParseColumns(c.cols)
		s, err := Open(writeFile(t, "lines.txt", c.line+"\n"), Options{Dir: t.TempDir(), Columns: cols})
		if err != nil || s.Stats.Format != JSONL || s.Stats.Examples != 1 {
			t.Errorf("%s (%s): %v, want one JSONL example", c.line, c.cols, err)
			continue
		}
		s.Close()
	}
	bin := writeFile(t, "weights.txt", "almost text\x00\x01\x02 then more")
	late := writeFile(t, "late.txt", strings.Repeat("x", 1<<16)+"\x00")
	if _, err := Open(bin, Options{Dir: t.TempDir()}); !errors.Is(err, ErrBinary) || !strings.Contains(err.Error(), bin+": ") || !strings.Contains(err.Error(), "offset 11") {
		t.Errorf("a binary file: %v, want ErrBinary naming %s and the offset", err, bin)
	}
	if _, err := Open(late, Options{Dir: t.TempDir(), Tokenizer: specialBytes{}}); err != nil {
		t.Errorf("a NUL past the first 64 KiB: %v", err)
	}
}

// TestTableStops: a context cancelled while a table is tokenized stops
// Open at the next row group or within tableStopRows rows of one, with
// an error wrapping context.Canceled and nothing left in Options.Dir.
func TestTableStops(t *testing.T) {
	dir := t.TempDir()
	text := []tableField{{Name: "text", Type: "string"}}
	writeTables(t, dir,
		tableFixture{Name: "groups.parquet", Format: "parquet", RowGroupRows: 30, Schema: text, Rows: textRows(300, 10)},
		tableFixture{Name: "one.arrow", Format: "arrow-stream", Schema: text, Rows: textRows(3*tableStopRows, 10)},
	)
	for _, c := range []struct {
		name        string
		after, most int
	}{{"groups.parquet", 50, 60}, {"one.arrow", 100, tableStopRows}} {
		ctx, cancel := context.WithCancel(context.Background())
		tok := &cancelling{n: c.after, cancel: cancel}
		tmp := t.TempDir()
		s, err := Open(filepath.Join(dir, c.name), Options{Tokenizer: tok, Dir: tmp, Context: ctx})
		cancel()
		if err == nil {
			s.Close()
			t.Fatalf("%s: read to the end after the cancel (%d encodes)", c.name, tok.calls)
		}
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "tokenizing stopped at") {
			t.Errorf("%s: %v, want the stop (context.Canceled)", c.name, err)
		}
		if tok.calls > c.most {
			t.Errorf("%s: %d encodes, want at most %d after a cancel at the %d-th", c.name, tok.calls, c.most, c.after)
		}
		if ents, _ := os.ReadDir(tmp); len(ents) > 0 {
			t.Errorf("%s: left in the token directory: %v", c.name, ents)
		}
	}
}

// peakAllocator counts the bytes arrow-go holds through it, and the most
// at once.
type peakAllocator struct {
	memory.Allocator
	cur, peak atomic.Int64
}

func (a *peakAllocator) add(n int) {
	c := a.cur.Add(int64(n))
	for p := a.peak.Load(); c > p && !a.peak.CompareAndSwap(p, c); p = a.peak.Load() {
	}
}

func (a *peakAllocator) Allocate(n int) []byte { a.add(n); return a.Allocator.Allocate(n) }
func (a *peakAllocator) Reallocate(n int, b []byte) []byte {
	a.add(n - len(b))
	return a.Allocator.Reallocate(n, b)
}
func (a *peakAllocator) Free(b []byte) { a.add(-len(b)); a.Allocator.Free(b) }

// TestTableStreams: a table is read one batch at a time. A Parquet file
// of 40 row groups (and an Arrow stream of 40 record batches) is
// tokenized holding one batch at most (tableBuild's count of batches
// held), and what arrow-go holds at once (every byte it allocates, through
// a counting allocator) stays under a few row groups' bytes, a fraction
// of the file's: memory does not grow with the table's size.
func TestTableStreams(t *testing.T) {
	const groups, per = 40, 25
	dir := t.TempDir()
	text := []tableField{{Name: "text", Type: "string"}}
	rows := textRows(groups*per, 4000)
	writeTables(t, dir,
		tableFixture{Name: "big.parquet", Format: "parquet", Compression: "snappy", RowGroupRows: per, Schema: text, Rows: rows},
		tableFixture{Name: "big.arrow", Format: "arrow-stream", BatchRows: per, Schema: text, Rows: rows},
	)
	whole := int64(groups * per * 4000) // the rows' text
	for _, name := range []string{"big.parquet", "big.arrow"} {
		path := filepath.Join(dir, name)
		format, err := DetectFormat(path)
		if err != nil {
			t.Fatal(err)
		}
		w, err := newTokenWriter(t.TempDir(), 256)
		if err != nil {
			t.Fatal(err)
		}
		mem := &peakAllocator{Allocator: memory.NewGoAllocator()}
		b := newTableBuild(w, Options{Tokenizer: Bytes{}}, mem)
		tb, err := openTableFiles(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		st, err := b.build(path, tb)
		w.close()
		if err != nil {
			t.Fatal(err)
		}
		if st.Format != format || st.Batches != groups || st.Examples != groups*per {
			t.Errorf("%s: %d batches, %d examples; want %d, %d", name, st.Batches, st.Examples, groups, groups*per)
		}
		if b.peakLive != 1 || b.live != 0 {
			t.Errorf("%s: %d batches held at once (%d at the end), want 1 (0)", name, b.peakLive, b.live)
		}
		if peak := mem.peak.Load(); peak > whole/8 {
			t.Errorf("%s: arrow-go held %d bytes at once, more than an eighth of the rows' %d (a row group is a %dth)", name, peak, whole, groups)
		} else {
			t.Logf("%s: peak %d bytes held by arrow-go of %d (%.1f%%)", name, peak, whole, 100*float64(peak)/float64(whole))
		}
	}
}

// TestTableDamaged: a Parquet or Arrow file with bytes overwritten
// anywhere (seeded: 600 places each) opens or is one error naming the
// file, never a panic or a hang: arrow-go indexes by offsets the file
// gives, and a panic of its readers is caught (recovered).
func TestTableDamaged(t *testing.T) {
	dir := t.TempDir()
	schema := []tableField{{Name: "messages", Type: "list<struct<role:string,content:string>>"}}
	var rows []tableRowJS
	for i := range 60 {
		rows = append(rows, tableRowJS{"messages": []any{map[string]any{"role": "user", "content": fmt.Sprint("q", i)}, map[string]any{"role": "assistant", "content": fmt.Sprint("a", i)}}})
	}
	writeTables(t, dir,
		tableFixture{Name: "a.parquet", Format: "parquet", Compression: "snappy", RowGroupRows: 20, Schema: schema, Rows: rows},
		tableFixture{Name: "a.arrow", Format: "arrow-stream", BatchRows: 20, Schema: schema, Rows: rows},
		tableFixture{Name: "b.arrow", Format: "arrow-file", BatchRows: 20, Schema: schema, Rows: rows},
	)
	rng := rand.New(rand.NewPCG(7, 43))
	for _, name := range []string{"a.parquet", "a.arrow", "b.arrow"} {
		good, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(t.TempDir(), name)
		opened := 0
		for range 600 {
			b := append([]byte(nil), good...)
			at := rng.IntN(len(b))
			for j := range 1 + rng.IntN(8) {
				if at+j < len(b) {
					b[at+j] = byte(rng.Uint32())
				}
			}
			os.WriteFile(bad, b, 0o644)
			s, err := Open(bad, Options{Dir: t.TempDir()})
			if err != nil {
				if !strings.Contains(err.Error(), bad) {
					t.Errorf("%s damaged at %d: %v, want the file named", name, at, err)
				}
				continue
			}
			opened++
			s.Close()
		}
		t.Logf("%s: %d of 600 damaged copies opened (the damage in text or padding), the rest refused", name, opened)
	}
}

// TestParquetRowGroupInBatches: a row group is read parquetBatchRows rows
// at a time. One row group of 12,000 rows (24 MB of text) is tokenized
// with arrow-go holding under a quarter of it at once (a batch's 2 MB, the
// page it decompresses and the read buffer; a row group read whole holds
// all of it), and counts as one row group.
func TestParquetRowGroupInBatches(t *testing.T) {
	const n, size = 12000, 2000
	dir := t.TempDir()
	writeTables(t, dir, tableFixture{Name: "one.parquet", Format: "parquet", Compression: "zstd", RowGroupRows: n,
		Schema: []tableField{{Name: "text", Type: "string"}}, Rows: textRows(n, size)})
	path := filepath.Join(dir, "one.parquet")
	w, err := newTokenWriter(t.TempDir(), 256)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	mem := &peakAllocator{Allocator: memory.NewGoAllocator()}
	b := newTableBuild(w, Options{Tokenizer: Bytes{}}, mem)
	tb, err := openTableFiles(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.build(path, tb)
	if err != nil {
		t.Fatal(err)
	}
	if st.Batches != 1 || st.Examples != n {
		t.Errorf("%d row groups, %d examples; want 1, %d", st.Batches, st.Examples, n)
	}
	whole := int64(n * size)
	if peak := mem.peak.Load(); peak > whole/4 {
		t.Errorf("arrow-go held %d bytes at once of a row group's %d: more than a quarter (read whole?)", peak, whole)
	} else {
		t.Logf("peak %d bytes held by arrow-go of the row group's %d (%.1f%%)", peak, whole, 100*float64(peak)/float64(whole))
	}
}
