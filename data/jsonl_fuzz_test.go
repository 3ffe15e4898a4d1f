package data

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// jsonlSeeds are the lines of the JSONL tests: TestEncodeLines' good
// ones, TestBadLines' malformed ones, and TestDecodeOrdered's values
// inside "messages".
var jsonlSeeds = []string{
	`{"text": "hello"}`,
	`{"prompt": "2+2=", "completion": "4", "id": 7}`,
	`{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}`,
	`{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}`,
	`{"messages": [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Yo"}]}`,
	`{"text": "unterminated}`, `{"text": 5}`, `[1, 2]`, `{"id": 1}`, `{"text": "a", "messages": []}`,
	`{"prompt": "a"}`, `{"messages": "hi"}`, `{"messages": []}`, `{"messages": [{"role": "user"}]}`,
	`{"messages": [{"role": "user", "content": "a"}, {"role": 3, "content": "b"}]}`,
	`{"messages": [{"role": "user", "content": null}]}`, `{"messages": ["hi"]}`, `{"text": "a"} trailing`,
	`{"prompt": "a", "completion": ""}`, `{"messages": null, "text": "x"}`,
	`{"messages": [{"role": "user", "content": "esc \" \\ \/ \b \f \n \r \t \u00e9 \u20ac pair \ud83d\ude00 lone \ud83d x"}]}`,
	"{\"text\": \"bad \xff utf8 \xe2\x82\"}",
	`{"messages": [{"content": "b", "role": "assistant", "x": {"b": 1, "a": [true, false, null, -2.5e3, 0, 12345678901234, 1e400]}}]}`,
	// ShareGPT's and Alpaca's conventions, good and bad.
	`{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}`,
	`{"conversations": [{"from": "system", "value": "S"}, {"from": "user", "value": "a"}, {"from": "chatgpt", "value": "b"}]}`,
	`{"conversations": [{"from": "narrator", "value": "x"}]}`, `{"conversations": [{"from": "human"}]}`, `{"conversations": {}}`,
	`{"instruction": "Add", "input": "2 and 2", "output": "4"}`, `{"instruction": "Say hi", "input": "", "output": "hi", "system": "Be brief."}`,
	`{"instruction": "a", "output": "b", "text": "rendered"}`, `{"instruction": "a"}`, `{"instruction": 1, "output": "b"}`,
	`{"conversations": [{"from": "human", "value": "a"}], "messages": []}`,
}

// FuzzJSONLLine: a line of a JSONL data file (the user's, so anything)
// encodes to an example or an error, never panics, encodes the same way
// twice, and an example's ids and loss bits agree in length. The
// messages' decoder reads every valid JSON value as encoding/json does
// (or refuses one nested deeper than its bound).
func FuzzJSONLLine(f *testing.F) {
	for _, s := range jsonlSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		enc := newEncoder(Bytes{}, nil)
		ex, kind, err := enc.line(b, "f:1")
		ids, train := slices.Clone(ex.ids), slices.Clone(ex.train)
		ex2, kind2, err2 := enc.line(b, "f:1")
		if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() {
			t.Fatalf("encoded twice: %v, then %v", err, err2)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f:1") {
				t.Fatalf("error %q does not name the line", err)
			}
		} else {
			if kind != kind2 || !slices.Equal(ids, ex2.ids) || !slices.Equal(train, ex2.train) {
				t.Fatalf("encoded twice: kind %d %v, then kind %d %v", kind, ids, kind2, ex2.ids)
			}
			if kind < 0 || kind >= kindCount || len(ids) != len(train) {
				t.Fatalf("kind %d, %d ids and %d loss bits", kind, len(ids), len(train))
			}
		}
		if !json.Valid(b) {
			return
		}
		var want any
		if json.Unmarshal(b, &want) != nil {
			return
		}
		got, err := decodeOrdered(b)
		if err != nil {
			if !strings.Contains(err.Error(), "nested more than") {
				t.Fatalf("valid JSON refused: %v", err)
			}
			return
		}
		if !reflect.DeepEqual(plain(got), want) {
			t.Fatalf("decodeOrdered %#v, encoding/json %#v", plain(got), want)
		}
	})
}
