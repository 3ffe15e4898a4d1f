package tokenizer

import "unicode/utf8"

// The byte-level alphabet of GPT-2 (bytes_to_unicode in its encoder.py,
// ByteLevel in Hugging Face tokenizers): every byte is written as one
// printable character, so a vocabulary of strings covers arbitrary bytes.
// The 188 printable bytes '!'..'~', '¡'..'¬' and '®'..'ÿ' stand for
// themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) are
// U+0100 onward in byte order (space is 'Ġ', U+0120; '\n' is 'Ċ', U+010A).
var (
	byteRune [256]rune         // byte → its character
	runeByte = map[rune]byte{} // character → byte (the decoder's table)
)

func init() {
	next := rune(256)
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = next
			next++
		}
		runeByte[byteRune[b]] = byte(b)
	}
}

// unmapByteLevel returns the bytes a vocabulary entry stands for, and
// whether every character of it is in the byte-level alphabet. An entry with
// a character outside the alphabet cannot come out of byte-level BPE; it
// decodes to its own UTF-8 bytes, as Hugging Face's ByteLevel decoder does.
func unmapByteLevel(tok string) (string, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeByte[r]
		if !ok {
			return tok, false
		}
		out = append(out, b)
	}
	return string(out), true
}

// mapByteLevel writes raw bytes in the byte-level alphabet (the spelling of
// tokenizer.json's vocabulary).
func mapByteLevel(raw string) string {
	out := make([]byte, 0, 2*len(raw))
	for i := 0; i < len(raw); i++ {
		out = utf8.AppendRune(out, byteRune[raw[i]])
	}
	return string(out)
}
