package cmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/strata-ai/strata/model"
	"github.com/strata-ai/strata/tokenizer"
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
			"gives the same text every run. Generation stops at the tokenizer's EOS token, after --max-new-tokens,\n" +
			"or at the model's max_seq_len.\n\n" +
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
	var prompt []int32
	var turn endOfTurn
	m, err := openInference(c, "generate", func(m *inferModel) (model.DecoderOptions, error) {
		s := m.im.shape
		if chat {
			var err error
			if prompt, turn, err = chatPrompt(c, m, stderr); err != nil {
				return model.DecoderOptions{}, err
			}
		} else {
			prompt = promptIDs(m.tok, c.String("prompt"), !c.Bool("no-special"))
		}
		switch {
		case len(prompt) == 0:
			return model.DecoderOptions{}, usagef("generate: --prompt is empty and the tokenizer puts no token before it: give some text")
		case len(prompt) >= s.MaxSeq:
			return model.DecoderOptions{}, usagef("generate: the prompt is %d tokens; the model's max_seq_len is %d: nothing can follow it", len(prompt), s.MaxSeq)
		}
		return model.DecoderOptions{Capacity: len(prompt) + min(maxNew, s.MaxSeq-len(prompt)), MaxStep: len(prompt)}, nil // no overflow: len(prompt) < MaxSeq
	}, stderr)
	if err != nil {
		return err
	}
	defer m.close()
	g := &generation{m: m, out: stdout, temp: temp, rng: rand.New(rand.NewPCG(c.Uint64("seed"), 0x5eed)), turn: turn}
	if err := g.run(prompt, maxNew); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "generated %d tokens after a prompt of %d (%s); the prompt in %.2fs, then %.1f tokens/s\n",
		g.generated, len(prompt), g.stop, g.promptTime.Seconds(), float64(g.generated)/max(g.genTime.Seconds(), 1e-9))
	return nil
}

// promptIDs are the prompt's tokens: with special, what the tokenizer's
// template puts before a text (Llama-3's BOS), then the text's; what the
// template would put after it (an EOS) is left out.
func promptIDs(tok *tokenizer.Tokenizer, text string, special bool) []int32 {
	plain := tok.Encode(text, false)
	if !special {
		return plain
	}
	full := tok.Encode(text, true)
	if len(plain) == 0 {
		// The template alone: its BOS, not what follows the text.
		if bos, ok := tok.BOS(); ok && len(full) > 0 && full[0] == bos {
			return full[:1]
		}
		return nil
	}
	for k := 0; k+len(plain) <= len(full); k++ {
		if slices.Equal(full[k:k+len(plain)], plain) {
			return full[:k+len(plain)]
		}
	}
	return plain
}

// endOfTurn is where a chat template ends the assistant's turn: its text
// (ChatML's "<|im_end|>"), and its id when the tokenizer has it as one
// token.
type endOfTurn struct {
	text  string
	id    int32
	hasID bool
}

// chatPrompt renders --messages, or --prompt as one user turn, with the
// chat template training takes (runChat) and its generation prompt, and
// returns the rendered text's tokens and the template's end of turn.
func chatPrompt(c *cli.Context, m *inferModel, stderr io.Writer) ([]int32, endOfTurn, error) {
	tmpl, err := runChat(c, m.source, m.recordedChat(), "generate")
	if err != nil {
		return nil, endOfTurn{}, err
	}
	var raw []byte
	if p := c.String("messages"); p != "" {
		if raw, err = os.ReadFile(p); err != nil {
			return nil, endOfTurn{}, fmt.Errorf("generate: --messages: %w", err)
		}
		// A UTF-8 byte order mark (Windows editors write one) is not part
		// of the JSON: skipped, as Python's utf-8-sig and most JSON readers do.
		raw = bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf"))
	} else {
		raw, _ = json.Marshal([]map[string]string{{"role": "user", "content": c.String("prompt")}})
	}
	text, err := tmpl.RenderMessages(c.Context, raw, true)
	if err != nil {
		return nil, endOfTurn{}, fmt.Errorf("generate: --messages %s: %w", c.String("messages"), err)
	}
	var turn endOfTurn
	if turn.text, err = tmpl.EndOfTurn(); err != nil {
		return nil, endOfTurn{}, fmt.Errorf("generate: %w", err)
	}
	turn.id, turn.hasID = m.tok.TokenID(turn.text)
	ids := m.tok.Encode(text, false)
	fmt.Fprintf(stderr, "chat template: %s; the conversation rendered as %d tokens; the turn ends at %q\n", tmpl.Source(), len(ids), turn.text)
	if ms := tmpl.SplitMarkers(m.tok); len(ms) > 0 {
		fmt.Fprintf(stderr, "note: the chat template's ChatML markers %s are not tokens of the tokenizer (%s): each is encoded as the tokens of its text; give the model's template with --chat-template\n",
			strings.Join(ms, ", "), m.tokFrom)
	}
	return ids, turn, nil
}

