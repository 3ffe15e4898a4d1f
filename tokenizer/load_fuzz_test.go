package tokenizer

import (
	"strings"
	"testing"
)

// FuzzParse: a tokenizer.json (a download, so anything) loads to a
// tokenizer or an error, never panics, loads the same way twice, and a
// tokenizer it loads encodes text to ids below its vocabulary size and
// decodes them back without panicking. Seeded with the toy tokenizers of
// the tests (every component kind they exercise) and the files of
// TestLoadFileErrors.
func FuzzParse(f *testing.F) {
	for _, c := range []toy{
		{},
		{merges: [][2]string{{"a", "b"}}},
		{merges: [][2]string{{" ", "t"}, {"h", "e"}, {" t", "he"}, {"\xe4", "\xb8"}}, ignoreMerges: true},
		{merges: [][2]string{{"a", "b"}}, extra: []string{"<s>", "</s>"},
			added:         `[{"id": 258, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 259, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}]`,
			postProcessor: `{"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [258], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [259], "tokens": ["</s>"]}}}`},
		{normalizer: `{"type": "NFC"}`, preTokenizer: `{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\d{1,3}"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}`},
		{decoder: `{"type": "WordPiece"}`},
		{postProcessor: `{"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}`},
	} {
		b, _ := c.file()
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(`[1, 2]`))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<17 {
			return
		}
		tok, err := parse(b)
		tok2, err2 := parse(b)
		if err != nil {
			if tok != nil || err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("loaded twice: %v, then %v", err, err2)
			}
			return
		}
		if err2 != nil {
			t.Fatalf("loaded, then refused: %v", err2)
		}
		for _, s := range []string{"", "hello world", " the\n\t'sx9 123", "\xff\xe4\xb8\x80<s></s>"} {
			ids := tok.Encode(s, true)
			ids2 := tok2.Encode(s, true)
			if len(ids) != len(ids2) {
				t.Fatalf("%q: %v, then %v", s, ids, ids2)
			}
			for i, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() || id != ids2[i] {
					t.Fatalf("%q: id %d of %v (vocabulary %d; again %v)", s, id, ids, tok.VocabSize(), ids2)
				}
			}
			_, _ = tok.Decode(ids)
		}
	})
}

// TestVocabErrorsSameEveryTime: FuzzParse's find
// (testdata/fuzz/FuzzParse/bd0b936fac5bde6d): two tokens of one id were
// named in the map's order, so one file gave two messages; the least
// pair is named now, as is the least token of an id out of range.
func TestVocabErrorsSameEveryTime(t *testing.T) {
	for in, want := range map[string]string{
		`{"model": {"type":"BPE","vocab":{"#":3,"":3}}}`:                    `model.vocab: "" and "#" both have id 3`,
		`{"model": {"type":"BPE","vocab":{"c":3,"b":3,"a":3,"d":1}}}`:       `model.vocab: "a" and "b" both have id 3`,
		`{"model": {"type":"BPE","vocab":{"z":-1,"y":-2,"x":99999999999}}}`: `model.vocab["x"]: id 99999999999 out of range`,
	} {
		for range 20 {
			if _, err := parse([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: %v, want %q", in, err, want)
			}
		}
	}
}
