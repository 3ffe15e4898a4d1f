package data

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/strata-ai/strata/internal/jinja"
)

// ChatMLTemplate is the chat template used when the model brings none:
// ChatML, each message "<|im_start|>ROLE\nCONTENT<|im_end|>\n", and
// "<|im_start|>assistant\n" as the generation prompt (Qwen2's format
// without its default system message).
const ChatMLTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// ChatTemplate renders a conversation ({"messages": [...]}) as text, the
// way Hugging Face's apply_chat_template does: a Jinja template rendered
// with trim_blocks and lstrip_blocks, given messages, add_generation_prompt,
// tools and documents (none), the special tokens' texts (bos_token,
// eos_token, ...) and raise_exception. The interpreter (internal/jinja) covers
// what the templates of Llama 3-3.2, Gemma 2 and 3, Mistral, Phi-3 to
// Phi-4, Qwen2 to Qwen3, DeepSeek-V3 and their like use: if, for (loop
// variables, loop filters, else), set (namespaces, block set),
// break/continue, inline if, Python's operators and string and dict
// methods, and the filters and tests in filters and tests; strftime_now
// is given only by WithDate (the data would depend on the day). A
// template using anything else is refused when it is loaded, or, for a
// method of a string, when it is called.
//
// It is also the chat template a run rendered its {"messages"} lines with,
// as its checkpoints' manifests record it (JSON: source, template and
// special_tokens) and an exported directory carries it (hf.ExportDir).
type ChatTemplate struct {
	tmpl   *jinja.Template
	vars   map[string]any
	source string
	text   string // the template's Jinja source
	err    error  // a recorded template the interpreter cannot parse: Render's error
}

// chatRecord is a ChatTemplate as JSON.
type chatRecord struct {
	Source   string `json:"source"`   // where it came from: a file, or "default (ChatML)"
	Template string `json:"template"` // the Jinja text
	// SpecialTokens are the special tokens' texts it was given
	// (bos_token, eos_token, ...), written into a tokenizer_config.json
	// that the source did not have.
	SpecialTokens map[string]string `json:"special_tokens,omitempty"`
}

// MarshalJSON records c: its Source, Text and SpecialTokens.
func (c *ChatTemplate) MarshalJSON() ([]byte, error) {
	return json.Marshal(chatRecord{Source: c.source, Template: c.text, SpecialTokens: c.SpecialTokens()})
}

// UnmarshalJSON reads a template MarshalJSON recorded and parses it; a
// template the interpreter cannot parse is kept (its Source, Text and
// SpecialTokens), and rendering it returns the parse error.
func (c *ChatTemplate) UnmarshalJSON(b []byte) error {
	var r chatRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	p, err := ParseChatTemplate(r.Template, r.Source, r.SpecialTokens)
	if err != nil {
		p = &ChatTemplate{vars: map[string]any{}, source: r.Source, text: r.Template, err: err}
		for k, v := range r.SpecialTokens {
			p.vars[k] = v
		}
	}
	*c = *p
	return nil
}

// ChatMLMarkers are the texts ChatMLTemplate puts around each message: a
// tokenizer without a token for each encodes them as the tokens of their
// text (Stats.SplitMarkers).
var ChatMLMarkers = []string{"<|im_start|>", "<|im_end|>"}

// ParseChatTemplate parses a chat template; source names it in errors;
// special gives the texts of the special tokens it may print (bos_token,
// eos_token, ...).
func ParseChatTemplate(src, source string, special map[string]string) (*ChatTemplate, error) {
	tmpl, err := jinja.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("data: chat template %s: %w", source, err)
	}
	vars := map[string]any{}
	for k, v := range special {
		vars[k] = v
	}
	return &ChatTemplate{tmpl: tmpl, vars: vars, source: source, text: src}, nil
}

// DefaultChatTemplate is ChatML (ChatMLTemplate).
func DefaultChatTemplate() *ChatTemplate {
	c, err := ParseChatTemplate(ChatMLTemplate, "default (ChatML)", nil)
	if err != nil {
		panic(err)
	}
	return c
}

