package infer

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/tokenizer"
)

// GenOptions are Generate's options.
type GenOptions struct {
	// MaxNewTokens is the most tokens to generate (at least 1).
	MaxNewTokens int
	// Temperature 0 takes the most likely token (greedy; the lowest id of
	// a tie); above 0 the token is drawn from softmax(logits / T) by a
	// generator seeded with Seed, so a seed gives the same text every run.
	Temperature float64
	Seed        uint64
	// Stop are ids that end the generation besides the model's EOS ids
	// (Model.EOS: the tokenizer's and config.json's).
	Stop []int32
	// EndOfTurn is text that ends the generation (a chat template's end
	// of turn, ChatML's "<|im_end|>"): it is never yielded, and what may
	// begin it is held back until it does not. As one token of the
	// tokenizer it stops as Stop does.
	EndOfTurn string
}

// Validate says what of o Generate would refuse.
func (o GenOptions) Validate() error {
	switch {
	case o.MaxNewTokens < 1:
		return fmt.Errorf("infer: MaxNewTokens %d: need at least 1", o.MaxNewTokens)
	case !(o.Temperature >= 0) || math.IsInf(o.Temperature, 1):
		return fmt.Errorf("infer: Temperature %v: want 0 (greedy) or a positive number", o.Temperature)
	}
	return nil
}

// Token is one generated token and its text: the bytes to write now.
// Text holds back the bytes of a UTF-8 character that the next tokens
// complete and what may be the start of GenOptions.EndOfTurn; the last
// Token (Final) carries what was held back.
type Token struct {
	ID    int32
	Text  []byte
	Final bool // the flush after the last token: ID is -1
}

// Stop is why a generation ended.
type Stop int

// The ends of a generation.
const (
	StopEOS       Stop = iota // an EOS id of the model (or GenOptions.Stop)
	StopEndOfTurn             // GenOptions.EndOfTurn
	StopMaxTokens             // GenOptions.MaxNewTokens generated
	StopMaxSeq                // the decoder's capacity (the model's max_seq_len) reached
)

// String names s.
func (s Stop) String() string {
	switch s {
	case StopEOS:
		return "EOS"
	case StopEndOfTurn:
		return "end of turn"
	case StopMaxTokens:
		return "max new tokens"
	case StopMaxSeq:
		return "max_seq_len"
	}
	return fmt.Sprintf("Stop(%d)", int(s))
}

// GenResult is what a generation did.
type GenResult struct {
	Prompt, Generated int
	Stop              Stop
	// StopID is the id it stopped at (StopEOS, and StopEndOfTurn as one
	// token); -1 otherwise.
	StopID int32
	// PromptTime is the prompt's pass, GenTime the tokens' after it.
	PromptTime, GenTime time.Duration
}

// DecoderCapacity is the decoder capacity Load needs to generate up to
// maxNew tokens after a prompt of promptLen: the prompt and the new tokens,
// at most the model's max_seq_len. A prompt with no room after it is
// refused.
func (m *Model) DecoderCapacity(promptLen, maxNew int) (int, error) {
	s := m.Shape()
	switch {
	case promptLen == 0:
		return 0, fmt.Errorf("%s: --prompt is empty and the tokenizer puts no token before it: give some text", m.name)
	case promptLen >= s.MaxSeq:
		return 0, fmt.Errorf("%s: the prompt is %d tokens; the model's max_seq_len is %d: nothing can follow it", m.name, promptLen, s.MaxSeq)
	}
	return promptLen + min(maxNew, s.MaxSeq-promptLen), nil // no overflow: promptLen < MaxSeq
}

