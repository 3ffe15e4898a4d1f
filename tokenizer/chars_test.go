package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// charToy is a small tokenizer.json over characters, as Llama 2's: vocab
// is the tokens in id order after <unk> (id 0) and, with fallback, the 256
// tokens <0x00>..<0xFF> (ids 1-256); merges are pairs of tokens.
type charToy struct {
	vocab    []string
	merges   [][2]string
	fallback bool
	unk      string // "": null
	fuseUnk  bool
	// The components as JSON; "" is the default (Llama 2's).
	added, normalizer, preTokenizer, decoder string
}

// load writes the file and loads it.
func (c charToy) load(t *testing.T) (*Tokenizer, map[string]int32) {
	t.Helper()
	path, ids := c.write(t)
	tok, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok, ids
}

// write writes the tokenizer.json and returns its path and the id of each
// token.
func (c charToy) write(t *testing.T) (string, map[string]int32) {
	t.Helper()
	ids := map[string]int32{"<unk>": 0}
	if c.fallback {
		for b := range 256 {
			ids[fmt.Sprintf("<0x%02X>", b)] = int32(len(ids))
		}
	}
	for _, v := range c.vocab {
		ids[v] = int32(len(ids))
	}
	var unk any
	if c.unk != "" {
		unk = c.unk
	}
	model, err := json.Marshal(map[string]any{"type": "BPE", "dropout": nil, "unk_token": unk,
		"continuing_subword_prefix": nil, "end_of_word_suffix": nil, "fuse_unk": c.fuseUnk, "byte_fallback": c.fallback,
		"vocab": ids, "merges": c.merges})
	if err != nil {
		t.Fatal(err)
	}
	or := func(s, def string) string {
		if s == "" {
			return def
		}
		return s
	}
	f := `{"version": "1.0", "truncation": null, "padding": null,
		"added_tokens": ` + or(c.added, "[]") + `,
		"normalizer": ` + or(c.normalizer, `{"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}`) + `,
		"pre_tokenizer": ` + or(c.preTokenizer, "null") + `,
		"post_processor": null,
		"decoder": ` + or(c.decoder, `{"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}`) + `,
		"model": ` + string(model) + `}`
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, []byte(f), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, ids
}

// TestCharByteFallback: over characters, a character without a token is
// its UTF-8 bytes as <0xAB> tokens, which merge with nothing; Llama 2's
// normalizer and decoder give the text back.
func TestCharByteFallback(t *testing.T) {
	tok, ids := charToy{vocab: []string{"▁", "a", "b", "▁a", "ab"}, merges: [][2]string{{"▁", "a"}, {"a", "b"}}, fallback: true, unk: "<unk>"}.load(t)
	got := tok.Encode("a ab é", false)
	want := idsOf(ids, "▁a", "▁a", "b", "▁", "<0xC3>", "<0xA9>")
	if !slices.Equal(got, want) {
		t.Fatalf("Encode: %v, want %v", got, want)
	}
	for _, c := range []struct {
		ids  []int32
		want string
	}{
		{got, "a ab é"},
		{idsOf(ids, "<0xC3>"), "\xc3"}, // a cut character gives its bytes so far
		{idsOf(ids, "▁", "▁a", "<0x0A>", "b"), " a\nb"},
		{nil, ""},
	} {
		if s, err := tok.Decode(c.ids); err != nil || s != c.want {
			t.Errorf("Decode(%v) = %q, %v; want %q", c.ids, s, err, c.want)
		}
	}
	// A one-byte piece: no normalizer, so "a" alone goes the short way.
	tok, ids = charToy{vocab: []string{"a"}, fallback: true, normalizer: `{"type": "NFC"}`}.load(t)
	if got, want := tok.Encode("a\xff", false), idsOf(ids, "a", "<0xFF>"); !slices.Equal(got, want) {
		t.Errorf("invalid UTF-8: %v, want %v", got, want)
	}
}

// TestCharUnknown: without byte fallback, a character without a token is
// unk_token, one for a run of them with fuse_unk, nothing without
// unk_token.
func TestCharUnknown(t *testing.T) {
	for _, c := range []struct {
		unk     string
		fuseUnk bool
		want    []string
	}{
		{"<unk>", true, []string{"a", "<unk>", "a", "<unk>"}},
		{"<unk>", false, []string{"a", "<unk>", "<unk>", "a", "<unk>"}},
		{"", false, []string{"a", "a"}},
	} {
		tok, ids := charToy{vocab: []string{"a"}, unk: c.unk, fuseUnk: c.fuseUnk, normalizer: "null", decoder: `{"type": "Fuse"}`}.load(t)
		if got, want := tok.Encode("aéça€", false), idsOf(ids, c.want...); !slices.Equal(got, want) {
			t.Errorf("unk %q fuse %v: %v, want %v %q", c.unk, c.fuseUnk, got, want, c.want)
		}
	}
}

