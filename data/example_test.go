package data_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/data"
)

// Example tokenizes a JSONL file of prompt/completion examples into a
// token file (byte-level tokens: no model tokenizer given), the loss on
// the completions only, and packs it into rows of 16 tokens.
func Example() {
	dir, err := os.MkdirTemp("", "data-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "train.jsonl")
	lines := `{"prompt": "2+2=", "completion": "4"}
{"prompt": "capital of France: ", "completion": "Paris"}
{"text": "a plain text example"}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		log.Fatal(err)
	}
	src, err := data.Open(path, data.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	fmt.Printf("%s: %d examples, %d tokens\n", src.Stats.Format, src.Stats.Examples, src.File.Tokens())
	start, end, err := src.File.Span(0)
	if err != nil {
		log.Fatal(err)
	}
	ids := make([]int32, end-start)
	train := make([]bool, end-start)
	if err := src.File.Read(start, ids, train); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("first example %q, trained on %v\n", string(bytesOf(ids)), train)
	p, err := data.NewPacked(src.File, 16, 1, false)
	if err != nil {
		log.Fatal(err)
	}
	epoch1, err := p.EpochStart(1)
	if err != nil {
		log.Fatal(err)
	}
	b, err := p.Rows(0, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("an epoch is %d rows of 16; row 0's inputs %q, then padding\n", epoch1, string(bytesOf(b.IDs[:4])))
	// Output:
	// jsonl: 3 examples, 49 tokens
	// first example "2+2=4", trained on [false false false false true]
	// an epoch is 5 rows of 16; row 0's inputs "2+2=", then padding
}

func bytesOf(ids []int32) []byte {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return b
}
