package data

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// conventionCase is a convention's rows (every 7th with a null where the
// convention needs a value), its schema (str: the string type) and the
// text of row 1 as the token file must hold it (ChatML, specialBytes).
type conventionCase struct {
	conv    Convention
	schema  func(str string) []tableField
	row     func(i int) tableRowJS
	null    func(r tableRowJS) bool
	columns []string
	row1    string
	// messages, for ShareGPT and Alpaca, is a row as the chat it means,
	// written out here ({"messages"}): an oracle of the mapping apart
	// from the code under test.
	messages func(r tableRowJS) tableRowJS
}

func conventionCases() []conventionCase {
	nth := func(i int) bool { return i%7 == 6 }
	return []conventionCase{
		{ConvText, func(s string) []tableField {
			return []tableField{{Name: "id", Type: "int64"}, {Name: "text", Type: s}}
		}, func(i int) tableRowJS {
			r := tableRowJS{"id": i, "text": fmt.Sprintf("row %d: the quick brown fox", i)}
			if nth(i) {
				r["text"] = nil
			}
			return r
		}, func(r tableRowJS) bool { return r["text"] == nil }, []string{"text"},
			"[<B>row 1: the quick brown fox<E>]", nil},
		{ConvCompletion, func(s string) []tableField {
			return []tableField{{Name: "prompt", Type: s}, {Name: "completion", Type: s}, {Name: "score", Type: "float64"}}
		}, func(i int) tableRowJS {
			r := tableRowJS{"prompt": fmt.Sprintf("%d+%d=", i, i), "completion": fmt.Sprint(2 * i), "score": 0.5}
			if nth(i) {
				r["completion"] = nil
			}
			return r
		}, func(r tableRowJS) bool { return r["completion"] == nil }, []string{"prompt", "completion"},
			"<B>1+1=[2<E>]", nil},
		{ConvMessages, func(s string) []tableField {
			return []tableField{{Name: "messages", Type: fmt.Sprintf("list<struct<role:%s,content:%s>>", s, s)}, {Name: "prompt", Type: s}}
		}, func(i int) tableRowJS {
			msgs := []any{map[string]any{"role": "user", "content": fmt.Sprintf("q%d", i)}, map[string]any{"role": "assistant", "content": fmt.Sprintf("a%d", i)}}
			if i%4 == 0 {
				msgs = append([]any{map[string]any{"role": "system", "content": "Be brief."}}, msgs...)
			}
			r := tableRowJS{"messages": msgs, "prompt": fmt.Sprintf("q%d", i)} // ultrachat's prompt beside its messages
			if nth(i) {
				r["messages"] = nil
			}
			return r
		}, func(r tableRowJS) bool { return r["messages"] == nil }, []string{"messages"},
			"<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n[a1<|im_end|>\n]", nil},
		{ConvShareGPT, func(s string) []tableField {
			return []tableField{{Name: "conversations", Type: fmt.Sprintf("list<struct<from:%s,value:%s,weight:float64>>", s, s)}}
		}, func(i int) tableRowJS {
			human, gpt := []string{"human", "user"}[i%2], []string{"gpt", "assistant", "bot", "chatgpt"}[i%4]
			conv := []any{map[string]any{"from": human, "value": fmt.Sprintf("q%d", i)}, map[string]any{"from": gpt, "value": fmt.Sprintf("a%d", i), "weight": 1.0}}
			if i%5 == 0 {
				conv = append([]any{map[string]any{"from": "system", "value": "Be brief."}}, conv...)
			}
			r := tableRowJS{"conversations": conv}
			if nth(i) {
				r["conversations"] = nil
			}
			return r
		}, func(r tableRowJS) bool { return r["conversations"] == nil }, []string{"conversations"},
			"<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n[a1<|im_end|>\n]",
			func(r tableRowJS) tableRowJS {
				roles := map[string]string{"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant", "chatgpt": "assistant", "system": "system"}
				var msgs []any
				for _, m := range r["conversations"].([]any) {
					m := m.(map[string]any)
					msgs = append(msgs, map[string]any{"role": roles[m["from"].(string)], "content": m["value"]})
				}
				return tableRowJS{"messages": msgs}
			}},
		{ConvAlpaca, func(s string) []tableField {
			return []tableField{{Name: "instruction", Type: s}, {Name: "input", Type: s}, {Name: "output", Type: s}, {Name: "system", Type: s}, {Name: "text", Type: s}}
		}, func(i int) tableRowJS {
			r := tableRowJS{"instruction": fmt.Sprintf("Add %d and %d.", i, i), "input": []any{"", "in put", nil}[i%3], "output": fmt.Sprint(2 * i),
				"text": "the rendered prompt (tatsu-lab/alpaca's), not read"}
			if i%5 == 1 {
				r["system"] = "Be brief."
			}
			if nth(i) {
				r["output"] = nil
			}
			return r
		}, func(r tableRowJS) bool { return r["output"] == nil }, []string{"instruction", "output", "input", "system"},
			"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd 1 and 1.\nin put<|im_end|>\n<|im_start|>assistant\n[2<|im_end|>\n]",
			func(r tableRowJS) tableRowJS {
				var msgs []any
				if s, ok := r["system"].(string); ok && s != "" {
					msgs = append(msgs, map[string]any{"role": "system", "content": s})
				}
				user := r["instruction"].(string)
				if in, ok := r["input"].(string); ok && in != "" {
					user += "\n" + in
				}
				msgs = append(msgs, map[string]any{"role": "user", "content": user}, map[string]any{"role": "assistant", "content": r["output"]})
				return tableRowJS{"messages": msgs}
			}},
	}
}