// TestMetaspace: Metaspace writes spaces as ▁, prepends one as its scheme
// says (first: only to the piece that begins the text, not after an added
// token), and with split cuts before each ▁.
func TestMetaspace(t *testing.T) {
	vocab := []string{"▁", "a", "b", "c", "a▁", "▁a", "▁b", "▁c"}
	merges := [][2]string{{"a", "▁"}, {"▁", "a"}, {"▁", "b"}, {"▁", "c"}}
	for _, c := range []struct {
		scheme string
		split  bool
		want   []string
	}{
		{"first", false, []string{"▁", "a▁", "b", "<x>", "c"}},
		{"always", false, []string{"▁", "a▁", "b", "<x>", "▁c"}},
		{"never", false, []string{"a▁", "b", "<x>", "c"}},
		{"first", true, []string{"▁a", "▁b", "<x>", "c"}},
		{"never", true, []string{"a", "▁b", "<x>", "c"}},
	} {
		pre := fmt.Sprintf(`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": %q, "split": %v}`, c.scheme, c.split)
		tok, ids := charToy{vocab: vocab, merges: merges, normalizer: "null", preTokenizer: pre,
			added:   `[{"id": 100, "content": "<x>", "special": true}]`,
			decoder: `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "` + c.scheme + `", "split": true}`}.load(t)
		ids["<x>"] = 100
		got := tok.Encode("a b<x>c", false)
		if want := idsOf(ids, c.want...); !slices.Equal(got, want) {
			t.Errorf("%s split %v: %v, want %v %q", c.scheme, c.split, got, want, c.want)
		}
		wantText := map[string]string{"first": "a b<x>c", "always": "a b<x> c", "never": "a b<x>c"}[c.scheme]
		if s, err := tok.Decode(got); err != nil || s != wantText {
			t.Errorf("%s split %v: Decode %q, %v; want %q", c.scheme, c.split, s, err, wantText)
		}
	}
}

// TestSplitBehaviors: what Split does with its matches, as Hugging Face's
// SplitDelimiterBehavior does (a match joins a neighbour that is not a
// match itself).
func TestSplitBehaviors(t *testing.T) {
	for _, c := range []struct {
		b    behavior
		want []string
	}{
		{isolated, []string{"a", "-", "b", "-", "-", "c", "-"}},
		{removed, []string{"a", "b", "c"}},
		{mergedWithPrevious, []string{"a-", "b-", "-", "c-"}},
		{mergedWithNext, []string{"a", "-b", "-", "-c", "-"}},
	} {
		var got []string
		c.b.apply(literalSplitter{"-"}, "a-b--c-", func(p string, _ bool) { got = append(got, p) })
		if !slices.Equal(got, c.want) {
			t.Errorf("behavior %d: %q, want %q", c.b, got, c.want)
		}
	}
	var got []string
	mergedWithNext.apply(literalSplitter{"-"}, "--x", func(p string, _ bool) { got = append(got, p) })
	if want := []string{"-", "-x"}; !slices.Equal(got, want) {
		t.Errorf("merged with next at the start: %q, want %q", got, want)
	}
}

// TestNormalizers: Strip, Replace with a Regex, NFKC and Prepend in a
// Sequence, and added tokens marked normalized matched as the normalizer
// writes them.
func TestNormalizers(t *testing.T) {
	tok, ids := charToy{vocab: []string{"_", "a", "b", "1", " "}, normalizer: `{"type": "Sequence", "normalizers": [
			{"type": "Strip", "strip_left": true, "strip_right": true},
			{"type": "NFKC"},
			{"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
			{"type": "Prepend", "prepend": "_"}]}`,
		added:   `[{"id": 100, "content": "a  b", "special": false, "normalized": true}]`,
		decoder: `{"type": "Fuse"}`}.load(t)
	ids["a  b"] = 100
	for in, want := range map[string][]string{
		" \u3000a   b\t": {"a  b"}, // the token, normalized, is "_a b": so is the text
		"１ ab":           {"_", "1", " ", "a", "b"},
		"  ":             nil,
	} {
		if got := tok.Encode(in, false); !slices.Equal(got, idsOf(ids, want...)) {
			t.Errorf("Encode(%q) = %v, want %q", in, got, want)
		}
	}
}

// TestDecoders: Strip (start and stop, per token before Fuse), Replace,
// ByteFallback in a Sequence; Metaspace drops every ▁ of the first token,
// as Hugging Face's Rust decoder does.
func TestDecoders(t *testing.T) {
	tok, ids := charToy{vocab: []string{"a▁b", "▁c"}, normalizer: "null",
		decoder: `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}`}.load(t)
	if got, err := tok.Decode(idsOf(ids, "a▁b", "▁c", "a▁b")); err != nil || got != "ab ca b" {
		t.Errorf("Metaspace: %q, %v; want %q", got, err, "ab ca b")
	}
	tok, ids = charToy{vocab: []string{"xxaxx", "▁b", "x"}, fallback: true, normalizer: "null",
		decoder: `{"type": "Sequence", "decoders": [{"type": "Strip", "content": "x", "start": 1, "stop": 2},
			{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]}`}.load(t)
	got, err := tok.Decode(idsOf(ids, "xxaxx", "▁b", "x", "<0xE2>", "<0x82>", "<0xAC>"))
	if want := "xa b€"; err != nil || got != want {
		t.Errorf("Decode: %q, %v; want %q", got, err, want)
	}
}

