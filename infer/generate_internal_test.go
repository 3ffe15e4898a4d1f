package infer

import (
	"bytes"
	"testing"

	"github.com/strata-ai/strata/tokenizer"
)

// TestGenerateStopsAtEndOfTurn: the text of the chat template's end of
// turn ends generation, whether it comes as one token or byte by byte;
// what may begin it is held back until it does not.
func TestGenerateStopsAtEndOfTurn(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"It is white.<|im_end|>\nmore", "It is white."},
		{"a <|im no end|>", "a <|im no end|>"},
	} {
		var out bytes.Buffer
		g := &generation{tok: tokenizer.Bytes(), turn: "<|im_end|>"}
		ended := false
		for _, b := range []byte(c.text) {
			var text []byte
			var err error
			if text, ended, err = g.emit(int32(b)); err != nil || ended {
				break
			}
			out.Write(text)
		}
		out.Write(g.pending)
		if out.String() != c.want || ended != (c.want != c.text) {
			t.Errorf("%q: wrote %q, ended %v; want %q", c.text, out.String(), ended, c.want)
		}
	}
}
