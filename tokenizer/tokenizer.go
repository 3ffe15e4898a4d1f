package tokenizer

import (
	"fmt"
	"strings"
	"sync"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer turns text into token ids and back: a byte-level BPE read from
// a tokenizer.json (Load), or one id per byte (Bytes). Its methods are safe
// for concurrent use.
type Tokenizer struct {
	byteOnly  bool // Bytes(): id = byte, nothing else set
	vocabSize int

	// pieces[id] is the raw bytes token id decodes to; known[id] says
	// whether any token has that id.
	pieces []string
	known  []bool

	vocab        map[string]int32 // raw bytes → id, the BPE model's tokens
	merges       map[uint64]merge // pairKey(left, right) → rule
	byteID       [256]int32       // the token of each single byte
	ignoreMerges bool             // a piece that is a whole token is that token

	added           *addedSet        // added tokens matched in the raw text
	addedNormalized *addedSet        // added tokens matched after the normalizer
	addedByContent  map[string]int32 // every added token, for TokenID
	nfc             bool             // the normalizer is NFC

	steps []preStep // the pre-tokenizer, in order; the last is ByteLevel

	prefix, suffix []int32 // the post-processor's ids around the text
	bos, eos       int32   // -1 when not named

	cache *cache
	pool  sync.Pool // *scratch
}

// preStep is one pre-tokenizer of the sequence: optionally a space put
// before each piece that lacks one (ByteLevel's add_prefix_space), then a
// split of each piece (nil: the piece goes on whole).
type preStep struct {
	prefixSpace bool
	split       splitter
	byteLevel   bool // this is the ByteLevel pre-tokenizer
}

// scratch is the working memory of one Encode call.
type scratch struct {
	out   []int32
	ids   []int32
	ranks []int32
	syms  []symbol
	heap  candidates
}

// Bytes returns the byte-level tokenizer: a vocabulary of 256 ids, token i
// is byte i, no special tokens. Any byte string encodes and decodes back.
func Bytes() *Tokenizer {
	return &Tokenizer{byteOnly: true, vocabSize: 256, bos: -1, eos: -1}
}

// VocabSize is one more than the largest token id: the model vocabulary
// and the added tokens.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// BOS returns the id the post-processor's template puts before the text
// (else tokenizer_config.json's bos_token), if there is one.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos >= 0 }

// EOS returns the id the post-processor's template puts after the text
// (else tokenizer_config.json's eos_token), if there is one.
func (t *Tokenizer) EOS() (int32, bool) { return t.eos, t.eos >= 0 }

// TokenID returns the id of an added (special or not) token by its
// content, or of a vocabulary entry as tokenizer.json spells it ("Ġthe").
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	if t.byteOnly {
		return 0, false
	}
	if id, ok := t.addedByContent[s]; ok {
		return id, true
	}
	raw, ok := unmapByteLevel(s)
	if !ok {
		return 0, false
	}
	id, ok := t.vocab[raw]
	return id, ok
}

// Encode returns the token ids of text. Added tokens are found first
// (leftmost, longest), then each stretch between them is normalized,
// pre-tokenized and merged. addSpecial puts the post-processor's
// template ids around the result (BOS for Llama-3). Text need not be valid
// UTF-8: with the byte-level alphabet every byte has a token.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	if t.byteOnly {
		ids := make([]int32, len(text))
		for i := 0; i < len(text); i++ {
			ids[i] = int32(text[i])
		}
		return ids
	}
	s, _ := t.pool.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	s.out = make([]int32, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1)
	if addSpecial {
		s.out = append(s.out, t.prefix...)
	}
	t.splitAdded(text, t.added, s, func(seg string) {
		if t.nfc {
			seg = norm.NFC.String(seg)
		}
		t.splitAdded(seg, t.addedNormalized, s, func(seg string) { t.preTokenize(seg, 0, s) })
	})
	if addSpecial {
		s.out = append(s.out, t.suffix...)
	}
	out := s.out
	s.out = nil
	t.pool.Put(s)
	return out
}

// splitAdded appends the ids of the added tokens of set found in text to
// s.out and hands each stretch between them to rest.
func (t *Tokenizer) splitAdded(text string, set *addedSet, s *scratch, rest func(string)) {
	if set.empty() {
		if text != "" {
			rest(text)
		}
		return
	}
	for from := 0; from < len(text); {
		start, end, id := set.find(text, from)
		if start < 0 {
			rest(text[from:])
			return
		}
		if start > from {
			rest(text[from:start])
		}
		s.out = append(s.out, id)
		from = end
	}
}

// preTokenize runs the pre-tokenizers from step on piece, and the BPE
// model on what comes out of the last.
func (t *Tokenizer) preTokenize(piece string, step int, s *scratch) {
	if step == len(t.steps) {
		s.out = t.model(piece, s, s.out)
		return
	}
	st := t.steps[step]
	if st.prefixSpace && piece[0] != ' ' {
		piece = " " + piece
	}
	if st.split == nil {
		t.preTokenize(piece, step+1, s)
		return
	}
	st.split.split(piece, func(p string) { t.preTokenize(p, step+1, s) })
}

// model appends the ids of one pre-token.
func (t *Tokenizer) model(piece string, s *scratch, out []int32) []int32 {
	if len(piece) == 1 {
		return append(out, t.byteID[piece[0]])
	}
	if t.ignoreMerges {
		if id, ok := t.vocab[piece]; ok {
			return append(out, id)
		}
	}
	if ids, ok := t.cache.get(piece); ok {
		return append(out, ids...)
	}
	n := len(out)
	out = t.bpe(piece, s, out)
	if len(piece) <= cacheMaxPieceBytes {
		t.cache.put(strings.Clone(piece), append([]int32(nil), out[n:]...))
	}
	return out
}

// Decode returns the text of ids: the exact inverse of Encode for
// byte-level tokens (the bytes come back as they were, valid UTF-8 or
// not; a cut in the middle of a character gives the bytes so far); an
// added token gives its content. An id no token has is an error.
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	var b strings.Builder
	for i, id := range ids {
		if id < 0 || int(id) >= t.vocabSize {
			return "", fmt.Errorf("tokenizer: token %d: id %d is out of range [0, %d)", i, id, t.vocabSize)
		}
		if t.byteOnly {
			b.WriteByte(byte(id))
			continue
		}
		if !t.known[id] {
			return "", fmt.Errorf("tokenizer: token %d: id %d names no token (ids of this vocabulary have gaps)", i, id)
		}
		b.WriteString(t.pieces[id])
	}
	return b.String(), nil
}