// tableVariants are the ways a table is written: Parquet compressed
// and not, dictionary-encoded and plain, string and large_string, in
// several row groups; Arrow stream and file in several record batches.
var tableVariants = []struct {
	name    string
	fixture tableFixture
	str     string
	batches int // of 30 rows
}{
	{"parquet-zstd-dict", tableFixture{Format: "parquet", Compression: "zstd", Dictionary: ptr(true), RowGroupRows: 7}, "string", 5},
	{"parquet-snappy-plain", tableFixture{Format: "parquet", Compression: "snappy", Dictionary: ptr(false), RowGroupRows: 4}, "large_string", 8},
	{"parquet-none", tableFixture{Format: "parquet", Compression: "none", RowGroupRows: 30}, "string", 1},
	{"arrow-stream", tableFixture{Format: "arrow-stream", BatchRows: 8}, "string", 4},
	{"arrow-file", tableFixture{Format: "arrow-file", BatchRows: 11}, "large_string", 3},
}

func ptr[T any](v T) *T { return &v }

// TestTableConventions: each convention's rows, written as Parquet (zstd,
// snappy and none; dictionary and plain; string and large_string; several
// row groups) and Arrow (stream and file, several record batches), give the
// token file the same examples give as JSONL lines, id for id and bit for
// bit; a row with a null where its convention needs a value is left out
// and counted; other columns are not read. Row 1 is as written out here,
// so that the mapping both share is checked too.
func TestTableConventions(t *testing.T) {
	const n = 30
	for _, c := range conventionCases() {
		rows := make([]tableRowJS, n)
		nulls := 0
		for i := range rows {
			rows[i] = c.row(i)
			if c.null(rows[i]) {
				nulls++
			}
		}
		o := Options{Tokenizer: specialBytes{}, Dir: t.TempDir()}
		js, err := Open(writeFile(t, "rows.jsonl", jsonlOf(t, rows, c.null)), o)
		if err != nil {
			t.Fatalf("%s: JSONL: %v", c.conv, err)
		}
		want := readTokens(t, js)
		js.Close()
		if got := want.exampleText(1); got != c.row1 {
			t.Errorf("%s: JSONL row 1 %q, want %q", c.conv, got, c.row1)
		}
		if c.messages != nil {
			var chats []tableRowJS
			for _, r := range rows {
				if !c.null(r) {
					chats = append(chats, c.messages(r))
				}
			}
			s, err := Open(writeFile(t, "chats.jsonl", jsonlOf(t, chats, nil)), o)
			if err != nil {
				t.Fatal(err)
			}
			if chat := readTokens(t, s); !chat.equal(want) {
				for i := range min(len(chat.spans), len(want.spans)) {
					if chat.exampleText(i) != want.exampleText(i) {
						t.Errorf("%s: example %d %q, want (as messages) %q", c.conv, i, want.exampleText(i), chat.exampleText(i))
						break
					}
				}
			}
			s.Close()
		}
		dir := t.TempDir()
		var files []tableFixture
		for _, v := range tableVariants {
			f := v.fixture
			f.Name, f.Schema, f.Rows = v.name+".data", c.schema(v.str), rows
			files = append(files, f)
		}
		writeTables(t, dir, files...)
		for _, v := range tableVariants {
			name := fmt.Sprintf("%s/%s", c.conv, v.name)
			s, err := Open(filepath.Join(dir, v.name+".data"), o)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			got := readTokens(t, s)
			st := s.Stats
			s.Close()
			if !got.equal(want) {
				t.Errorf("%s: the token file differs from JSONL's: %d examples, %d tokens; want %d, %d\nrow 1 %q\nwant  %q",
					name, len(got.spans), len(got.ids), len(want.spans), len(want.ids), got.exampleText(1), want.exampleText(1))
			}
			wantFormat := map[bool]Format{true: Parquet, false: Arrow}[v.fixture.Format == "parquet"]
			if st.Format != wantFormat || st.Convention != c.conv || !slices.Equal(st.Columns, c.columns) || st.Rows != n || st.Nulls != int64(nulls) ||
				st.Examples != int64(n-nulls) || st.Conventions[c.conv] != st.Examples || st.Batches != int64(v.batches) || st.Files != 1 {
				t.Errorf("%s: stats %s %s columns %v, %d rows, %d null, %d examples (%v), %d batches, %d files; want %s %s %v, %d, %d, %d, %d, 1",
					name, st.Format, st.Convention, st.Columns, st.Rows, st.Nulls, st.Examples, st.Conventions, st.Batches, st.Files,
					wantFormat, c.conv, c.columns, n, nulls, n-nulls, v.batches)
			}
		}
	}
}

