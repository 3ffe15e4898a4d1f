package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// ErrUnsupported matches (errors.Is) the error of a tokenizer.json that
// asks for something this package does not implement.
var ErrUnsupported = errors.New("not supported")

// maxTokenID bounds the ids a file may use (the decode table has one entry
// per id): real vocabularies are below 300,000.
const maxTokenID = 1 << 24

// fileJSON is the top level of tokenizer.json. truncation and padding are
// not read: they are batch policies, and Encode returns the whole text.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         json.RawMessage  `json:"model"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
}

type addedTokenJSON struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// Load reads a Hugging Face tokenizer.json: a BPE model over the
// byte-level alphabet (GPT-2, Llama-3, Qwen2, DeepSeek-V3, gpt-oss and
// their kin) or over characters with byte fallback (Llama 2, Mistral,
// Gemma, Phi-3). The package doc lists what it reads. Anything it
// does not implement is refused with an error that names the JSON path and
// the value (errors.Is ErrUnsupported). A tokenizer_config.json beside it,
// if there is one, names BOS and EOS where the post-processor does not.
func Load(path string) (*Tokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	if err := t.readConfig(filepath.Join(filepath.Dir(path), "tokenizer_config.json")); err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

// parse builds a Tokenizer from the bytes of a tokenizer.json.
func parse(b []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(b, &f); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return nil, fmt.Errorf("not valid JSON at byte %d: %v", syn.Offset, err)
		}
		return nil, fmt.Errorf("not a tokenizer.json: %v", err)
	}
	t := &Tokenizer{bos: -1, eos: -1, cache: newCache()}
	// The pre-tokenizer first: whether ByteLevel ends it says which
	// alphabet the model's vocabulary is spelled in.
	if err := t.parsePreTokenizer("pre_tokenizer", f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.parseModel(f.Model); err != nil {
		return nil, err
	}
	if err := t.parseNormalizer("normalizer", f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.parseAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	if err := t.parsePostProcessor("post_processor", f.PostProcessor); err != nil {
		return nil, err
	}
	if err := t.parseDecoder("decoder", f.Decoder); err != nil {
		return nil, err
	}
	for b := range t.single {
		t.single[b] = -1
		if ids := t.alphabet.symbols(string([]byte{byte(b)}), nil); len(ids) == 1 {
			t.single[b] = ids[0]
		}
	}
	if len(t.prefix) == 1 {
		t.bos = t.prefix[0]
	}
	if len(t.suffix) == 1 {
		t.eos = t.suffix[0]
	}
	return t, nil
}

// object is one component of tokenizer.json, by its JSON path.
type object struct {
	path   string
	fields map[string]json.RawMessage
}

// parseObject reads the component at path; null is (nil, nil).
func parseObject(path string, raw json.RawMessage) (*object, error) {
	if isNull(raw) {
		return nil, nil
	}
	o := &object{path: path}
	if err := json.Unmarshal(raw, &o.fields); err != nil {
		return nil, fmt.Errorf("%s: %s: want an object", path, brief(raw))
	}
	return o, nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// brief is a JSON value as an error shows it: compact, at most 80 bytes.
func brief(raw json.RawMessage) string {
	if isNull(raw) {
		return "null"
	}
	s := strings.Join(strings.Fields(string(raw[:min(len(raw), 400)])), " ")
	if len(s) <= 80 && len(raw) <= 400 {
		return s
	}
	cut := min(len(s), 77)
	for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.ToValidUTF8(s[:cut], "") + "..."
}

// typ returns the component's "type".
func (o *object) typ() (string, error) {
	var s string
	if err := json.Unmarshal(o.fields["type"], &s); err != nil {
		return "", fmt.Errorf("%s.type: %s: want a string", o.path, brief(o.fields["type"]))
	}
	return s, nil
}

// get decodes field key into v; an absent or null field leaves v as it is.
func (o *object) get(key string, v any) error {
	raw, ok := o.fields[key]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s.%s: %s: %s", o.path, key, brief(raw), strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// each parses every element of the list field key (a Sequence's members)
// with parse, named path.key[i], stopping at the first error.
func (o *object) each(path, key string, parse func(path string, raw json.RawMessage) error) error {
	var list []json.RawMessage
	if err := o.get(key, &list); err != nil {
		return err
	}
	for i, raw := range list {
		if err := parse(fmt.Sprintf("%s.%s[%d]", path, key, i), raw); err != nil {
			return err
		}
	}
	return nil
}

// unsupported is the error of a value this package does not implement.
func (o *object) unsupported(key, want string) error {
	return fmt.Errorf("%s.%s: %s is %w (%s)", o.path, key, brief(o.fields[key]), ErrUnsupported, want)
}

// parseModel reads "model": vocab, merges and the BPE options.
func (t *Tokenizer) parseModel(raw json.RawMessage) error {
	o, err := parseObject("model", raw)
	if err != nil {
		return err
	}
	if o == nil {
		return fmt.Errorf("model: missing")
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	if typ != "BPE" {
		return o.unsupported("type", "BPE only")
	}
	var (
		dropout                       *float64
		prefix, suffix, unk           string
		byteFallback, fuseUnk, ignore bool
		vocab                         map[string]int64
		strMerges                     []string
		pairMerges                    [][]string
	)
	for _, f := range []struct {
		key string
		v   any
	}{{"dropout", &dropout}, {"continuing_subword_prefix", &prefix}, {"end_of_word_suffix", &suffix},
		{"byte_fallback", &byteFallback}, {"unk_token", &unk}, {"fuse_unk", &fuseUnk},
		{"ignore_merges", &ignore}, {"vocab", &vocab}} {
		if err := o.get(f.key, f.v); err != nil {
			return err
		}
	}
	switch {
	case dropout != nil && *dropout != 0:
		return o.unsupported("dropout", "BPE dropout is for training a tokenizer; want null")
	case prefix != "":
		return o.unsupported("continuing_subword_prefix", "want null or \"\"")
	case suffix != "":
		return o.unsupported("end_of_word_suffix", "want null or \"\"")
	case len(vocab) == 0:
		return fmt.Errorf("model.vocab: %s: want a non-empty object of token → id", brief(o.fields["vocab"]))
	}
	t.ignoreMerges = ignore
	// Merges are strings "a b" (older files) or pairs ["a", "b"]; the first
	// element says which.
	merges := bytes.TrimLeft(o.fields["merges"], " \t\r\n")
	merges = bytes.TrimLeft(bytes.TrimPrefix(merges, []byte("[")), " \t\r\n")
	into := any(&strMerges)
	if len(merges) > 0 && merges[0] == '[' {
		into = &pairMerges
	}
	if err := o.get("merges", into); err != nil {
		return fmt.Errorf("%w (want strings \"a b\" or pairs [\"a\", \"b\"])", err)
	}
	if err := t.buildVocab(vocab); err != nil {
		return err
	}
	if t.byteLevel() {
		// Every byte has a token, so byte_fallback and unk_token are
		// never used.
		a := &byteAlphabet{}
		for b := range a.id {
			id, ok := t.vocab[string([]byte{byte(b)})]
			if !ok {
				return fmt.Errorf("model.vocab: no token for byte 0x%02x (%q): not a byte-level vocabulary: %w", b, string(byteRune[b]), ErrUnsupported)
			}
			a.id[b] = id
		}
		t.alphabet = a
	} else {
		unkID := int32(-1)
		if unk != "" {
			id, ok := t.vocab[unk]
			if !ok {
				return fmt.Errorf("model.unk_token: %q is not in model.vocab", unk)
			}
			unkID = id
		}
		a := newCharAlphabet(t.vocab, byteFallback, unkID, fuseUnk)
		t.alphabet, t.cut = a, newWordCut(a, ignore)
	}
	return t.buildMerges(vocab, strMerges, pairMerges)
}

// byteLevel says whether the pre-tokenizer ends in ByteLevel: the model's
// vocabulary is then spelled in the byte-level alphabet.
func (t *Tokenizer) byteLevel() bool {
	n := len(t.steps)
	return n > 0 && t.steps[n-1].byteLevel
}

// buildVocab fills the id tables from tokenizer.json's vocab (tokens in
// the byte-level alphabet, or in characters).
func (t *Tokenizer) buildVocab(vocab map[string]int64) error {
	// The errors name the least offending token, whatever the map's order:
	// the same file gives the same message (FuzzParse).
	maxID := int64(-1)
	bad, badID := "", int64(0)
	for tok, id := range vocab {
		if (id < 0 || id >= maxTokenID) && (badID == 0 || tok < bad) {
			bad, badID = tok, id
		}
		maxID = max(maxID, id)
	}
	if badID != 0 {
		return fmt.Errorf("model.vocab[%q]: id %d out of range [0, %d)", bad, badID, maxTokenID)
	}
	t.grow(int(maxID) + 1)
	byteLevel := t.byteLevel()
	t.vocab = make(map[string]int32, len(vocab))
	byID := make([]string, maxID+1)
	dup := [2]string{}
	dupID := int64(-1)
	for tok, id := range vocab {
		if t.known[id] {
			a, b := min(byID[id], tok), max(byID[id], tok)
			if dupID < 0 || a < dup[0] || a == dup[0] && b < dup[1] {
				dup, dupID = [2]string{a, b}, id
			}
			byID[id] = a // so the least pair is found whatever the order
			continue
		}
		raw, ok := tok, true
		if byteLevel {
			raw, ok = unmapByteLevel(tok)
		}
		if ok {
			t.vocab[raw] = int32(id)
		}
		t.pieces[id], t.known[id], byID[id] = raw, true, tok
	}
	if dupID >= 0 {
		return fmt.Errorf("model.vocab: %q and %q both have id %d", dup[0], dup[1], dupID)
	}
	return nil
}

// grow makes the id tables hold ids below n.
func (t *Tokenizer) grow(n int) {
	for len(t.pieces) < n {
		t.pieces = append(t.pieces, "")
		t.known = append(t.known, false)
	}
	t.vocabSize = max(t.vocabSize, n)
}

// buildMerges fills the merge table; rank is the position in the list, and
// a pair listed twice keeps its later rank (as Hugging Face's map does).
func (t *Tokenizer) buildMerges(vocab map[string]int64, strMerges []string, pairMerges [][]string) error {
	n := max(len(strMerges), len(pairMerges))
	t.merges = newMergeTable(n)
	for i := 0; i < n; i++ {
		var a, b string
		if strMerges != nil {
			parts := strings.Split(strMerges[i], " ")
			if len(parts) != 2 {
				return fmt.Errorf("model.merges[%d]: %q: want two tokens separated by one space", i, strMerges[i])
			}
			a, b = parts[0], parts[1]
		} else {
			if len(pairMerges[i]) != 2 {
				return fmt.Errorf("model.merges[%d]: %q: want a pair of tokens", i, pairMerges[i])
			}
			a, b = pairMerges[i][0], pairMerges[i][1]
		}
		ids := [3]int64{}
		for k, tok := range [3]string{a, b, a + b} {
			id, ok := vocab[tok]
			if !ok {
				return fmt.Errorf("model.merges[%d]: %q %q: %q is not in model.vocab", i, a, b, tok)
			}
			ids[k] = id
		}
		t.merges.put(pairKey(int32(ids[0]), int32(ids[1])), merge{rank: int32(i), id: int32(ids[2])})
	}
	return nil
}

// parseAdded reads added_tokens. Tokens marked normalized are matched, as
// the normalizer writes them, after the normalizer (when there is one);
// the others in the raw text.
func (t *Tokenizer) parseAdded(tokens []addedTokenJSON) error {
	t.added, t.addedNormalized = newAddedSet(), newAddedSet()
	t.addedByContent = make(map[string]int32, len(tokens))
	for i, a := range tokens {
		path := fmt.Sprintf("added_tokens[%d]", i)
		switch {
		case a.ID == nil || *a.ID < 0 || *a.ID >= maxTokenID:
			return fmt.Errorf("%s.id: want an id in [0, %d)", path, maxTokenID)
		case a.Content == "":
			return fmt.Errorf("%s.content: empty", path)
		case a.SingleWord:
			return fmt.Errorf("%s.single_word: true is %w", path, ErrUnsupported)
		case a.LStrip:
			return fmt.Errorf("%s.lstrip: true is %w", path, ErrUnsupported)
		case a.RStrip:
			return fmt.Errorf("%s.rstrip: true is %w", path, ErrUnsupported)
		}
		id := int32(*a.ID)
		t.grow(int(id) + 1)
		t.pieces[id], t.known[id] = a.Content, true
		t.addedByContent[a.Content] = id
		if a.Normalized && t.normalizers != nil {
			if c := t.normalize(a.Content); c != "" {
				t.addedNormalized.add(c, id)
			}
		} else {
			t.added.add(a.Content, id)
		}
	}
	return nil
}
