package tokenizer_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/tokenizer"
)

// Example encodes and decodes with the byte-level tokenizer: one id per
// byte, so any file is training data.
func Example() {
	tok := tokenizer.Bytes()
	ids := tok.Encode("hi!", false)
	text, err := tok.Decode(ids)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tok.VocabSize(), ids, text)
	// Output: 256 [104 105 33] hi!
}

// ExampleLoad loads a tiny Hugging Face tokenizer.json (a BPE over
// characters with one merge, decoded by fusing the tokens) and encodes with it.
func ExampleLoad() {
	dir, err := os.MkdirTemp("", "tokenizer-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tokenizer.json")
	json := `{"decoder": {"type": "Fuse"},
		"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`
	if err := os.WriteFile(path, []byte(json), 0o644); err != nil {
		fmt.Println(err)
		return
	}

	tok, err := tokenizer.Load(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	ids := tok.Encode("abba", false)
	text, _ := tok.Decode(ids)
	fmt.Println(tok.VocabSize(), ids, text)
	// Output: 3 [2 1 0] abba
}