// TestTableColumns: --data-columns names a convention's columns and a
// turn's fields where a file holds them under other names, for JSONL and
// tables alike, giving what the conventions' own names give.
func TestTableColumns(t *testing.T) {
	o := Options{Tokenizer: specialBytes{}, Dir: t.TempDir()}
	open := func(path string, cols string) tokens {
		t.Helper()
		o := o
		if cols != "" {
			c, err := ParseColumns(cols)
			if err != nil {
				t.Fatal(err)
			}
			o.Columns = c
		}
		s, err := Open(path, o)
		if err != nil {
			t.Fatalf("%s (%s): %v", path, cols, err)
		}
		defer s.Close()
		return readTokens(t, s)
	}
	var qa, canon, dialog, chat []tableRowJS
	for i := range 12 {
		q, a := fmt.Sprintf("q%d?", i), fmt.Sprintf("a%d.", i)
		qa = append(qa, tableRowJS{"question": q, "answer": a})
		canon = append(canon, tableRowJS{"prompt": q, "completion": a})
		dialog = append(dialog, tableRowJS{"dialog": []any{map[string]any{"speaker": "user", "text": q, "lang": "en"}, map[string]any{"speaker": "assistant", "text": a, "lang": "en"}}})
		chat = append(chat, tableRowJS{"messages": []any{map[string]any{"role": "user", "content": q, "lang": "en"}, map[string]any{"role": "assistant", "content": a, "lang": "en"}}})
	}
	dir := t.TempDir()
	writeTables(t, dir,
		tableFixture{Name: "qa.parquet", Format: "parquet", RowGroupRows: 5, Schema: []tableField{{Name: "question", Type: "string"}, {Name: "answer", Type: "string"}}, Rows: qa},
		tableFixture{Name: "dialog.arrow", Format: "arrow-stream", BatchRows: 5, Schema: []tableField{{Name: "dialog", Type: "list<struct<speaker:string,text:string,lang:string>>"}}, Rows: dialog})
	wantQA := open(writeFile(t, "canon.jsonl", jsonlOf(t, canon, nil)), "")
	wantChat := open(writeFile(t, "chat.jsonl", jsonlOf(t, chat, nil)), "")
	for _, c := range []struct {
		path, cols string
		want       tokens
	}{
		{filepath.Join(dir, "qa.parquet"), "prompt=question, completion=answer", wantQA},
		{writeFile(t, "qa.jsonl", jsonlOf(t, qa, nil)), "completion=answer,prompt=question", wantQA},
		{filepath.Join(dir, "dialog.arrow"), "messages=dialog,role=speaker,content=text", wantChat},
		{writeFile(t, "dialog.jsonl", jsonlOf(t, dialog, nil)), "messages=dialog,role=speaker,content=text", wantChat},
	} {
		if got := open(c.path, c.cols); !got.equal(c.want) {
			t.Errorf("%s with %s: %q, want %q", c.path, c.cols, got.exampleText(0), c.want.exampleText(0))
		}
	}
	// Without the names, the file is refused naming its columns and the conventions.
	_, err := Open(filepath.Join(dir, "qa.parquet"), o)
	if err == nil || !strings.Contains(err.Error(), "qa.parquet") || !strings.Contains(err.Error(), "question, answer") || !strings.Contains(err.Error(), `"messages"`) {
		t.Errorf("qa.parquet without --data-columns: %v, want its columns and the conventions named", err)
	}
	for _, bad := range []string{"prompt", "prompt=", "question=q", "text=a,text=b"} {
		if _, err := ParseColumns(bad); err == nil {
			t.Errorf("ParseColumns(%q) took it", bad)
		}
	}
	if c, _ := ParseColumns("prompt=q,completion=a"); c.String() != "completion=a,prompt=q" {
		t.Errorf("Columns.String: %q", c.String())
	}
}

