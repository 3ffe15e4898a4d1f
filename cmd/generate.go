package cmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/strata-ai/strata/infer"
	"github.com/strata-ai/strata/internal/units"
	"github.com/strata-ai/strata/model"
	"github.com/urfave/cli/v2"
)

func generateCommand() *cli.Command {
	return &cli.Command{
		Name:  "generate",
		Usage: "continue a prompt with a model, greedy or sampled, with a key/value cache",
		UsageText: "strata generate --model PATH (--prompt TEXT [--chat] | --messages FILE) [--chat-template PATH] [--max-new-tokens N] [--temperature T] [--seed S] " +
			"[--backend cpu|cuda] [--hbm BYTES] [--dtype auto|fp32|bf16] [--no-special]",
		Description: "Continues TEXT with the model of --model (a Hugging Face model directory, or a Strata run directory\n" +
			"or checkpoint; its tokenizer as strata eval finds it) and prints the new text on stdout as it is\n" +
			"generated. The prompt runs through the model in one pass, which fills a key/value cache (each block's\n" +
			"keys and values of every token so far); then each new token runs alone, its attention reading the\n" +
			"cache. At --temperature 0 (the default) the next token is the most likely one (greedy; the lowest id\n" +
			"of a tie); above 0 it is drawn from softmax(logits / T) by a generator seeded with --seed, so a seed\n" +
			"gives the same text every run. Generation stops at the tokenizer's EOS token or an id of config.json's\n" +
			"eos_token_id, after --max-new-tokens, or at the model's max_seq_len.\n\n" +
			"The tokenizer's template tokens before a text (Llama-3's BOS) go before the prompt unless\n" +
			"--no-special. Weights, dtype and device as for strata eval: one device holds every parameter and the\n" +
			"cache; a model that does not fit is refused, saying what it needs (offloaded generation is not built).\n\n" +
			"--chat renders --prompt as one user turn, --messages FILE a conversation (a JSON list of {\"role\", \"content\"}\n" +
			"objects, or a JSONL line's {\"messages\": [...]}), with the chat template training takes (--chat-template,\n" +
			"else the one a Strata run recorded, else the model's, else ChatML) and its generation prompt, as\n" +
			"apply_chat_template(add_generation_prompt=True) does; the prompt is the rendered text's tokens (the template\n" +
			"puts any BOS itself), and generation also stops at the template's end of turn (ChatML's <|im_end|>).",
		Flags: append(inferFlags(),
			&cli.StringFlag{Name: "prompt", Usage: "the text to continue (with --chat: the user's message)"},
			&cli.BoolFlag{Name: "chat", Usage: "render --prompt as one user turn with the model's chat template and its generation prompt"},
			&cli.StringFlag{Name: "messages", Usage: "a JSON file of messages to render with the chat template (implies --chat)"},
			&cli.StringFlag{Name: "chat-template", Usage: "with --chat or --messages: a model directory, tokenizer_config.json or .jinja file (default: the run's, else the model's, else ChatML)"},
			&cli.IntFlag{Name: "max-new-tokens", Value: 64, Usage: "the most tokens to generate"},
			&cli.Float64Flag{Name: "temperature", Usage: "0: greedy; above 0: sample from softmax(logits / T)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "the sampler's seed (with --temperature above 0)"},
			&cli.BoolFlag{Name: "no-special", Usage: "put no template tokens (BOS) before the prompt"},
			&cli.StringFlag{Name: "experts", Value: infer.ExpertsDevice, Usage: "a mixture of experts' experts: device (with the other weights), cpu (host RAM) or nvme (a file under --nvme-path); off the device only the experts a token reached are read, through --expert-cache"},
			&cli.StringFlag{Name: "nvme-path", Usage: "with --experts nvme: a directory on a filesystem that does O_DIRECT (the experts' file is removed when generate ends)"},
			&cli.IntFlag{Name: "expert-cache", Value: 0, Usage: "with --experts cpu or nvme: the experts kept on the device between tokens"},
			&cli.StringFlag{Name: "expert-policy", Value: infer.PolicyTinyLFU, Usage: "the expert cache's policy: tinylfu (ristretto, the default: it hit more than lru on skewed routing) or lru"},
		),
		Action: func(c *cli.Context) error { return runGenerate(c, c.App.Writer, c.App.ErrWriter) },
	}
}

func runGenerate(c *cli.Context, stdout, stderr io.Writer) error {
	if err := checkAddressSpace("generate"); err != nil {
		return err
	}
	maxNew, temp := c.Int("max-new-tokens"), c.Float64("temperature")
	switch {
	case maxNew < 1:
		return usagef("generate: --max-new-tokens %d: need at least 1", maxNew)
	case !(temp >= 0) || math.IsInf(temp, 1):
		return usagef("generate: --temperature %v: want 0 (greedy) or a positive number", temp)
	}
	chat := c.Bool("chat") || c.IsSet("messages")
	switch {
	case c.IsSet("messages") && c.IsSet("prompt"):
		return usagef("generate: --prompt and --messages both give the prompt: give one")
	case !c.IsSet("messages") && !c.IsSet("prompt"):
		return usagef("generate: give the prompt: --prompt TEXT (with --chat: a user's message), or --messages FILE")
	case !chat && c.IsSet("chat-template"):
		return usagef("generate: --chat-template needs --chat or --messages")
	case chat && c.Bool("no-special"):
		return usagef("generate: --no-special is for a plain --prompt; with --chat the template puts what goes first")
	}
	m, err := openInference(c, "generate")
	if err != nil {
		return err
	}
	defer m.Close()
	opts := infer.GenOptions{MaxNewTokens: maxNew, Temperature: temp, Seed: c.Uint64("seed")}
	var prompt []int32
	if chat {
		var p infer.ChatPrompt
		if p, err = chatPrompt(c, m, stderr); err != nil {
			return err
		}
		prompt, opts.EndOfTurn = p.IDs, p.EndOfTurn
	} else {
		prompt = infer.PromptIDs(m.Tokenizer, c.String("prompt"), !c.Bool("no-special"))
	}
	capacity, err := m.DecoderCapacity(len(prompt), maxNew)
	if err != nil {
		return usagef("%v", err)
	}
	if err := loadInference(c, m, model.DecoderOptions{Capacity: capacity, MaxStep: len(prompt)}, stderr); err != nil {
		return err
	}
	r, err := infer.Generate(c.Context, m, prompt, opts, func(t infer.Token) error {
		if _, err := stdout.Write(t.Text); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := io.WriteString(stdout, "\n"); err != nil {
		return err
	}
	stop := map[infer.Stop]string{
		infer.StopEOS:       "stopped at EOS",
		infer.StopEndOfTurn: "stopped at the chat template's end of turn " + opts.EndOfTurn,
		infer.StopMaxTokens: "stopped after --max-new-tokens",
		infer.StopMaxSeq:    "stopped at the model's max_seq_len",
	}[r.Stop]
	fmt.Fprintf(stderr, "generated %d tokens after a prompt of %d (%s); the prompt in %.2fs, then %.1f tokens/s\n",
		r.Generated, len(prompt), stop, r.PromptTime.Seconds(), float64(r.Generated)/max(r.GenTime.Seconds(), 1e-9))
	if es := m.ExpertStats(); es.Acquires > 0 {
		fmt.Fprintf(stderr, "experts (%s): %d used, %d hits in a cache of %d (%s): hit rate %.3f; %s read, %s per token\n",
			c.String("experts"), es.Acquires, es.Hits, es.Slots, es.Policy, es.HitRate(), units.FormatBytes(es.Reads),
			units.FormatBytes(es.Reads/int64(max(1, r.Generated+1))))
	}
	return nil
}

// chatPrompt renders --messages, or --prompt as one user turn, with the
// chat template training takes (runChat) and its generation prompt
// (infer.RenderChat).
func chatPrompt(c *cli.Context, m *infer.Model, stderr io.Writer) (infer.ChatPrompt, error) {
	tmpl, err := runChat(c, m.TokenizerSource, m.Source.RecordedChat(), "generate")
	if err != nil {
		return infer.ChatPrompt{}, err
	}
	var raw []byte
	if p := c.String("messages"); p != "" {
		if raw, err = os.ReadFile(p); err != nil {
			return infer.ChatPrompt{}, fmt.Errorf("generate: --messages: %w", err)
		}
		// A UTF-8 byte order mark (Windows editors write one) is not part
		// of the JSON: skipped, as Python's utf-8-sig and most JSON readers do.
		raw = bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf"))
	} else {
		raw, _ = json.Marshal([]map[string]string{{"role": "user", "content": c.String("prompt")}})
	}
	p, err := infer.RenderChat(c.Context, m.Tokenizer, tmpl, raw)
	if err != nil {
		return infer.ChatPrompt{}, fmt.Errorf("generate: --messages %s: %w", c.String("messages"), err)
	}
	fmt.Fprintf(stderr, "chat template: %s; the conversation rendered as %d tokens; the turn ends at %q\n", tmpl.Source(), len(p.IDs), p.EndOfTurn)
	if len(p.SplitMarkers) > 0 {
		fmt.Fprintf(stderr, "note: the chat template's ChatML markers %s are not tokens of the tokenizer (%s): each is encoded as the tokens of its text; give the model's template with --chat-template\n",
			strings.Join(p.SplitMarkers, ", "), m.TokenizerFrom)
	}
	return p, nil
}
