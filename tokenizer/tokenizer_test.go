package tokenizer

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// toy is a small byte-level BPE tokenizer.json for tests: the 256 bytes
// are ids 0-255 (byte order), then the tokens the merges make, in order,
// then extra; merges and extra are raw bytes.
type toy struct {
	merges       [][2]string
	extra        []string
	ignoreMerges bool
	// The components as JSON; "" is the default (GPT-2's).
	added, normalizer, preTokenizer, postProcessor, decoder string
}

// file returns the tokenizer.json and the id of each raw token.
func (c toy) file() ([]byte, map[string]int32) {
	ids := map[string]int32{}
	vocab := map[string]int32{}
	addTok := func(raw string) {
		if _, ok := ids[raw]; !ok {
			ids[raw] = int32(len(ids))
			vocab[mapByteLevel(raw)] = ids[raw]
		}
	}
	for b := 0; b < 256; b++ {
		addTok(string([]byte{byte(b)}))
	}
	merges := []string{}
	for _, m := range c.merges {
		addTok(m[0] + m[1])
		merges = append(merges, mapByteLevel(m[0])+" "+mapByteLevel(m[1]))
	}
	for _, e := range c.extra {
		addTok(e)
	}
	or := func(s, def string) string {
		if s == "" {
			return def
		}
		return s
	}
	model, err := json.Marshal(map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil,
		"continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
		"ignore_merges": c.ignoreMerges, "vocab": vocab, "merges": merges})
	if err != nil {
		panic(err)
	}
	f := `{"version": "1.0", "truncation": null, "padding": null,
		"added_tokens": ` + or(c.added, "[]") + `,
		"normalizer": ` + or(c.normalizer, "null") + `,
		"pre_tokenizer": ` + or(c.preTokenizer, `{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}`) + `,
		"post_processor": ` + or(c.postProcessor, `{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}`) + `,
		"decoder": ` + or(c.decoder, `{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}`) + `,
		"model": ` + string(model) + `}`
	return []byte(f), ids
}

// load writes the file and loads it.
func (c toy) load(t *testing.T) (*Tokenizer, map[string]int32) {
	t.Helper()
	b, ids := c.file()
	path := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok, ids
}

// idsOf spells the expected ids by raw token.
func idsOf(ids map[string]int32, toks ...string) []int32 {
	out := make([]int32, len(toks))
	for i, s := range toks {
		id, ok := ids[s]
		if !ok {
			panic("no token " + s)
		}
		out[i] = id
	}
	return out
}

// TestMergeRank: the merge of lowest rank applies first, at its leftmost
// place, whatever order the pairs appear in the word.
func TestMergeRank(t *testing.T) {
	for _, c := range []struct {
		name   string
		merges [][2]string
		text   string
		want   []string
	}{
		{"left pair first", [][2]string{{"a", "b"}, {"b", "c"}}, "abc", []string{"ab", "c"}},
		{"right pair first", [][2]string{{"b", "c"}, {"a", "b"}}, "abc", []string{"a", "bc"}},
		{"leftmost of equals", [][2]string{{"a", "a"}}, "aaa", []string{"aa", "a"}},
		{"chain", [][2]string{{"a", "a"}, {"aa", "aa"}, {"aaaa", "a"}}, "aaaaa", []string{"aaaaa"}},
		{"rank beats position", [][2]string{{"c", "d"}, {"b", "c"}, {"a", "b"}}, "abcd", []string{"ab", "cd"}},
		{"no merge", nil, "xyz", []string{"x", "y", "z"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, ids := toy{merges: c.merges}.load(t)
			want := idsOf(ids, c.want...)
			if got := tok.Encode(c.text, false); !slices.Equal(got, want) {
				t.Errorf("Encode(%q) = %v, want %v %q", c.text, got, want, c.want)
			}
			// Encode took the scan; the tree gives the same merges.
			if got := tok.bpeTree(tok.alphabet.symbols(c.text, nil), &scratch{}, nil); !slices.Equal(got, want) {
				t.Errorf("bpeTree(%q) = %v, want %v", c.text, got, want)
			}
		})
	}
}