// TestCharLoadErrors: each bad component of a tokenizer over characters
// is one error naming its JSON path.
func TestCharLoadErrors(t *testing.T) {
	for _, c := range []struct {
		toy  charToy
		want string
	}{
		{charToy{unk: "<nope>"}, `model.unk_token: "<nope>" is not in model.vocab`},
		{charToy{normalizer: `{"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}, {"type": "Precompiled"}]}`}, `normalizer.normalizers[1].type: "Precompiled" is not supported`},
		{charToy{normalizer: `{"type": "Replace", "pattern": {"Regex": "(a"}, "content": ""}`}, `normalizer.pattern.Regex: "(a": not supported`},
		{charToy{decoder: `{"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "CTC"}]}`}, `decoder.decoders[1].type: "CTC" is not supported`},
		{charToy{decoder: `{"type": "ByteLevel"}`}, `decoder.type: "ByteLevel" is not supported`},
		{charToy{decoder: `{"type": "Strip", "content": " ", "start": -1, "stop": 0}`}, `decoder.start: -1: want a count`},
		{charToy{decoder: `{"type": "Replace", "pattern": {"Regex": "▁"}, "content": " "}`}, `decoder.pattern: {"Regex": "▁"} is not supported`},
		{charToy{preTokenizer: `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "maybe"}`}, `pre_tokenizer.prepend_scheme: "maybe" is not supported`},
	} {
		path, _ := c.toy.write(t)
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("got %v, want an error naming the file and containing %q", err, c.want)
		}
		if unsupported := strings.Contains(c.want, "not supported"); errors.Is(err, ErrUnsupported) != unsupported {
			t.Errorf("%v: errors.Is(err, ErrUnsupported) = %v, want %v", err, !unsupported, unsupported)
		}
	}
}

// TestWordCut: a piece is cut into words before "▁" only where no token
// holds the character before it and "▁" together; the ids are those of
// the whole piece merged at once (the cut switched off).
func TestWordCut(t *testing.T) {
	// "a▁" is a token, so "▁a▁b" is not cut after "a": merged whole, the
	// rule a+▁ (rank 0) takes the "▁" that "▁b" (rank 1) would have had.
	tok, ids := charToy{vocab: []string{"▁", "a", "b", "c", "é", "a▁", "▁b", "▁c"},
		merges: [][2]string{{"a", "▁"}, {"▁", "b"}, {"▁", "c"}}, fallback: true, unk: "<unk>"}.load(t)
	for _, c := range []struct {
		piece string
		words []string
	}{
		{"▁a▁b", []string{"▁a▁b"}},
		{"▁b▁c▁a▁b", []string{"▁b", "▁c", "▁a▁b"}},
		{"▁▁b", []string{"▁", "▁b"}},
		{"▁é▁c", []string{"▁é", "▁c"}},
		{"▁ü▁c", []string{"▁ü▁c"}},       // byte fallback before "▁": not cut
		{"▁\xff▁c", []string{"▁\xff▁c"}}, // nor after a byte that is not UTF-8
		{"▁", []string{"▁"}},
	} {
		var words []string
		for rest := c.piece; rest != ""; {
			var w string
			w, rest = tok.cut.next(rest)
			words = append(words, w)
		}
		if !slices.Equal(words, c.words) {
			t.Errorf("%q: words %q, want %q", c.piece, words, c.words)
		}
	}
	if got, want := tok.Encode("a b", false), idsOf(ids, "▁", "a▁", "b"); !slices.Equal(got, want) {
		t.Errorf("Encode(\"a b\") = %v, want %v", got, want)
	}
	tok, _ = charToy{vocab: []string{"▁", "a"}, merges: nil, fallback: true}.load(t)
	if tok.cut == nil {
		t.Error("no cut for a vocabulary with ▁")
	}
	tok, _ = charToy{vocab: []string{"a", "b"}, merges: nil, fallback: true}.load(t)
	if tok.cut != nil {
		t.Error("a cut for a vocabulary without ▁")
	}
}

// TestWordCutReal: on Llama 2's and Gemma 3's vocabularies, the corpus
// encodes to the same ids with the cut and without it.
func TestWordCutReal(t *testing.T) {
	text, random := corpusParts(t)
	docs := append(text[:min(len(text), 60)], random...)
	for _, v := range vocabularies {
		if v.name != "llama2" && v.name != "gemma3" {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			tok, err := Load(vocabPath(t, v.pkg))
			if err != nil {
				t.Fatal(err)
			}
			if tok.cut == nil {
				t.Fatal("no cut")
			}
			with := make([][]int32, len(docs))
			for i, d := range docs {
				with[i] = tok.Encode(d, false)
			}
			tok.cut = nil
			tok.cache.reset()
			for i, d := range docs {
				if got := tok.Encode(d, false); !slices.Equal(got, with[i]) {
					t.Fatalf("document %d: %d ids cut into words, %d whole", i, len(with[i]), len(got))
				}
			}
		})
	}
}
