package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// An alphabet is what a BPE model starts a piece from, before any merge:
// the byte-level alphabet of GPT-2 (one symbol per byte; ByteLevel the last
// pre-tokenizer) or the characters of SentencePiece-style vocabularies
// (Llama 2, Gemma: one symbol per character, a character without a token
// written as its UTF-8 bytes <0xAB> when byte_fallback is set). Load
// picks one from the pre-tokenizer.
type alphabet interface {
	// raw returns what the model sees of a vocabulary entry as
	// tokenizer.json spells it, and whether the entry can come out of the
	// model at all.
	raw(token string) (string, bool)
	// symbols appends the first symbols of piece to ids.
	symbols(piece string, ids []int32) []int32
}

// byteAlphabet is the byte-level alphabet: id[b] is the token of byte b.
type byteAlphabet struct{ id [256]int32 }

func (*byteAlphabet) raw(token string) (string, bool) { return unmapByteLevel(token) }

func (a *byteAlphabet) symbols(piece string, ids []int32) []int32 {
	for i := 0; i < len(piece); i++ {
		ids = append(ids, a.id[piece[i]])
	}
	return ids
}

// charAlphabet is the alphabet of characters, as Hugging Face's
// BPE::merge_word builds a word: a character with a token is that token;
// else, with byte_fallback, the tokens <0xAB> of its UTF-8 bytes when all
// of them exist; else unk_token (one for a run of such characters with
// fuse_unk); else nothing. A byte that is not UTF-8 is a character of its
// own that no token spells.
type charAlphabet struct {
	vocab    map[string]int32
	ascii    [utf8.RuneSelf]int32 // the token of each ASCII character, -1 none
	fallback [256]int32           // the token <0xAB> of each byte, -1 none (or no byte_fallback)
	unk      int32                // -1: none
	fuseUnk  bool
}

// newCharAlphabet builds the character alphabet of a vocabulary.
func newCharAlphabet(vocab map[string]int32, byteFallback bool, unk int32, fuseUnk bool) *charAlphabet {
	a := &charAlphabet{vocab: vocab, unk: unk, fuseUnk: fuseUnk}
	for c := range a.ascii {
		a.ascii[c] = -1
		if id, ok := vocab[string(rune(c))]; ok {
			a.ascii[c] = id
		}
	}
	for b := range a.fallback {
		a.fallback[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok && byteFallback {
			a.fallback[b] = id
		}
	}
	return a
}

func (*charAlphabet) raw(token string) (string, bool) { return token, true }

func (a *charAlphabet) symbols(piece string, ids []int32) []int32 {
	lastUnk := false
	for i := 0; i < len(piece); {
		id, w := int32(-1), 1
		if c := piece[i]; c < utf8.RuneSelf {
			id = a.ascii[c]
		} else {
			if _, w = utf8.DecodeRuneInString(piece[i:]); w > 1 {
				if v, ok := a.vocab[piece[i:i+w]]; ok {
					id = v
				}
			}
		}
		char := piece[i : i+w]
		i += w
		if id >= 0 {
			ids, lastUnk = append(ids, id), false
			continue
		}
		if a.hasFallback(char) {
			for k := 0; k < len(char); k++ {
				ids = append(ids, a.fallback[char[k]])
			}
			lastUnk = false
			continue
		}
		if a.unk >= 0 && !(a.fuseUnk && lastUnk) {
			ids, lastUnk = append(ids, a.unk), true
		}
	}
	return ids
}

// hasToken says whether the character char is a token of its own.
func (a *charAlphabet) hasToken(char string) bool {
	if len(char) == 1 && char[0] < utf8.RuneSelf {
		return a.ascii[char[0]] >= 0
	}
	if r, _ := utf8.DecodeRuneInString(char); r == utf8.RuneError && len(char) == 1 {
		return false // a byte that is not UTF-8
	}
	_, ok := a.vocab[char]
	return ok
}

// hasFallback says whether every byte of char has its <0xAB> token.
func (a *charAlphabet) hasFallback(char string) bool {
	for k := 0; k < len(char); k++ {
		if a.fallback[char[k]] < 0 {
			return false
		}
	}
	return true
}