// WithDate is a copy of c whose renderings give the template
// transformers' strftime_now answering with the time at (the "Today Date"
// of Llama-3.2-style templates; naive, as datetime.now() is). Without it a
// template that asks whether strftime_now is defined sees it is not and
// falls back to its own date, so that training data does not depend on the
// day it was tokenized.
func (c *ChatTemplate) WithDate(at time.Time) *ChatTemplate {
	d := *c
	d.vars = maps.Clone(c.vars)
	d.vars["strftime_now"] = jinja.StrftimeNow(at)
	return &d
}

// Source says where the template came from.
func (c *ChatTemplate) Source() string { return c.source }

// Text is the template's Jinja source.
func (c *ChatTemplate) Text() string { return c.text }

// SpecialTokens are the special tokens' texts the template is given
// (bos_token, eos_token, ...: its tokenizer_config.json's).
func (c *ChatTemplate) SpecialTokens() map[string]string {
	out := map[string]string{}
	for k, v := range c.vars {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

// SplitMarkers are the markers of ChatML (ChatMLMarkers: the default
// template, or one with its text, as an export of a run trained on it
// carries) that tok has no token for, so that each is encoded as the
// tokens of its text; nil for another template.
func (c *ChatTemplate) SplitMarkers(tok Tokenizer) []string {
	if c.text != ChatMLTemplate {
		return nil
	}
	var out []string
	for _, m := range ChatMLMarkers {
		if _, ok := tok.TokenID(m); !ok {
			out = append(out, m)
		}
	}
	return out
}

// EndOfTurn is the text the template puts after an assistant's message
// (ChatML's "<|im_end|>", Llama-3's "<|eot_id|>"), trailing whitespace
// left out; "" when it puts nothing there. A model trained on the
// template ends its turn with it.
func (c *ChatTemplate) EndOfTurn() (string, error) {
	const probe = "\x00strata-end-of-turn-probe\x00"
	msgs := []any{newMessage("user", "hi"), newMessage("assistant", probe)}
	spans, err := c.spans(context.Background(), msgs) // two short messages: within any budget at once
	if err != nil {
		return "", err
	}
	for _, s := range spans {
		if i := strings.Index(s.text, probe); s.train && i >= 0 {
			return strings.TrimRightFunc(s.text[i+len(probe):], unicode.IsSpace), nil
		}
	}
	return "", fmt.Errorf("chat template %s: an assistant's message is not in its rendering", c.source)
}

func newMessage(role, content string) *object {
	d := newObject()
	d.set("role", role)
	d.set("content", content)
	return d
}

// RenderMessages renders a conversation given as JSON, a list of
// {"role", "content"} objects or an object with "messages" (a JSONL
// line's), with add_generation_prompt: the prompt of a chat model; ctx
// stops the rendering (Render).
func (c *ChatTemplate) RenderMessages(ctx context.Context, raw []byte, addGenerationPrompt bool) (string, error) {
	var obj struct {
		Messages json.RawMessage `json:"messages"`
	}
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '{' {
		if err := json.Unmarshal(t, &obj); err != nil || obj.Messages == nil {
			return "", fmt.Errorf("want a list of {\"role\", \"content\"} objects, or an object with \"messages\" (%v)", err)
		}
		raw = obj.Messages
	}
	msgs, err := parseMessages(raw)
	if err != nil {
		return "", err
	}
	return c.Render(ctx, msgs, addGenerationPrompt)
}

// LoadChatTemplate reads the chat template of a model: path is a model
// directory (its chat_template.jinja, else its tokenizer_config.json), a
// tokenizer_config.json, or a template file (.jinja). The special tokens'
// texts come from tokenizer_config.json. A model without a template gets
// DefaultChatTemplate (its Source says so); an empty template, a template
// file that is not UTF-8 text and a template the interpreter cannot render
// are errors naming the file (and what it does not support).
func LoadChatTemplate(path string) (*ChatTemplate, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data: chat template: %w", err)
	}
	cfgPath, tmplPath := path, ""
	switch {
	case fi.IsDir():
		cfgPath = filepath.Join(path, "tokenizer_config.json")
		if _, err := os.Stat(filepath.Join(path, "chat_template.jinja")); err == nil {
			tmplPath = filepath.Join(path, "chat_template.jinja")
		}
	case strings.HasSuffix(path, ".jinja"):
		cfgPath, tmplPath = filepath.Join(filepath.Dir(path), "tokenizer_config.json"), path
	}
	special, src, err := readTokenizerConfig(cfgPath)
	if fi.IsDir() && tmplPath == "" && errors.Is(err, fs.ErrNotExist) {
		return DefaultChatTemplate(), nil // a model directory without tokenizer_config.json: no template
	}
	if err != nil && !(tmplPath != "" && errors.Is(err, fs.ErrNotExist)) {
		return nil, err
	}
	name := cfgPath
	if tmplPath != "" {
		b, err := os.ReadFile(tmplPath)
		if err != nil {
			return nil, fmt.Errorf("data: chat template: %w", err)
		}
		if err := checkTemplateText(b); err != nil {
			return nil, fmt.Errorf("data: chat template %s: %w", tmplPath, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			return nil, fmt.Errorf("data: chat template %s is empty: write a template, or remove the file (without one, %s's chat_template or else ChatML is used)", tmplPath, filepath.Base(cfgPath))
		}
		src, name = string(b), tmplPath
	}
	if src == "" {
		c := DefaultChatTemplate()
		c.source = fmt.Sprintf("default (ChatML): %s has no chat_template", name)
		for k, v := range special {
			c.vars[k] = v
		}
		return c, nil
	}
	return ParseChatTemplate(src, name, special)
}

// checkTemplateText refuses a template file that is not text: invalid
// UTF-8 or a NUL byte (a binary file named .jinja would render as text
// without an assistant's turn, and the data would then have nothing to
// train on).
func checkTemplateText(b []byte) error {
	i := bytes.IndexByte(b, 0)
	if !utf8.Valid(b) {
		for j := 0; j < len(b); {
			r, n := utf8.DecodeRune(b[j:])
			if r == utf8.RuneError && n <= 1 {
				if i < 0 || j < i {
					return fmt.Errorf("not UTF-8 text: invalid UTF-8 at byte %d (%#02x)", j, b[j])
				}
				break
			}
			j += n
		}
	}
	if i >= 0 {
		return fmt.Errorf("not UTF-8 text: a NUL byte at byte %d (a binary file?)", i)
	}
	return nil
}

// readTokenizerConfig reads the special tokens' texts and the chat
// template (the "default" one of a list) of a tokenizer_config.json.
func readTokenizerConfig(path string) (map[string]string, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("data: chat template: %w", err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, "", fmt.Errorf("data: chat template: %s: %w", path, err)
	}
	special := map[string]string{}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} {
		raw, ok := cfg[k]
		if !ok {
			continue
		}
		var s string
		var obj struct {
			Content string `json:"content"`
		}
		switch {
		case json.Unmarshal(raw, &s) == nil:
			special[k] = s
		case json.Unmarshal(raw, &obj) == nil: // an AddedToken object
			special[k] = obj.Content
		}
	}
	raw, ok := cfg["chat_template"]
	if !ok || string(raw) == "null" {
		return special, "", nil
	}
	var src string
	if json.Unmarshal(raw, &src) == nil {
		if strings.TrimSpace(src) == "" {
			return nil, "", fmt.Errorf("data: chat template: %s: chat_template is empty: write a template, or remove the key (or write null) for the default, ChatML", path)
		}
		return special, src, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return nil, "", fmt.Errorf("data: chat template: %s: chat_template is neither a string nor a list of {name, template}", path)
	}
	for _, n := range named {
		if n.Name == "default" {
			if strings.TrimSpace(n.Template) == "" {
				return nil, "", fmt.Errorf("data: chat template: %s: chat_template's \"default\" template is empty: write one", path)
			}
			return special, n.Template, nil
		}
	}
	return nil, "", fmt.Errorf("data: chat template: %s: chat_template lists no template named \"default\"", path)
}

// Render renders messages (each a *object with role and content) with
// add_generation_prompt, within the budget of a rendering (data's doc:
// an error wrapping ErrTemplateBudget past it); ctx stops it (an error
// wrapping ctx's; nil: nothing does).
func (c *ChatTemplate) Render(ctx context.Context, messages []any, addGenerationPrompt bool) (string, error) {
	if c.err != nil {
		return "", c.err
	}
	vars := map[string]any{}
	for k, v := range c.vars {
		vars[k] = v
	}
	vars["messages"] = templateValue(messages)
	vars["add_generation_prompt"] = addGenerationPrompt
	vars["tools"] = nil
	vars["documents"] = nil
	out, err := c.tmpl.Render(ctx, vars, jinja.Limits{Bytes: maxRenderBytes})
	if err != nil {
		return "", fmt.Errorf("chat template %s: %w", c.source, err)
	}
	return out, nil
}

// span is a piece of a rendered conversation: the assistant's (trained)
// or not.
type span struct {
	text  string
	train bool
}

// spans renders a conversation and marks the assistant's messages, by
// prefixes where the template renders each prefix of a conversation as a
// prefix (prefixSpans), else by locating each assistant's content in the
// whole rendering (turnSpans); when neither tells the assistant's text,
// the error names the message and both reasons.
func (c *ChatTemplate) spans(ctx context.Context, messages []any) ([]span, error) {
	full, err := c.Render(ctx, messages, false)
	if err != nil {
		return nil, err
	}
	out, unstable, err := c.prefixSpans(ctx, messages, full)
	if err != nil || unstable < 0 {
		return out, err
	}
	out, err = c.turnSpans(ctx, messages, full)
	var te *turnError
	if errors.As(err, &te) {
		return nil, fmt.Errorf("message %d (the assistant's): chat template %s renders %s, and the conversation before message %d (with the generation prompt) and up to it as texts that do not extend each other, so its tokens cannot be told: use a template that renders each prefix of a conversation as a prefix, or an assistant's content as given with a marker ending its turn", te.index+1, c.source, te.reason, unstable+1)
	}
	return out, err
}

// prefixSpans marks the assistant's messages by rendering prefixes: for
// each one, the conversation before it rendered with the generation
// prompt must be where the conversation up to it begins, and that must be
// where the whole conversation (full) begins; what the message adds (its
// content and the template's end of turn) is the assistant's. A template
// that renders a prefix differently (one that drops earlier reasoning,
// say) gives the index of the first message it cannot tell, else -1.
func (c *ChatTemplate) prefixSpans(ctx context.Context, messages []any, full string) ([]span, int, error) {
	var out []span
	pos := 0
	for i, m := range messages {
		if !isAssistant(m) {
			continue
		}
		before, err := c.Render(ctx, messages[:i], true)
		if err != nil {
			return nil, -1, fmt.Errorf("message %d (the assistant's): rendering the messages before it: %w", i+1, err)
		}
		upto := full // the last message: the whole conversation
		if i+1 < len(messages) {
			if upto, err = c.Render(ctx, messages[:i+1], false); err != nil {
				return nil, -1, fmt.Errorf("message %d (the assistant's): rendering the messages up to it: %w", i+1, err)
			}
		}
		if !strings.HasPrefix(upto, before) || !strings.HasPrefix(full, upto) || len(before) < pos {
			return nil, i, nil
		}
		if len(before) > pos {
			out = append(out, span{text: full[pos:len(before)]})
		}
		if len(upto) > len(before) {
			out = append(out, span{text: full[len(before):len(upto)], train: true})
		}
		pos = len(upto)
	}
	if pos < len(full) {
		out = append(out, span{text: full[pos:]})
	}
	return out, -1, nil
}

func isAssistant(m any) bool {
	role, _ := m.(*object).get("role")
	return role == "assistant"
}

// turnError says why turnSpans cannot tell the assistant's text of
// message index (0-based).
type turnError struct {
	index  int
	reason string
}

func (e *turnError) Error() string { return fmt.Sprintf("message %d: %s", e.index+1, e.reason) }

// turnSpans marks the assistant's messages in the whole rendering (full)
// of a template that renders a conversation's prefixes differently
// (Qwen3's think block on the last turn only, Phi-3's eos_token at the
// end only, Mixtral 8x22B's system message in the last user turn). The
// conversation is rendered again with each assistant's content replaced
// by a sentinel; the text between the sentinels must be the text between
// the contents in full, so each content's place in full is known. An
// assistant's characters are its content there and then its end of turn:
// the text that follows the content both in full and in the rendering of
// the conversation that ends with the message (endOfTurn). What the
// template writes before the content (the turn's header, a think block)
// is not the assistant's.
func (c *ChatTemplate) turnSpans(ctx context.Context, messages []any, full string) ([]span, error) {
	var turns []int // the assistant's messages' indexes
	for i, m := range messages {
		if isAssistant(m) {
			turns = append(turns, i)
		}
	}
	// The sentinels share a prefix found nowhere in full.
	nonce := 0
	for strings.Contains(full, sentinelPrefix(nonce)) {
		nonce++
	}
	sentinel := func(k int) string { return fmt.Sprintf("%s%d\x00", sentinelPrefix(nonce), k) }
	marked := make([]any, len(messages))
	copy(marked, messages)
	for k, i := range turns {
		d := newObject()
		for _, key := range messages[i].(*object).keys {
			v, _ := messages[i].(*object).get(key)
			d.set(key, v)
		}
		d.set("content", sentinel(k))
		marked[i] = d
	}
	text, err := c.Render(ctx, marked, false)
	if err != nil {
		return nil, fmt.Errorf("rendering the conversation with the assistant's contents marked: %w", err)
	}
	// between[k] is the text before turn k's content (after turn k-1's);
	// between[len(turns)] the text after the last.
	between := make([]string, len(turns)+1)
	for k, i := range turns {
		s := sentinel(k)
		j := strings.Index(text, s)
		if j < 0 || strings.Contains(text[:j], sentinelPrefix(nonce)) {
			return nil, &turnError{i, "its content not as given (it drops it or puts it out of order)"}
		}
		if strings.Contains(text[j+len(s):], s) {
			return nil, &turnError{i, "its content more than once"}
		}
		between[k], text = text[:j], text[j+len(s):]
	}
	between[len(turns)] = text
	starts := make([]int, len(turns))
	pos := 0
	for k, i := range turns {
		content, _ := messages[i].(*object).get("content")
		if !strings.HasPrefix(full[pos:], between[k]) || !strings.HasPrefix(full[pos+len(between[k]):], content.(string)) {
			return nil, &turnError{i, "its turn differently once its content is replaced (the template reads the content: a <think> block in it, say; give reasoning as \"reasoning_content\")"}
		}
		starts[k] = pos + len(between[k])
		pos = starts[k] + len(content.(string))
	}
	if full[pos:] != between[len(turns)] {
		return nil, &turnError{turns[len(turns)-1], "its turn differently once its content is replaced"}
	}
	var out []span
	pos = 0
	for k, i := range turns {
		content, _ := messages[i].(*object).get("content")
		after := between[k+1] // what follows the content in full
		end := after          // the last message: its turn ends the rendering
		if i+1 < len(messages) {
			ending, err := c.Render(ctx, marked[:i+1], false)
			if err != nil {
				return nil, fmt.Errorf("message %d (the assistant's): rendering the messages up to it: %w", i+1, err)
			}
			j := strings.Index(ending, sentinel(k))
			if j < 0 {
				return nil, &turnError{i, "its content not as given when it ends the conversation"}
			}
			if end = endOfTurn(ending[j+len(sentinel(k)):], after); end == "" {
				return nil, &turnError{i, "no end of turn after its content (where its turn ends could not be learned)"}
			}
		}
		start := starts[k]
		if start > pos {
			out = append(out, span{text: full[pos:start]})
		}
		pos = start + len(content.(string)) + len(end)
		if pos > start {
			out = append(out, span{text: full[start:pos], train: true})
		}
	}
	if pos < len(full) {
		out = append(out, span{text: full[pos:]})
	}
	return out, nil
}

func sentinelPrefix(nonce int) string { return fmt.Sprintf("\x00strata-turn-%d-", nonce) }

// endOfTurn is the end of an assistant's turn: the text that follows its
// content both where the turn ends the conversation (ending) and where
// other text follows (after), as far as the two agree, less a marker
// begun and not closed there (a '<' or '[' after the last '>' or ']': of
// Phi-3's "<|end|>\n</s>" and "<|end|>\n<|user|>", "<|end|>\n").
func endOfTurn(ending, after string) string {
	if strings.HasPrefix(after, ending) {
		return ending
	}
	n := 0
	for n < len(ending) && n < len(after) && ending[n] == after[n] {
		n++
	}
	for n > 0 && n < len(after) && !utf8.RuneStart(after[n]) {
		n--
	}
	e := after[:n]
	if open := strings.LastIndexAny(e, "<["); open >= 0 && open > strings.LastIndexAny(e, ">]") {
		e = e[:open]
	}
	return e
}
