package data

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cancelling is the byte-level tokenizer (not read in place: a token file
// is written) that cancels a context at its n-th Encode and counts them.
type cancelling struct {
	Bytes
	n, calls int
	cancel   context.CancelFunc
}

func (c *cancelling) Encode(text string, addSpecial bool) []int32 {
	if c.calls++; c.calls == c.n {
		c.cancel()
	}
	return c.Bytes.Encode(text, addSpecial)
}

// TestOpenStops: a context cancelled while a file is tokenized stops Open
// within a line of JSONL or a chunk of raw text, with an error wrapping
// context.Canceled, and no token file is left in Options.Dir.
func TestOpenStops(t *testing.T) {
	jsonl := strings.Repeat(`{"text": "the quick brown fox"}`+"\n", 10000)
	text := strings.Repeat("the quick brown fox\njumps over the lazy dog\n", 200000) // 8.8 MB: 9 chunks
	for _, tc := range []struct {
		name, file, content string
		after, most         int
	}{
		{"jsonl", "d.jsonl", jsonl, 100, 101},
		{"text", "d.txt", text, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.file, tc.content)
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tok := &cancelling{n: tc.after, cancel: cancel}
			s, err := Open(path, Options{Tokenizer: tok, Dir: dir, Context: ctx})
			if err == nil {
				s.Close()
				t.Fatalf("Open went on to the end after the context was cancelled (%d encodes)", tok.calls)
			}
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "tokenizing stopped at") {
				t.Errorf("Open: %v, want the stop (context.Canceled)", err)
			}
			if tok.calls > tc.most {
				t.Errorf("%d encodes after the cancel at the %d-th, want at most %d", tok.calls-tc.after, tc.after, tc.most-tc.after)
			}
			if ents, _ := os.ReadDir(dir); len(ents) > 0 {
				t.Errorf("left in the token directory: %v", ents)
			}
			if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) > 0 {
				t.Errorf("left: %v", m)
			}
		})
	}
}