// generation is one run of generate: the decoder fed the prompt, then each
// chosen token, and the text written as it comes.
type generation struct {
	m                   *inferModel
	out                 io.Writer
	temp                float64
	rng                 *rand.Rand
	turn                endOfTurn // with --chat: where the assistant's turn ends
	pending             []byte    // decoded bytes not written yet: an incomplete UTF-8 character, the start of turn.text
	generated           int
	stop                string
	promptTime, genTime time.Duration
}

func (g *generation) run(prompt []int32, maxNew int) error {
	d, s := g.m.dec, g.m.dev.DefaultStream()
	eos, hasEOS := g.m.tok.EOS()
	t0 := time.Now()
	logits, err := d.Step(s, g.m.w, prompt)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	g.promptTime = time.Since(t0)
	t0 = time.Now()
	defer func() { g.genTime = time.Since(t0) }()
	for {
		next := sampleToken(logits, g.temp, g.rng)
		if hasEOS && next == eos {
			g.stop = "stopped at EOS"
			break
		}
		if g.turn.hasID && next == g.turn.id {
			g.stop = "stopped at the chat template's end of turn " + g.turn.text
			break
		}
		g.generated++
		if ended, err := g.emit(next); err != nil || ended {
			g.stop = "stopped at the chat template's end of turn " + g.turn.text
			if err != nil {
				return err
			}
			break
		}
		if g.generated == maxNew {
			g.stop = "stopped after --max-new-tokens"
			break
		}
		if d.Len() == d.Options().Capacity {
			g.stop = "stopped at the model's max_seq_len"
			break
		}
		if logits, err = d.Step(s, g.m.w, []int32{next}); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
	}
	if len(g.pending) > 0 {
		if _, err := g.out.Write(g.pending); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
	}
	_, err = io.WriteString(g.out, "\n")
	return err
}

// emit writes the text of token id, holding back the bytes of a
// character that the next tokens complete and, with a chat template, what
// may be the start of its end of turn. It says whether the text reached
// the end of turn (not written).
func (g *generation) emit(id int32) (bool, error) {
	text, err := g.m.tok.Decode([]int32{id})
	if err != nil {
		return false, fmt.Errorf("generate: %w", err)
	}
	g.pending = append(g.pending, text...)
	if t := g.turn.text; t != "" {
		if i := bytes.Index(g.pending, []byte(t)); i >= 0 {
			g.pending = g.pending[:i]
			return true, nil
		}
	}
	cut := len(g.pending)
	for i := max(0, cut-utf8.UTFMax+1); i < len(g.pending); i++ {
		if utf8.RuneStart(g.pending[i]) && !utf8.FullRune(g.pending[i:]) {
			cut = i
			break
		}
	}
	for k := min(len(g.turn.text)-1, len(g.pending)); k > 0; k-- {
		if bytes.HasSuffix(g.pending, []byte(g.turn.text[:k])) {
			cut = min(cut, len(g.pending)-k)
			break
		}
	}
	if _, err := g.out.Write(g.pending[:cut]); err != nil {
		return false, fmt.Errorf("generate: %w", err)
	}
	g.pending = append(g.pending[:0], g.pending[cut:]...)
	return false, nil
}

// sampleToken picks the next token: at temperature 0 the first of the
// largest logits; above it a draw from softmax(logits / temp), computed in
// float64.
func sampleToken(logits []float32, temp float64, rng *rand.Rand) int32 {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if temp == 0 {
		return int32(best)
	}
	mx := float64(logits[best])
	var total float64
	for _, v := range logits {
		total += math.Exp((float64(v) - mx) / temp)
	}
	u := rng.Float64() * total
	for i, v := range logits {
		if u -= math.Exp((float64(v) - mx) / temp); u < 0 {
			return int32(i)
		}
	}
	return int32(best) // rounding kept u just above 0 after the last subtraction
}
