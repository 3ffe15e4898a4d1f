package infer_test

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/hf"
	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
)

// writeTinyModel writes a Hugging Face directory of the named shape "tiny"
// (GPT-2, a byte vocabulary of 256) with seeded random weights into a new
// directory under parent; fill, when set, changes the chunks before they
// are written.
func writeTinyModel(parent string, fill func(l *model.Layout, chunks [][]float32)) (string, error) {
	s, err := model.Lookup("tiny")
	if err != nil {
		return "", err
	}
	l, err := model.NewLayout(s)
	if err != nil {
		return "", err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	chunks := make([][]float32, len(l.Chunks))
	for c, ch := range l.Chunks {
		chunks[c] = make([]float32, ch.Len)
		for i := range chunks[c] {
			chunks[c][i] = float32(rng.NormFloat64() * 0.1)
		}
	}
	if fill != nil {
		fill(l, chunks)
	}
	dir := filepath.Join(parent, "tiny")
	_, err = hf.ExportDir(dir, l, hf.DirOptions{}, func(w *hf.ExportWriter) error {
		for c := range chunks {
			if err := w.F32(c, chunks[c]); err != nil {
				return err
			}
		}
		return nil
	})
	return dir, err
}

// Evaluate and generate with a tiny model: open it on the CPU backend,
// load it with a decoder of 32 tokens, score a text's tokens, then
// continue a prompt greedily.
func Example() {
	tmp, err := os.MkdirTemp("", "infer-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	dir, err := writeTinyModel(tmp, nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	m, err := infer.Open(ctx, dir, infer.Options{Backend: "cpu", HBMBytes: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	if err := m.Load(ctx, model.DecoderOptions{Capacity: 32}); err != nil {
		log.Fatal(err)
	}

	text := m.Tokenizer.Encode("the quick brown fox jumps over the lazy dog", false)
	r, err := infer.Evaluate(ctx, m, infer.EvalInput{Tokens: text}, infer.EvalOptions{Seq: 16, TokenLosses: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d tokens predicted in %d windows; %d per-token losses; perplexity above 1: %v\n", r.Tokens, r.Windows, len(r.TokenLosses), r.PPL > 1)

	prompt := infer.PromptIDs(m.Tokenizer, "the ", true)
	var ids []int32
	g, err := infer.Generate(ctx, m, prompt, infer.GenOptions{MaxNewTokens: 8}, func(t infer.Token) error {
		if !t.Final {
			ids = append(ids, t.ID)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("generated %d tokens after a prompt of %d; stopped at %s\n", len(ids), g.Prompt, g.Stop)
	// Output:
	// 42 tokens predicted in 3 windows; 42 per-token losses; perplexity above 1: true
	// generated 8 tokens after a prompt of 4; stopped at max new tokens
}