// TestTableShards: a directory of Parquet shards and a glob of them are
// read in the order of their names, as one table; a save_to_disk
// directory in the order state.json lists its Arrow files; a DatasetDict
// gives its train split to training and validation, else test, to
// evaluation, and names its splits when it has neither. Each gives the
// token file of the same rows as JSONL.
func TestTableShards(t *testing.T) {
	var rows []tableRowJS
	for i := range 40 {
		rows = append(rows, tableRowJS{"text": fmt.Sprintf("example %d", i)})
	}
	schema := []tableField{{Name: "text", Type: "string"}}
	dir := t.TempDir()
	writeTables(t, dir,
		// Written out of order: the names decide.
		tableFixture{Name: "shards/train-00001-of-00002.parquet", Format: "parquet", RowGroupRows: 6, Schema: schema, Rows: rows[25:]},
		tableFixture{Name: "shards/train-00000-of-00002.parquet", Format: "parquet", RowGroupRows: 6, Schema: schema, Rows: rows[:25]},
		// state.json lists b before a.
		tableFixture{Name: "saved/b.arrow", Format: "arrow-stream", BatchRows: 7, Schema: schema, Rows: rows[:10]},
		tableFixture{Name: "saved/a.arrow", Format: "arrow-stream", BatchRows: 7, Schema: schema, Rows: rows[10:]},
		tableFixture{Name: "dict/train/data-00000-of-00001.arrow", Format: "arrow-stream", Schema: schema, Rows: rows},
		tableFixture{Name: "dict/test/data-00000-of-00001.arrow", Format: "arrow-stream", Schema: schema, Rows: rows[:5]},
	)
	state := func(dir string, files ...string) {
		var list []string
		for _, f := range files {
			list = append(list, fmt.Sprintf(`{"filename": %q}`, f))
		}
		os.WriteFile(filepath.Join(dir, "state.json"), []byte(`{"_data_files": [`+strings.Join(list, ", ")+`], "_fingerprint": "f", "_split": null}`), 0o644)
		os.WriteFile(filepath.Join(dir, "dataset_info.json"), []byte(`{"features": {"text": {"dtype": "string", "_type": "Value"}}}`), 0o644)
	}
	state(filepath.Join(dir, "saved"), "b.arrow", "a.arrow")
	state(filepath.Join(dir, "dict", "train"), "data-00000-of-00001.arrow")
	state(filepath.Join(dir, "dict", "test"), "data-00000-of-00001.arrow")
	os.WriteFile(filepath.Join(dir, "dict", "dataset_dict.json"), []byte(`{"splits": ["train", "test"]}`), 0o644)

	o := Options{Tokenizer: specialBytes{}, Dir: t.TempDir()}
	jsonl := func(rows []tableRowJS) tokens {
		s, err := Open(writeFile(t, "rows.jsonl", jsonlOf(t, rows, nil)), o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return readTokens(t, s)
	}
	all, head := jsonl(rows), jsonl(rows[:5])
	for _, c := range []struct {
		path          string
		splits        []string
		want          tokens
		format        Format
		files         int
		batches       int64
		split, source string
	}{
		{filepath.Join(dir, "shards"), nil, all, Parquet, 2, 5 + 3, "", ""},
		{filepath.Join(dir, "shards", "train-*.parquet"), nil, all, Parquet, 2, 8, "", ""},
		{filepath.Join(dir, "saved"), nil, all, Arrow, 2, 2 + 5, "", ""},
		{filepath.Join(dir, "dict"), TrainSplits, all, Arrow, 1, 1, "train", ""},
		{filepath.Join(dir, "dict"), EvalSplits, head, Arrow, 1, 1, "test", ""},
	} {
		o := o
		o.Splits = c.splits
		s, err := Open(c.path, o)
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		if got := readTokens(t, s); !got.equal(c.want) {
			t.Errorf("%s %v: %d examples (first %q), want %d (%q)", c.path, c.splits, len(got.spans), got.exampleText(0), len(c.want.spans), c.want.exampleText(0))
		}
		if st := s.Stats; st.Format != c.format || st.Files != c.files || st.Batches != c.batches || st.Split != c.split {
			t.Errorf("%s: %s, %d files, %d batches, split %q; want %s, %d, %d, %q", c.path, st.Format, st.Files, st.Batches, st.Split, c.format, c.files, c.batches, c.split)
		}
		if f, err := DetectFormat(c.path); err != nil || f != c.format {
			t.Errorf("DetectFormat(%s): %v %v, want %v", c.path, f, err, c.format)
		}
		s.Close()
	}
	// Sizes: Stats.Source is every file's.
	s, err := Open(filepath.Join(dir, "shards"), o)
	if err != nil {
		t.Fatal(err)
	}
	var size int64
	for _, n := range []string{"train-00000-of-00002.parquet", "train-00001-of-00002.parquet"} {
		fi, _ := os.Stat(filepath.Join(dir, "shards", n))
		size += fi.Size()
	}
	if s.Stats.Source != size {
		t.Errorf("Stats.Source %d, want the shards' %d", s.Stats.Source, size)
	}
	s.Close()

	os.WriteFile(filepath.Join(dir, "dict", "dataset_dict.json"), []byte(`{"splits": ["train", "extra"]}`), 0o644)
	o.Splits = EvalSplits
	if _, err := Open(filepath.Join(dir, "dict"), o); err == nil || !strings.Contains(err.Error(), "splits train, extra") || !strings.Contains(err.Error(), "validation or test") {
		t.Errorf("a DatasetDict without validation or test for evaluation: %v, want its splits named", err)
	}
	if _, err := Open(filepath.Join(dir, "shards", "nothing-*.parquet"), o); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a glob matching nothing: %v, want fs.ErrNotExist", err)
	}
}