// TestScanTreeAgree: on random words over a small alphabet with random
// merges, the tree and the scan apply the same merges.
func TestScanTreeAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "c", "d"}
	toks := slices.Clone(alphabet)
	var merges [][2]string
	seen := map[string]bool{}
	for len(merges) < 60 {
		a, b := toks[rng.IntN(len(toks))], toks[rng.IntN(len(toks))]
		if len(a+b) > 6 || seen[a+" "+b] {
			continue
		}
		seen[a+" "+b] = true
		merges = append(merges, [2]string{a, b})
		toks = append(toks, a+b)
	}
	tok, _ := toy{merges: merges}.load(t)
	s := &scratch{}
	for range 3000 {
		var w strings.Builder
		for range 1 + rng.IntN(120) {
			w.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		scan := tok.bpeScan(tok.alphabet.symbols(w.String(), nil), s, nil)
		tree := tok.bpeTree(tok.alphabet.symbols(w.String(), nil), s, nil)
		if !slices.Equal(scan, tree) {
			t.Fatalf("%q: scan %v, tree %v", w.String(), scan, tree)
		}
	}
}

// TestIgnoreMerges: with ignore_merges a piece that is a whole token is
// that token, even where the merges do not make it.
func TestIgnoreMerges(t *testing.T) {
	c := toy{merges: [][2]string{{"a", "b"}}, extra: []string{"abc"}}
	tok, ids := c.load(t)
	if got, want := tok.Encode("abc", false), idsOf(ids, "ab", "c"); !slices.Equal(got, want) {
		t.Errorf("without ignore_merges: %v, want %v", got, want)
	}
	c.ignoreMerges = true
	tok, ids = c.load(t)
	if got, want := tok.Encode("abc abd", false), idsOf(ids, "abc", " ", "ab", "d"); !slices.Equal(got, want) {
		t.Errorf("with ignore_merges: %v, want %v", got, want)
	}
}

// TestAddedTokens: added tokens are found before pre-tokenization,
// leftmost and longest, special or not; normalized ones after NFC.
func TestAddedTokens(t *testing.T) {
	c := toy{added: `[
		{"id": 300, "content": "<a>", "special": true},
		{"id": 301, "content": "<a><b>", "special": true},
		{"id": 302, "content": "é!", "special": false, "normalized": true},
		{"id": 303, "content": "<a", "special": false}]`,
		normalizer: `{"type": "NFC"}`}
	tok, ids := c.load(t)
	enc := func(s string) []int32 { return tok.Encode(s, false) }
	if got, want := enc("x<a><b><a>y<a"), []int32{ids["x"], 301, 300, ids["y"], 303}; !slices.Equal(got, want) {
		t.Errorf("longest first: %v, want %v", got, want)
	}
	// "e" + U+0301 is "é" after NFC, so the normalized token matches it.
	if got, want := enc("e\u0301!"), []int32{302}; !slices.Equal(got, want) {
		t.Errorf("normalized added token: %v, want %v", got, want)
	}
	for content, want := range map[string]int32{"<a>": 300, "é!": 302, "Ġ": ids[" "]} {
		if id, ok := tok.TokenID(content); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", content, id, ok, want)
		}
	}
	if _, ok := tok.TokenID("<nope>"); ok {
		t.Error("TokenID of an unknown token: found")
	}
	if tok.VocabSize() != 304 {
		t.Errorf("VocabSize %d, want 304", tok.VocabSize())
	}
	if s, err := tok.Decode([]int32{301, ids["x"], 302}); err != nil || s != "<a><b>xé!" {
		t.Errorf("Decode: %q, %v", s, err)
	}
}