// Generate continues prompt with m (loaded with a decoder of capacity
// DecoderCapacity(len(prompt), opts.MaxNewTokens)): the prompt runs through
// the model in one pass, which fills the key/value cache; then each new
// token runs alone. yield gets each token and its text as it comes, then a
// Final token with what was held back; an error from yield ends the
// generation with it. It stops at an EOS id (Model.EOS, opts.Stop), at
// opts.EndOfTurn, after opts.MaxNewTokens or at the decoder's capacity; a
// cancelled ctx stops it between tokens.
func Generate(ctx context.Context, m *Model, prompt []int32, opts GenOptions, yield func(Token) error) (GenResult, error) {
	r := GenResult{Prompt: len(prompt), StopID: -1}
	if err := opts.Validate(); err != nil {
		return r, err
	}
	if !m.Loaded() {
		return r, fmt.Errorf("%s: generate: the model is not loaded (Model.Load)", m.name)
	}
	if len(prompt) == 0 || len(prompt) >= m.decOpts.Capacity {
		return r, fmt.Errorf("%s: generate: a prompt of %d tokens; the decoder holds %d: load it with DecoderCapacity", m.name, len(prompt), m.decOpts.Capacity)
	}
	stop := append(m.EOS(), opts.Stop...)
	g := &generation{tok: m.Tokenizer, turn: opts.EndOfTurn}
	turnID, turnIsID := int32(-1), false
	if opts.EndOfTurn != "" {
		turnID, turnIsID = m.Tokenizer.TokenID(opts.EndOfTurn)
	}
	rng := rand.New(rand.NewPCG(opts.Seed, 0x5eed))
	d, s := m.dec, m.Device.DefaultStream()
	d.Reset()
	t0 := time.Now()
	logits, err := d.Step(s, m.params(), prompt)
	if err != nil {
		return r, fmt.Errorf("%s: %w", m.name, err)
	}
	r.PromptTime = time.Since(t0)
	t0 = time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		next := SampleToken(logits, opts.Temperature, rng)
		if slices.Contains(stop, next) {
			r.Stop, r.StopID = StopEOS, next
			break
		}
		if turnIsID && next == turnID {
			r.Stop, r.StopID = StopEndOfTurn, next
			break
		}
		r.Generated++
		text, ended, err := g.emit(next)
		if err != nil {
			return r, fmt.Errorf("%s: %w", m.name, err)
		}
		if ended {
			r.Stop = StopEndOfTurn
			break
		}
		if err := yield(Token{ID: next, Text: text}); err != nil {
			return r, err
		}
		if r.Generated == opts.MaxNewTokens {
			r.Stop = StopMaxTokens
			break
		}
		if d.Len() == d.Options().Capacity {
			r.Stop = StopMaxSeq
			break
		}
		if logits, err = d.Step(s, m.params(), []int32{next}); err != nil {
			return r, fmt.Errorf("%s: %w", m.name, err)
		}
	}
	r.GenTime = time.Since(t0)
	return r, yield(Token{ID: -1, Text: g.pending, Final: true})
}

// generation holds the text of a generation not yielded yet.
type generation struct {
	tok     *tokenizer.Tokenizer
	turn    string // where the assistant's turn ends
	pending []byte // decoded bytes not written yet: an incomplete UTF-8 character, the start of turn
}

// emit returns the text of token id ready to write, holding back the
// bytes of a character that the next tokens complete and, with an end of
// turn, what may be its start. It says whether the text reached the end
// of turn (then nothing is returned; pending holds the text before it).
func (g *generation) emit(id int32) ([]byte, bool, error) {
	text, err := g.tok.Decode([]int32{id})
	if err != nil {
		return nil, false, err
	}
	g.pending = append(g.pending, text...)
	if t := g.turn; t != "" {
		if i := bytes.Index(g.pending, []byte(t)); i >= 0 {
			g.pending = g.pending[:i]
			return nil, true, nil
		}
	}
	cut := len(g.pending)
	for i := max(0, cut-utf8.UTFMax+1); i < len(g.pending); i++ {
		if utf8.RuneStart(g.pending[i]) && !utf8.FullRune(g.pending[i:]) {
			cut = i
			break
		}
	}
	for k := min(len(g.turn)-1, len(g.pending)); k > 0; k-- {
		if bytes.HasSuffix(g.pending, []byte(g.turn[:k])) {
			cut = min(cut, len(g.pending)-k)
			break
		}
	}
	out := slices.Clone(g.pending[:cut])
	g.pending = append(g.pending[:0], g.pending[cut:]...)
	return out, false, nil
}

// SampleToken picks the next token: at temperature 0 the first of the
// largest logits; above it a draw from softmax(logits / temp), computed in
// float64.
func SampleToken(logits []float32, temp float64, rng *rand.Rand) int32 {
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

// PromptIDs are a prompt's tokens: with special, what the tokenizer's
// template puts before a text (Llama-3's BOS), then the text's; what the
// template would put after it (an EOS) is left out.
func PromptIDs(tok *tokenizer.Tokenizer, text string, special bool) []int32 {
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

// ChatPrompt is a conversation rendered for generation: its tokens and
// where the assistant's turn ends.
type ChatPrompt struct {
	IDs []int32
	// EndOfTurn is the template's end of turn (ChatML's "<|im_end|>"):
	// GenOptions.EndOfTurn.
	EndOfTurn string
	// SplitMarkers are the template's ChatML markers that are not tokens
	// of the tokenizer (each encoded as the tokens of its text).
	SplitMarkers []string
}

// RenderChat renders messages (a JSON list of {"role", "content"}
// objects, or a JSONL line's {"messages": [...]}) with tmpl and its
// generation prompt, as apply_chat_template(add_generation_prompt=True)
// does, and returns the rendered text's tokens (the template puts any BOS
// itself) and the template's end of turn.
func RenderChat(ctx context.Context, tok *tokenizer.Tokenizer, tmpl *data.ChatTemplate, messages []byte) (ChatPrompt, error) {
	text, err := tmpl.RenderMessages(ctx, messages, true)
	if err != nil {
		return ChatPrompt{}, err
	}
	var p ChatPrompt
	if p.EndOfTurn, err = tmpl.EndOfTurn(); err != nil {
		return ChatPrompt{}, err
	}
	p.IDs = tok.Encode(text, false)
	p.SplitMarkers = tmpl.SplitMarkers(tok)
	return p, nil
}