// TestTableValues: the values of a table's columns as the chat template
// reads them, as the same values in a JSONL line decode: strings plain,
// large and dictionary-encoded (as pqarrow hands a dictionary-encoded
// column over when the file's Arrow schema says so), integers, floats,
// bools, nulls, lists and structs, fields in order.
func TestTableValues(t *testing.T) {
	mem := memory.NewGoAllocator()
	db := array.NewDictionaryBuilder(mem, &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int8, ValueType: arrow.BinaryTypes.String}).(*array.BinaryDictionaryBuilder)
	for _, s := range []string{"user", "assistant", "user"} {
		db.AppendString(s)
	}
	db.AppendNull()
	dict := db.NewArray()
	defer dict.Release()
	if !stringType(dict.DataType()) {
		t.Errorf("a dictionary of strings is not read as strings")
	}
	for i, want := range []any{"user", "assistant", "user", nil} {
		if got, err := tableValue(dict, i, 0); err != nil || got != want {
			t.Errorf("dictionary value %d: %v %v, want %v", i, got, err, want)
		}
	}
	st := arrow.StructOf(arrow.Field{Name: "role", Type: &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int8, ValueType: arrow.BinaryTypes.String}, Nullable: true},
		arrow.Field{Name: "content", Type: arrow.BinaryTypes.LargeString, Nullable: true},
		arrow.Field{Name: "n", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
		arrow.Field{Name: "w", Type: arrow.PrimitiveTypes.Float32, Nullable: true},
		arrow.Field{Name: "ok", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
		arrow.Field{Name: "tags", Type: arrow.ListOf(arrow.BinaryTypes.String), Nullable: true})
	lt := arrow.ListOf(st)
	if err := (Columns{}).checkType(ConvMessages, "messages", lt); err != nil {
		t.Errorf("checkType(%s): %v", lt, err)
	}
	arr, _, err := array.FromJSON(mem, lt, strings.NewReader(`[[{"role": "user", "content": "hi", "n": 3, "w": 0.5, "ok": true, "tags": ["a", null]}, {"role": "assistant", "content": "yo", "n": null, "w": null, "ok": null, "tags": null}], null]`))
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Release()
	v, err := tableValue(arr, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decodeOrdered([]byte(`[{"role": "user", "content": "hi", "n": 3, "w": 0.5, "ok": true, "tags": ["a", null]}, {"role": "assistant", "content": "yo", "n": null, "w": null, "ok": null, "tags": null}]`))
	if !reflect.DeepEqual(v, want) {
		t.Errorf("tableValue: %#v\nwant %#v", plain(v), plain(want))
	}
	if v, err := tableValue(arr, 1, 0); v != nil || err != nil {
		t.Errorf("a null list: %v %v", v, err)
	}
}
