package tokenizer

import (
	"fmt"
	"strings"
	"sync"
)

// Tokenizer turns text into token ids and back: a BPE read from a
// tokenizer.json (Load), byte-level or over characters with byte fallback,
// or one id per byte (Bytes). Its methods are safe for concurrent use.
type Tokenizer struct {
	byteOnly  bool // Bytes(): id = byte, nothing else set
	vocabSize int

	// pieces[id] is what token id decodes from: its raw bytes for a
	// byte-level vocabulary (the decoder is then their concatenation),
	// else its spelling in tokenizer.json, which decoder turns into text;
	// known[id] says whether any token has that id.
	pieces  []string
	known   []bool
	decoder decoder // nil: byte-level, the pieces concatenated

	vocab        map[string]int32 // what the model sees (raw bytes for byte-level) → id
	merges       *mergeTable      // pairKey(left, right) → rule
	alphabet     alphabet         // a piece's symbols before any merge
	single       [256]int32       // the id of a one-byte piece, -1 when not one id
	ignoreMerges bool             // a piece that is a whole token is that token
	cut          *wordCut         // over characters, where a piece is cut into words; nil: never

	added           *addedSet        // added tokens matched in the raw text
	addedNormalized *addedSet        // added tokens matched after the normalizer
	addedByContent  map[string]int32 // every added token, for TokenID
	normalizers     []normalizer     // the normalizer, in order

	steps []preStep // the pre-tokenizer, in order

	prefix, suffix []int32 // the post-processor's ids around the text
	bos, eos       int32   // -1 when not named

	cache *cache
	pool  sync.Pool // *scratch
}

// scratch is the working memory of one Encode call.
type scratch struct {
	out   []int32
	ids   []int32
	ranks []int32
	syms  []symbol
	tree  []uint64
	emits []*stepEmit // by pre-tokenizer step
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
	raw, ok := t.alphabet.raw(s)
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
// UTF-8: with the byte-level alphabet every byte has a token, and over
// characters a byte that is not UTF-8 is a character without a token
// (byte fallback, else unk_token, else nothing).
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
	t.splitAdded(text, true, t.added, s, func(seg string, first bool) {
		t.splitAdded(t.normalize(seg), first, t.addedNormalized, s, func(seg string, first bool) { t.preTokenize(seg, first, 0, s) })
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
// s.out and hands each stretch between them to rest, with whether it
// begins the text Encode was given (atStart says text does).
func (t *Tokenizer) splitAdded(text string, atStart bool, set *addedSet, s *scratch, rest func(seg string, first bool)) {
	if set.empty() {
		if text != "" {
			rest(text, atStart)
		}
		return
	}
	for from := 0; from < len(text); {
		start, end, id := set.find(text, from)
		if start < 0 {
			rest(text[from:], atStart && from == 0)
			return
		}
		if start > from {
			rest(text[from:start], atStart && from == 0)
		}
		s.out = append(s.out, id)
		from = end
	}
}

// normalize runs the normalizers on text.
func (t *Tokenizer) normalize(text string) string {
	for _, n := range t.normalizers {
		text = n.normalize(text)
	}
	return text
}

// preTokenize runs the pre-tokenizers from step on piece (first: it
// begins the text), and the BPE model on what comes out of the last.
func (t *Tokenizer) preTokenize(piece string, first bool, step int, s *scratch) {
	if piece == "" {
		return
	}
	if step == len(t.steps) {
		s.out = t.model(piece, s, s.out)
		return
	}
	st := &t.steps[step]
	if st.metaspace != nil {
		piece = st.metaspace.rewrite(piece, first)
	}
	if st.prefixSpace && piece[0] != ' ' {
		piece = " " + piece
	}
	if st.split == nil {
		t.preTokenize(piece, first, step+1, s)
		return
	}
	e := s.stepEmit(t, step)
	e.first = first
	st.behavior.apply(st.split, piece, e.emit)
}

// stepEmit is what a split step hands each of its pieces to: the steps
// after it. One per step is made for each scratch and kept with it, with
// its method value, so that splitting a piece allocates nothing (a
// closure handed to a splitter escapes).
type stepEmit struct {
	t     *Tokenizer
	s     *scratch
	step  int
	first bool // the next piece begins the text
	emit  func(piece string, matched bool)
}

func (e *stepEmit) next(piece string, _ bool) {
	e.t.preTokenize(piece, e.first, e.step+1, e.s)
	e.first = false // only the first piece of one that begins the text begins it
}

// stepEmit returns the emitter of step, made on first use.
func (s *scratch) stepEmit(t *Tokenizer, step int) *stepEmit {
	if s.emits == nil {
		s.emits = make([]*stepEmit, len(t.steps))
	}
	e := s.emits[step]
	if e == nil {
		e = &stepEmit{t: t, s: s, step: step}
		e.emit = e.next
		s.emits[step] = e
	}
	return e
}

// model appends the ids of one pre-token, word by word where it can be
// cut (wordCut).
func (t *Tokenizer) model(piece string, s *scratch, out []int32) []int32 {
	if t.cut == nil {
		return t.word(piece, s, out)
	}
	for piece != "" {
		var word string
		word, piece = t.cut.next(piece)
		out = t.word(word, s, out)
	}
	return out
}

// word appends the ids of one piece the model merges whole.
func (t *Tokenizer) word(piece string, s *scratch, out []int32) []int32 {
	if len(piece) == 1 && t.single[piece[0]] >= 0 {
		return append(out, t.single[piece[0]])
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
// added token gives its content. Over characters, the file's decoder
// makes the text (Llama 2: "▁" becomes a space, <0xAB> tokens their
// bytes, one leading space is cut); byte tokens that are not UTF-8 give
// their bytes too, where Hugging Face writes U+FFFD. An id no token has
// is an error.
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	var b strings.Builder
	var tokens []string
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
		if t.decoder != nil {
			tokens = append(tokens, t.pieces[id])
			continue
		}
		b.WriteString(t.pieces[id])
	}
	if t.decoder != nil {
		return t.decoder.decode(tokens), nil
	}
	return b.String(), nil
}