// TestTemplate: TemplateProcessing's ids around the text when asked for;
// BOS and EOS are the single ids before and after $A.
func TestTemplate(t *testing.T) {
	c := toy{added: `[{"id": 256, "content": "<s>", "special": true}, {"id": 257, "content": "</s>", "special": true}]`,
		postProcessor: `{"type": "Sequence", "processors": [
			{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
			{"type": "TemplateProcessing",
			 "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
			 "pair": [],
			 "special_tokens": {"<s>": {"id": "<s>", "ids": [256], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [257], "tokens": ["</s>"]}}}]}`}
	tok, ids := c.load(t)
	if got, want := tok.Encode("hi", true), []int32{256, ids["h"], ids["i"], 257}; !slices.Equal(got, want) {
		t.Errorf("with specials: %v, want %v", got, want)
	}
	if got, want := tok.Encode("hi", false), idsOf(ids, "h", "i"); !slices.Equal(got, want) {
		t.Errorf("without: %v, want %v", got, want)
	}
	if got := tok.Encode("", true); !slices.Equal(got, []int32{256, 257}) {
		t.Errorf("empty text with specials: %v", got)
	}
	if bos, ok := tok.BOS(); !ok || bos != 256 {
		t.Errorf("BOS %d %v", bos, ok)
	}
	if eos, ok := tok.EOS(); !ok || eos != 257 {
		t.Errorf("EOS %d %v", eos, ok)
	}
	plain, _ := toy{}.load(t)
	if _, ok := plain.BOS(); ok {
		t.Error("BOS without a template or tokenizer_config.json")
	}
}

