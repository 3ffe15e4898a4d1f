package data

import (
	"fmt"

	"github.com/strata-ai/strata/model"
)

// Tokenizer is what a dataset needs of a tokenizer: text to ids, the
// special tokens, the vocabulary's size. Bytes is the byte-level one;
// package tokenizer's *Tokenizer (byte-level BPE from tokenizer.json, and
// tokenizer.Bytes) has these methods.
type Tokenizer interface {
	// Encode returns the ids of text. Special-token strings in text (the
	// tokenizer's added tokens, such as "<|im_start|>" or
	// "<|begin_of_text|>") become their ids, as Hugging Face's tokenizers do
	// by default. With addSpecial the tokenizer also adds what its
	// post-processor adds to a sequence (Llama-3: BOS first; GPT-2 and
	// Qwen2: nothing); without it nothing is added.
	Encode(text string, addSpecial bool) []int32
	// TokenID is the id of a special (added) token given by its text,
	// false when the vocabulary has none by that text.
	TokenID(token string) (int32, bool)
	// VocabSize is the number of ids: every id Encode returns is below it.
	VocabSize() int
	// BOS and EOS are the beginning- and end-of-sequence tokens' ids,
	// false when the tokenizer has none.
	BOS() (int32, bool)
	EOS() (int32, bool)
}

// Bytes is the byte-level tokenizer of model.Encode: one id per byte, a
// vocabulary of 256, no special tokens (a special token's text is its
// bytes), no BOS or EOS.
type Bytes struct{}

// Encode returns one id per byte of text (model.Encode).
func (Bytes) Encode(text string, addSpecial bool) []int32 { return model.Encode([]byte(text)) }

// TokenID is always false: bytes have no special tokens.
func (Bytes) TokenID(string) (int32, bool) { return 0, false }

// VocabSize is model.ByteVocab (256).
func (Bytes) VocabSize() int { return model.ByteVocab }

// BOS is none.
func (Bytes) BOS() (int32, bool) { return 0, false }

// EOS is none.
func (Bytes) EOS() (int32, bool) { return 0, false }

// isBytes says whether tok is the byte-level tokenizer, whose raw text is
// read as a model.FileCorpus without a token file.
func isBytes(tok Tokenizer) bool {
	switch tok.(type) {
	case Bytes, *Bytes:
		return true
	}
	return false
}

// encode is tok.Encode with its ids checked against the vocabulary, an
// error naming where the text came from.
func encode(tok Tokenizer, text string, addSpecial bool, where string) ([]int32, error) {
	ids := tok.Encode(text, addSpecial)
	v := tok.VocabSize()
	for i, id := range ids {
		if id < 0 || int(id) >= v {
			return nil, fmt.Errorf("%s: the tokenizer gave id %d at token %d, outside its vocabulary [0, %d)", where, id, i, v)
		}
	}
	return ids, nil
}
