// Command generate continues a prompt with a model, streaming the text.
//
// The model is a Strata run or checkpoint (its last checkpoint) or a
// Hugging Face directory; -chat renders the prompt as a user's turn with the
// model's chat template.
//
//	go run ./examples/generate -model lora-run/run -prompt "pack my " -n 40
//	go run ./examples/generate -model ~/models/Qwen3-0.6B -chat -prompt "What is ZeRO?"
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"

	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/model"
)

func main() {
	path := flag.String("model", "", "a Strata run, checkpoint or Hugging Face directory")
	prompt := flag.String("prompt", "", "the prompt")
	chat := flag.Bool("chat", false, "the prompt is a user's turn: render it with the model's chat template")
	n := flag.Int("n", 64, "the most tokens to generate")
	temp := flag.Float64("temperature", 0, "0: greedy; above 0: sampled, seeded by -seed")
	seed := flag.Uint64("seed", 1, "the sampler's seed")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // Ctrl-C stops between tokens
	defer stop()
	opts := infer.GenOptions{MaxNewTokens: *n, Temperature: *temp, Seed: *seed}
	res, err := generate(ctx, *path, *prompt, *chat, opts, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "\n[%d tokens after a prompt of %d; stopped at %s]\n", res.Generated, res.Prompt, res.Stop)
}

// generate writes the continuation of prompt by the model at path to w.
func generate(ctx context.Context, path, prompt string, chat bool, opts infer.GenOptions, w io.Writer) (infer.GenResult, error) {
	m, err := infer.Open(ctx, path, infer.Options{})
	if err != nil {
		return infer.GenResult{}, err
	}
	defer m.Close()
	ids := infer.PromptIDs(m.Tokenizer, prompt, true)
	if chat {
		tmpl, err := m.Source.ChatTemplate()
		if err != nil {
			return infer.GenResult{}, err
		}
		msgs, err := json.Marshal([]map[string]string{{"role": "user", "content": prompt}})
		if err != nil {
			return infer.GenResult{}, err
		}
		p, err := infer.RenderChat(ctx, m.Tokenizer, tmpl, msgs)
		if err != nil {
			return infer.GenResult{}, err
		}
		ids, opts.EndOfTurn = p.IDs, p.EndOfTurn
	}
	capacity, err := m.DecoderCapacity(len(ids), opts.MaxNewTokens)
	if err != nil {
		return infer.GenResult{}, err
	}
	if err := m.Load(ctx, model.DecoderOptions{Capacity: capacity}); err != nil {
		return infer.GenResult{}, err
	}
	return infer.Generate(ctx, m, ids, opts, func(t infer.Token) error {
		_, err := w.Write(t.Text)
		return err
	})
}