// TestConfigBOSEOS: tokenizer_config.json beside tokenizer.json names
// BOS and EOS where no template does.
func TestConfigBOSEOS(t *testing.T) {
	b, _ := toy{added: `[{"id": 256, "content": "<|endoftext|>", "special": true}]`}.file()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := `{"bos_token": {"content": "<|endoftext|>", "lstrip": false}, "eos_token": "<|endoftext|>"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	bos, okB := tok.BOS()
	eos, okE := tok.EOS()
	if !okB || !okE || bos != 256 || eos != 256 {
		t.Errorf("BOS %d %v, EOS %d %v; want 256", bos, okB, eos, okE)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "<missing>"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(filepath.Join(dir, "tokenizer.json")); err == nil || !strings.Contains(err.Error(), `eos_token: "<missing>"`) {
		t.Errorf("eos_token naming no token: %v", err)
	}
}

// TestRoundTripBytes: any bytes, valid UTF-8 or not, decode back exactly.
func TestRoundTripBytes(t *testing.T) {
	tok, _ := toy{merges: [][2]string{{" ", "t"}, {"h", "e"}, {" t", "he"}, {"\xe4", "\xb8"}}}.load(t)
	rng := rand.New(rand.NewPCG(7, 7))
	for _, tk := range []*Tokenizer{tok, Bytes()} {
		for range 500 {
			b := make([]byte, rng.IntN(200))
			for i := range b {
				b[i] = byte(rng.UintN(256))
				if rng.IntN(3) == 0 {
					b[i] = " the\n\t'sx9"[rng.IntN(10)]
				}
			}
			ids := tk.Encode(string(b), true)
			got, err := tk.Decode(ids)
			if err != nil || got != string(b) {
				t.Fatalf("Decode(Encode(%q)) = %q, %v", b, got, err)
			}
		}
	}
}

// TestBytes: the byte tokenizer is one id per byte.
func TestBytes(t *testing.T) {
	tok := Bytes()
	if tok.VocabSize() != 256 {
		t.Errorf("VocabSize %d", tok.VocabSize())
	}
	if got := tok.Encode("a\xff\x00", true); !slices.Equal(got, []int32{'a', 0xff, 0}) {
		t.Errorf("Encode: %v", got)
	}
	if _, ok := tok.BOS(); ok {
		t.Error("BOS")
	}
	if _, ok := tok.TokenID("a"); ok {
		t.Error("TokenID")
	}
	for _, id := range []int32{256, -1} {
		if _, err := tok.Decode([]int32{65, id}); err == nil || !strings.Contains(err.Error(), "token 1: id") {
			t.Errorf("Decode of id %d: %v", id, err)
		}
	}
}

// TestDecodeErrors: an id out of range, or in a gap of the id space.
func TestDecodeErrors(t *testing.T) {
	tok, _ := toy{added: `[{"id": 300, "content": "<x>", "special": true}]`}.load(t)
	for id, want := range map[int32]string{301: "out of range [0, 301)", -5: "out of range", 280: "names no token"} {
		if _, err := tok.Decode([]int32{1, 2, id}); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "token 2") {
			t.Errorf("Decode(id %d): %v, want %q", id, err, want)
		}
	}
}

// TestLoadErrors: each bad or unsupported file gets one error naming the
// JSON path and the value.
func TestLoadErrors(t *testing.T) {
	base := func() map[string]any {
		b, _ := toy{merges: [][2]string{{"a", "b"}}}.file()
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	model := func(m map[string]any) map[string]any { return m["model"].(map[string]any) }
	raw := func(s string) any {
		var v any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		name        string
		edit        func(m map[string]any)
		want        string
		unsupported bool
	}{
		{"WordPiece", func(m map[string]any) { model(m)["type"] = "WordPiece" }, `model.type: "WordPiece" is not supported`, true},
		{"Unigram", func(m map[string]any) { model(m)["type"] = "Unigram" }, `model.type: "Unigram" is not supported`, true},
		{"dropout", func(m map[string]any) { model(m)["dropout"] = 0.1 }, `model.dropout: 0.1 is not supported`, true},
		{"merge out of vocab", func(m map[string]any) { model(m)["merges"] = []any{"a b", "x y"} }, `model.merges[1]: "x" "y": "xy" is not in model.vocab`, false},
		{"merge form", func(m map[string]any) { model(m)["merges"] = []any{"a b c"} }, `model.merges[0]: "a b c"`, false},
		{"merge pair form", func(m map[string]any) { model(m)["merges"] = raw(`[["a", "b", "c"]]`) }, `model.merges[0]`, false},
		{"missing byte", func(m map[string]any) { delete(model(m)["vocab"].(map[string]any), "Ġ") }, `no token for byte 0x20`, true},
		{"duplicate id", func(m map[string]any) { model(m)["vocab"].(map[string]any)["zz"] = 5 }, `both have id 5`, false},
		{"id not an integer", func(m map[string]any) { model(m)["vocab"].(map[string]any)["zz"] = 5.5 }, `model.vocab: {`, false},
		{"BertNormalizer", func(m map[string]any) { m["normalizer"] = raw(`{"type": "BertNormalizer"}`) }, `normalizer.type: "BertNormalizer" is not supported`, true},
		{"nested normalizer", func(m map[string]any) {
			m["normalizer"] = raw(`{"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}`)
		}, `normalizer.normalizers[1].type: "Lowercase"`, true},
		{"Metaspace scheme", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes", "split": false}`)
		}, `pre_tokenizer.prepend_scheme: "sometimes" is not supported`, true},
		{"Metaspace replacement", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Metaspace", "replacement": "__", "prepend_scheme": "first"}`)
		}, `pre_tokenizer.replacement: "__": want one character`, false},
		{"Digits", func(m map[string]any) { m["pre_tokenizer"] = raw(`{"type": "Digits", "individual_digits": true}`) }, `pre_tokenizer.type: "Digits" is not supported`, true},
		{"no ByteLevel", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}`)
		}, `decoder.type: "ByteLevel" is not supported (ByteLevel decodes a byte-level vocabulary`, true},
		{"ByteLevel not last", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}, {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}]}`)
		}, `pre_tokenizer.pretokenizers[1]: Split after ByteLevel`, true},
		{"behavior", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "}, "behavior": "Contiguous"}, {"type": "ByteLevel"}]}`)
		}, `pre_tokenizer.pretokenizers[0].behavior: "Contiguous" is not supported`, true},
		{"invert", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": true}, {"type": "ByteLevel"}]}`)
		}, `pretokenizers[0].invert: true is not supported`, true},
		{"bad regex", func(m map[string]any) {
			m["pre_tokenizer"] = raw(`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]}`)
		}, `pre_tokenizer.pretokenizers[0].pattern.Regex: "(a": not supported`, true},
		{"lstrip", func(m map[string]any) {
			m["added_tokens"] = raw(`[{"id": 400, "content": "<m>", "lstrip": true}]`)
		}, `added_tokens[0].lstrip: true is not supported`, true},
		{"Roberta", func(m map[string]any) {
			m["post_processor"] = raw(`{"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}`)
		}, `post_processor.type: "RobertaProcessing" is not supported`, true},
		{"template without $A", func(m map[string]any) {
			m["post_processor"] = raw(`{"type": "TemplateProcessing", "single": [], "special_tokens": {}}`)
		}, `post_processor.single: no {"Sequence"`, false},
		{"template unknown token", func(m map[string]any) {
			m["post_processor"] = raw(`{"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {}}`)
		}, `post_processor.single[0]: special token "<s>" has no ids`, false},
		{"no decoder", func(m map[string]any) { m["decoder"] = nil }, `decoder: null is not supported`, true},
		{"WordPiece decoder", func(m map[string]any) { m["decoder"] = raw(`{"type": "WordPiece"}`) }, `decoder.type: "WordPiece" is not supported`, true},
		{"no model", func(m map[string]any) { delete(m, "model") }, `model: missing`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := base()
			c.edit(m)
			b, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = Load(path)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("got %v, want an error naming %s and containing %q", err, path, c.want)
			}
			if errors.Is(err, ErrUnsupported) != c.unsupported {
				t.Errorf("errors.Is(err, ErrUnsupported) = %v, want %v", !c.unsupported, c.unsupported)
			}
		})
	}
}

// TestLoadFileErrors: a missing file, a file that is not JSON.
func TestLoadFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "nope.json")); err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "nope.json") {
		t.Errorf("missing file: %v", err)
	}
	b, _ := toy{}.file()
	path := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(path, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "not valid JSON at byte") || !strings.Contains(err.Error(), path) {
		t.Errorf("truncated file: %v", err)
	}
	if err := os.WriteFile(path, []byte(`[1, 2]`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "not a tokenizer.json") {
		t.Errorf("JSON of another shape: %v", err)
	}
}

// TestConcurrentEncode: goroutines sharing a tokenizer (and its cache,
// cleared while they run) get the ids one goroutine gets.
func TestConcurrentEncode(t *testing.T) {
	tok, _ := toy{merges: [][2]string{{" ", "t"}, {"h", "e"}, {" t", "he"}, {"a", "a"}, {"aa", "aa"}}}.load(t)
	docs, _ := corpusParts(t)
	docs = docs[:min(len(docs), 40)]
	want := make([][]int32, len(docs))
	for i, d := range docs {
		want[i] = tok.Encode(d, false)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range docs {
				k := (i + g*7) % len(docs)
				if g == 0 && i%5 == 0 {
					tok.cache.reset()
				}
				if got := tok.Encode(docs[k], false); !slices.Equal(got, want[k]) {
					t.Errorf("goroutine %d, document %d: ids differ", g, k)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestCacheBounded: however many distinct pieces pass, the cache holds at
// most its capacity, and no piece longer than cacheMaxPieceBytes.
func TestCacheBounded(t *testing.T) {
	tok, _ := toy{}.load(t)
	var b strings.Builder
	for i := range 3 * cacheShards * cacheShardEntries {
		b.WriteString(" w")
		b.WriteString(strings.Repeat("x", i%7))
		for n := i; n > 0; n /= 26 {
			b.WriteByte(byte('a' + n%26))
		}
	}
	b.WriteString(" " + strings.Repeat("y", cacheMaxPieceBytes+1))
	tok.Encode(b.String(), false)
	total := 0
	for i := range tok.cache.shards {
		sh := &tok.cache.shards[i]
		if len(sh.m) > cacheShardEntries {
			t.Errorf("shard %d holds %d pieces, more than %d", i, len(sh.m), cacheShardEntries)
		}
		for k := range sh.m {
			if len(k) > cacheMaxPieceBytes {
				t.Errorf("a piece of %d bytes is cached", len(k))
			}
		}
		total += len(sh.m)
	}
	if total == 0 {
		t.Error("nothing cached")
	}
}

// TestBrief: values in errors are compact, short and valid UTF-8.
func TestBrief(t *testing.T) {
	for in, want := range map[string]string{
		"null":                               "null",
		"":                                   "null",
		` {"a":  1,` + "\n" + `"b": 2} `:     `{"a": 1, "b": 2}`,
		`"` + strings.Repeat("é", 100) + `"`: `"` + strings.Repeat("é", 38) + "...",
		`[` + strings.Repeat(`"x", `, 1000) + `"y"]`: `[` + strings.Repeat(`"x", `, 15) + `"...`,
	} {
		got := brief(json.RawMessage(in))
		if got != want {
			t.Errorf("brief(%.20q...) = %q, want %q", in, got, want)
		}
	}
}
