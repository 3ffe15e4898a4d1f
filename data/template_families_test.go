package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/jinja"
)

// The real chat templates of the model families Strata fine-tunes, each
// rendered through the interpreter with the conversations and variables
// its family's users give apply_chat_template, against Jinja2 set up as
// Hugging Face's (testdata/render.py). Where each template comes from is
// in testdata/templates/README.md.

// familyConvs are the conversations the families are rendered with, as
// JSON (decoded in order, as a JSONL line is). Those past "system" are
// for the templates that take what they hold.
var familyConvs = map[string]string{
	"user":   `[{"role": "user", "content": "Hi there"}]`,
	"turns":  `[{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "  Name a colour.\n"}, {"role": "assistant", "content": "Blue."}]`,
	"open":   `[{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "Name a colour."}]`,
	"system": `[{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": " What is 2+2? "}, {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}]`,
	// a system message and nothing else, an empty system message
	"system-only":  `[{"role": "system", "content": "Be brief."}]`,
	"empty-system": `[{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]`,
	// roles out of turn: two users, an assistant first, a tool's result
	"two-users":       `[{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hello?"}]`,
	"assistant-first": `[{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Hi"}]`,
	"tool-role":       `[{"role": "user", "content": "Hi"}, {"role": "tool", "content": "42"}]`,
	// an OpenAI-style tool call and its result, as Llama 3.1 and Qwen3 take them
	"tool-call": `[{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Weather in Paris?"},
		{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
		{"role": "tool", "content": "{\"temp\": 20}"}, {"role": "assistant", "content": "It is 20 degrees."}]`,
	"tool-result-object": `[{"role": "user", "content": "Weather?"},
		{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
		{"role": "ipython", "content": {"temp": -3, "sky": ["snow", "wind"]}}, {"role": "tool", "content": ["a", 1]}]`,
	"two-tool-calls": `[{"role": "user", "content": "Weather in Paris and Rome?"},
		{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}, {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]}]`,
	"builtin-call": `[{"role": "user", "content": "Search the news"},
		{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "brave_search", "arguments": {"query": "news today", "count": "3"}}}]},
		{"role": "ipython", "content": "Nothing new."}, {"role": "assistant", "content": "Nothing new."}]`,
	// Qwen3: thinking, reasoning_content, several calls and results, a
	// result sent back as a user message
	"think": `[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4."}, {"role": "user", "content": "3+3?"},
		{"role": "assistant", "content": "6.", "reasoning_content": "\nAdd again.\n"}]`,
	"think-earlier": `[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>Add.</think>4."}, {"role": "user", "content": "3+3?"}]`,
	"qwen-tools": `[{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Weather in Paris and Rome?"},
		{"role": "assistant", "content": "Let me look.", "reasoning_content": "Two cities.", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}, {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}]},
		{"role": "tool", "content": "20"}, {"role": "tool", "content": "25"},
		{"role": "user", "content": "<tool_response>\n30\n</tool_response>"},
		{"role": "assistant", "content": "<think>Both warm.</think>Paris 20, Rome 25."}]`,
	"qwen-multistep": `[{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]},
		{"role": "user", "content": "<tool_response>\n20\n</tool_response>"}, {"role": "assistant", "content": "<think>\nWarm.\n</think>\n\n20 degrees."}]`,
	// DeepSeek-V3: two system messages, calls with content null and
	// arguments as text, two results
	"deepseek-tools": `[{"role": "system", "content": "You call tools."}, {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris and Rome?"},
		{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
		{"role": "tool", "content": "20"}, {"role": "tool", "content": "25"}, {"role": "assistant", "content": "Paris 20, Rome 25."}]`,
	"deepseek-tool-open": `[{"role": "user", "content": "Weather?"},
		{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}, {"role": "tool", "content": "20"}]`,
	// Gemma 3: content as a list of parts, a system message as one, and
	// content that is neither
	"parts": `[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
		{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]}, {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]`,
	"number-content": `[{"role": "user", "content": 5}]`,
	// Phi-4-mini: tools as a system message's text
	"phi-tools": `[{"role": "system", "content": "You call tools.", "tools": "[{\"name\": \"get_weather\"}]"}, {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Sunny."}]`,
}

// familyTools is the tools argument of apply_chat_template.
const familyTools = `[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
	"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]`

// familyCase is a conversation rendered with a family's templates, with
// and without the generation prompt.
type familyCase struct {
	conv   string
	vars   string // more variables, a JSON object ("" none)
	now    string // strftime_now's time (ISO 8601), "" for none
	raises string // the message the templates raise (raise_exception), "" when they render
	undef  bool   // the templates use an undefined value (Jinja2's UndefinedError)
	fails  string // the start of Jinja2's other error (a TypeError: the value is not what the template takes), "" none
}

// family is a model family's templates (files in testdata/templates),
// the special tokens its tokenizer_config.json gives, and its cases.
type family struct {
	name    string
	files   []string
	special string // a JSON object
	cases   []familyCase
}

// families are the families issue 39 names, each with the cases its
// templates take: every one with user, assistant and system turns; the
// tools, dates and thinking each template reads; and each message its
// templates raise.
var families = []family{
	{name: "llama-3.1", files: []string{"llama31.jinja"}, special: `{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}`, cases: append(llamaCases(),
		familyCase{conv: "builtin-call", vars: `{"builtin_tools": ["brave_search", "wolfram_alpha"]}`},
		familyCase{conv: "builtin-call", vars: `{"builtin_tools": ["code_interpreter"], "tools": ` + familyTools + `}`},
	)},
	{name: "llama-3.2", files: []string{"llama32.jinja"}, special: `{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}`, cases: append(llamaCases(),
		familyCase{conv: "user", now: "2030-02-03T04:05:06"},
		familyCase{conv: "tool-call", now: "2031-12-25T23:59:59", vars: `{"tools": ` + familyTools + `}`},
		familyCase{conv: "user", now: "2030-02-03T04:05:06", vars: `{"date_string": "01 Jan 2030"}`},
	)},
	{name: "gemma-2", files: []string{"gemma2.jinja"}, special: `{"bos_token": "<bos>", "eos_token": "<eos>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"},
		{conv: "system", raises: "System role not supported"},
		{conv: "two-users", raises: "Conversation roles must alternate user/assistant/user/assistant/..."},
		{conv: "assistant-first", raises: "Conversation roles must alternate user/assistant/user/assistant/..."},
	}},
	{name: "gemma-3", files: []string{"gemma3.jinja", "gemma3-1b.jinja"}, special: `{"bos_token": "<bos>", "eos_token": "<eos>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "parts"},
		{conv: "two-users", raises: "Conversation roles must alternate user/assistant/user/assistant/..."},
	}},
	// gemma3.jinja folds a system message given as text into the first
	// user turn; gemma3-1b.jinja (the 1B model's) takes only a list of
	// parts, and Jinja2 fails on the text's ['text'] as undefined
	{name: "gemma-3", files: []string{"gemma3.jinja"}, special: `{"bos_token": "<bos>", "eos_token": "<eos>"}`, cases: []familyCase{
		{conv: "system"}, {conv: "number-content", raises: "Invalid content type"},
	}},
	{name: "gemma-3-1b", files: []string{"gemma3-1b.jinja"}, special: `{"bos_token": "<bos>", "eos_token": "<eos>"}`, cases: []familyCase{
		{conv: "system", undef: true},
	}},
	{name: "mistral", files: []string{"mistral.jinja", "mistral-7b-instruct.jinja"}, special: `{"bos_token": "<s>", "eos_token": "</s>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"},
		{conv: "system", raises: "Conversation roles must alternate user/assistant/user/assistant/..."},
		{conv: "two-users", raises: "Conversation roles must alternate user/assistant/user/assistant/..."},
		{conv: "tool-role", raises: "Only user and assistant roles are supported!"},
	}},
	{name: "mixtral", files: []string{"mixtral-8x7b.jinja", "mixtral-8x22b.jinja"}, special: `{"bos_token": "<s>", "eos_token": "</s>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "system-only"}, {conv: "empty-system"},
		{conv: "two-users", raises: "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."},
		{conv: "tool-role", raises: "Only user and assistant roles are supported, with the exception of an initial optional system message!"},
	}},
	{name: "mistral-large", files: []string{"mistral-large.jinja", "mistral-small.jinja"}, special: `{"bos_token": "<s>", "eos_token": "</s>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "two-users"},
		{conv: "tool-role", raises: "Only user, system and assistant roles are supported!"},
	}},
	{name: "phi-3", files: []string{"phi3.jinja", "phi35.jinja"}, special: `{"bos_token": "<s>", "eos_token": "<|endoftext|>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "empty-system"}, {conv: "tool-role"},
	}},
	{name: "phi-4", files: []string{"phi4.jinja", "phi4-mini.jinja"}, special: `{"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "empty-system"}, {conv: "phi-tools"},
	}},
	{name: "qwen-3", files: []string{"qwen3.jinja"}, special: `{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"},
		{conv: "open", vars: `{"enable_thinking": false}`}, {conv: "open", vars: `{"enable_thinking": true}`},
		{conv: "think"}, {conv: "think-earlier"}, {conv: "think-earlier", vars: `{"enable_thinking": false}`},
		{conv: "tool-call"}, {conv: "tool-call", vars: `{"tools": ` + familyTools + `}`},
		{conv: "qwen-tools", vars: `{"tools": ` + familyTools + `}`}, {conv: "qwen-tools", vars: `{"tools": ` + familyTools + `, "enable_thinking": false}`},
		{conv: "user", vars: `{"tools": ` + familyTools + `}`}, {conv: "qwen-multistep", vars: `{"tools": ` + familyTools + `}`},
	}},
	{name: "qwen-3-coder", files: []string{"qwen3-coder.jinja"}, special: `{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "tool-call"},
		{conv: "tool-call", vars: `{"tools": ` + familyTools + `}`}, {conv: "user", vars: `{"tools": ` + familyTools + `}`},
		{conv: "think"}, {conv: "two-tool-calls"},
		// arguments given as text: the template takes an object (| items)
		{conv: "qwen-tools", vars: `{"tools": ` + familyTools + `}`, fails: "TypeError: Can only get item pairs from a mapping"},
	}},
	{name: "deepseek-v3", files: []string{"deepseek-v3.jinja"}, special: `{"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}`, cases: []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "deepseek-tools"}, {conv: "deepseek-tool-open"},
	}},
}

// llamaCases are the cases of Llama 3.1 to 3.3: the system message, the
// date (date_string, or the template's default), tools in the first user
// message or the system message, custom_tools, a tool call and its
// result (text, an object, a list), and the three messages they raise.
func llamaCases() []familyCase {
	tools := `"tools": ` + familyTools
	return []familyCase{
		{conv: "user"}, {conv: "turns"}, {conv: "open"}, {conv: "system"}, {conv: "system-only"},
		{conv: "user", vars: `{"date_string": "01 Jan 2030"}`},
		{conv: "tool-call", vars: `{` + tools + `}`},
		{conv: "tool-call", vars: `{` + tools + `, "tools_in_user_message": false, "date_string": "05 May 2031"}`},
		{conv: "tool-call", vars: `{"tools": null, "custom_tools": ` + familyTools + `}`},
		{conv: "tool-result-object"},
		{conv: "two-tool-calls", raises: "This model only supports single tool-calls at once!"},
		{conv: "system-only", vars: `{` + tools + `}`, raises: "Cannot put tools in the first user message when there's no first user message!"},
	}
}

// familyRender is a rendering of a family's case with one template.
type familyRender struct {
	renderCase
	fc familyCase
}

// familyRenders are the renderings of every family's cases, with and
// without the generation prompt.
func familyRenders(t *testing.T) []familyRender {
	t.Helper()
	var out []familyRender
	for _, f := range families {
		for _, file := range f.files {
			src, err := os.ReadFile(filepath.Join("testdata/templates", file))
			if err != nil {
				t.Fatal(err)
			}
			for _, fc := range f.cases {
				conv, ok := familyConvs[fc.conv]
				if !ok {
					t.Fatalf("%s: no conversation %q", f.name, fc.conv)
				}
				for _, agp := range []bool{false, true} {
					vars := map[string]any{}
					for _, obj := range []string{f.special, fc.vars} {
						if obj != "" {
							var m map[string]json.RawMessage
							if err := json.Unmarshal([]byte(obj), &m); err != nil {
								t.Fatalf("%s %s: %v", f.name, obj, err)
							}
							for k, v := range m {
								vars[k] = v
							}
						}
					}
					if _, ok := vars["tools"]; !ok {
						vars["tools"] = nil // as apply_chat_template gives it
					}
					vars["documents"], vars["messages"], vars["add_generation_prompt"] = nil, json.RawMessage(conv), agp
					name := fmt.Sprintf("%s/%s/%s", f.name, file, fc.conv)
					if fc.vars != "" {
						var m map[string]json.RawMessage
						_ = json.Unmarshal([]byte(fc.vars), &m) // read above
						name += " +" + strings.Join(slices.Sorted(maps.Keys(m)), ",")
					}
					if fc.now != "" {
						name += " now=" + fc.now
					}
					if agp {
						name += "/gen"
					}
					out = append(out, familyRender{renderCase{name: name, template: string(src), vars: vars, now: fc.now}, fc})
				}
			}
		}
	}
	return out
}

// TestTemplateFamiliesMatchJinja: the real templates of Llama 3.1 and
// 3.2, Gemma 2 and 3, Mistral's [INST] templates, Phi-3 to Phi-4, Qwen3
// and DeepSeek-V3, each rendered with its family's conversations and
// variables, with and without the generation prompt, render as Jinja2
// renders them, to the byte; where Jinja2 raises (raise_exception), the
// interpreter returns one error carrying the template's message, and
// every case that should raise does.
func TestTemplateFamiliesMatchJinja(t *testing.T) {
	renders := familyRenders(t)
	cases := make([]renderCase, len(renders))
	for i, r := range renders {
		cases[i] = r.renderCase
	}
	want, wantErr := jinjaRender(t, cases)
	raised := map[string]int{}
	for i, r := range renders {
		got, err := goRender(r.renderCase)
		msg, isRaise := strings.CutPrefix(wantErr[i], "TemplateError: ")
		switch {
		case r.fc.raises != "" && (!isRaise || msg != r.fc.raises):
			t.Errorf("%s: Jinja2 answered %q, %q; the case says the template raises %q", r.name, want[i], wantErr[i], r.fc.raises)
		case r.fc.undef != strings.HasPrefix(wantErr[i], "UndefinedError: "):
			t.Errorf("%s: Jinja2 answered %q, %q; the case says undefined: %v", r.name, want[i], wantErr[i], r.fc.undef)
		case wantErr[i] == "" && r.fc.raises != "":
			t.Errorf("%s: Jinja2 rendered %q; the case says the template raises %q", r.name, want[i], r.fc.raises)
		case r.fc.fails != "" && !strings.HasPrefix(wantErr[i], r.fc.fails):
			t.Errorf("%s: Jinja2 answered %q, %q; the case says it fails with %q", r.name, want[i], wantErr[i], r.fc.fails)
		case wantErr[i] != "" && r.fc.raises == "" && !r.fc.undef && r.fc.fails == "":
			t.Errorf("%s: Jinja2 raised %s; the case says it renders", r.name, wantErr[i])
		case r.fc.fails != "":
			if err == nil {
				t.Errorf("%s: rendered %q; Jinja2 raised %s", r.name, got, wantErr[i])
			}
		case r.fc.raises != "":
			raised[r.name[:strings.Index(r.name, "/")]]++
			if !errors.Is(err, jinja.ErrRaised) || strings.Count(err.Error(), r.fc.raises) != 1 || !strings.HasSuffix(err.Error(), ": "+r.fc.raises) {
				t.Errorf("%s: error %v; want the template's exception, %q", r.name, err, r.fc.raises)
			}
		case r.fc.undef:
			if !errors.Is(err, jinja.ErrUndefined) {
				t.Errorf("%s: error %v; want an undefined value's (Jinja2: %s)", r.name, err, wantErr[i])
			}
		case err != nil:
			t.Errorf("%s: %v; Jinja2 rendered %q", r.name, err, want[i])
		case got != want[i]:
			t.Errorf("%s: rendered\n%q\nJinja2 rendered\n%q", r.name, got, want[i])
		}
	}
	for _, f := range families {
		n := 0
		for _, fc := range f.cases {
			if fc.raises != "" {
				n++
			}
		}
		if n > 0 && raised[f.name] == 0 {
			t.Errorf("%s: no case raised", f.name)
		}
	}
	t.Logf("%d renderings of %d families, %d of them raising in both", len(renders), len(families), sumValues(raised))
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestTemplateFamilyMarkers: the end of an assistant's turn (where
// generate --chat stops) that ChatTemplate finds in each family's real
// template. (Phi-3's and Phi-3.5's put eos_token after the last turn, and
// EndOfTurn then ends with it: "<|end|>\n</s>".)
func TestTemplateFamilyMarkers(t *testing.T) {
	for file, want := range map[string]string{
		"llama31.jinja": "<|eot_id|>", "llama32.jinja": "<|eot_id|>", "gemma2.jinja": "<end_of_turn>", "gemma3.jinja": "<end_of_turn>",
		"mistral-7b-instruct.jinja": "</s>", "mixtral-8x7b.jinja": "</s>", "mistral-large.jinja": "</s>",
		"phi4.jinja": "<|im_end|>", "qwen3.jinja": "<|im_end|>",
		"deepseek-v3.jinja": "<｜end▁of▁sentence｜>",
	} {
		b, err := os.ReadFile(filepath.Join("testdata/templates", file))
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseChatTemplate(string(b), file, map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.EndOfTurn(); err != nil || got != want {
			t.Errorf("%s: EndOfTurn %q, %v; want %q", file, got, err, want)
		}
	}
}

// TestTemplateWithDate: strftime_now is given only by WithDate, so that
// Llama 3.2's template takes its own date without it and the given day
// with it; a directive the interpreter does not build is one error naming
// it (TestTemplateStrftimeMatchesJinja checks those it builds).
func TestTemplateWithDate(t *testing.T) {
	b, err := os.ReadFile("testdata/templates/llama32.jinja")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseChatTemplate(string(b), "llama32.jinja", map[string]string{"bos_token": "<|begin_of_text|>"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []any{newMessage("user", "hi")}
	for _, tc := range []struct {
		c    *ChatTemplate
		want string
	}{
		{c, "Today Date: 26 Jul 2024\n"},
		{c.WithDate(time.Date(2030, 2, 3, 4, 5, 6, 0, time.UTC)), "Today Date: 03 Feb 2030\n"},
	} {
		got, err := tc.c.Render(context.Background(), msgs, true)
		if err != nil || !strings.Contains(got, tc.want) {
			t.Errorf("rendered %q, %v; want it to hold %q", got, err, tc.want)
		}
	}
	if _, ok := c.SpecialTokens()["strftime_now"]; ok || len(c.WithDate(time.Now()).SpecialTokens()) != 1 {
		t.Errorf("SpecialTokens %v", c.WithDate(time.Now()).SpecialTokens())
	}
}

// TestTemplateStrftimeMatchesJinja: strftime_now, at several times, writes
// every directive the interpreter builds as Python's strftime (transformers'
// strftime_now) writes it.
func TestTemplateStrftimeMatchesJinja(t *testing.T) {
	const src = `{{ strftime_now("%a %A %b %B %d %-d %m %-m %y %-y %Y | %H %-H %I %-I %M %-M %S %-S %f %p | %j %-j %w [%z%Z] %%") }}`
	var cases []renderCase
	for _, now := range []string{"2024-07-06T15:04:05.123456", "2030-01-01T00:00:00", "1999-12-31T12:59:09.000001", "2028-02-29T23:00:01", "0987-09-03T01:10:10"} {
		cases = append(cases, renderCase{name: now, template: src, vars: map[string]any{}, now: now})
	}
	want, wantErr := jinjaRender(t, cases)
	for i, c := range cases {
		got, err := goRender(c)
		if err != nil || wantErr[i] != "" || got != want[i] {
			t.Errorf("%s: rendered %q, %v; Jinja2 %q, %s", c.name, got, err, want[i], wantErr[i])
		}
	}
}

// TestTemplateUnbuiltRefused: a method of Python's str that the interpreter
// does not build, which Jinja2 would call, is refused when the template
// calls it, with one error naming it (a filter or test it lacks is
// refused when the template is parsed: TestTemplateRefused).
func TestTemplateUnbuiltRefused(t *testing.T) {
	cases := []renderCase{
		{name: "zfill", template: "{{ messages[0].content.zfill(9) }}"},
		{name: "rsplit", template: "{% for m in messages %}{{ m.content.rsplit(' ', 1)[0] }}{% endfor %}"},
		{name: "splitlines", template: "{{ ('a' ~ '\\n' ~ 'b').splitlines() | length }}"},
	}
	for i := range cases {
		cases[i].vars = map[string]any{"messages": json.RawMessage(familyConvs["user"])}
	}
	want, wantErr := jinjaRender(t, cases)
	for i, c := range cases {
		if wantErr[i] != "" {
			t.Errorf("%s: Jinja2 raised %s; the test wants a method Python's str has", c.name, wantErr[i])
		}
		got, err := goRender(c)
		if err == nil || !strings.Contains(err.Error(), "method str."+c.name+" is not supported") {
			t.Errorf("%s: rendered %q, %v; want an error naming str.%s (Jinja2 renders %q)", c.name, got, err, c.name, want[i])
		}
	}
}

// TestTemplateMacrosMatchJinja: macros as Jinja2 renders them: parameters
// by position and by name, defaults evaluated at each call after the
// parameters before them, a parameter not given undefined, the variables
// of where the macro was defined as they are at the call (a later top-level
// set, a loop's item), sets that stay inside the call, namespaces that do
// not, recursion, a macro printed; and Jinja2's errors for a call with too
// many arguments or an unknown keyword, and recursion past the bound.
func TestTemplateMacrosMatchJinja(t *testing.T) {
	cases := []renderCase{
		{name: "params", template: `{% macro m(a, b='B', c=a ~ '!') %}[{{ a }} {{ b }} {{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m('x', c=3) }}{{ m(b=4, a=5) }}`},
		{name: "undefined", template: `{% macro m(a, b) %}{{ a }}{{ b is defined }}{{ b | default('d') }}{% endmacro %}{{ m() }}|{{ m(1) }}`},
		{name: "scope", template: `{% set x = 1 %}{% macro m() %}{% set x = x + 10 %}{{ x }}{% endmacro %}{{ m() }}{% set x = 5 %}{{ m() }}{{ x }}`},
		{name: "loop", template: "{% for y in ['a', 'b'] %}{% macro m(z) %}{{ y }}{{ z }}{% endmacro %}{{ m(loop.index) }}{% endfor %}"},
		{name: "namespace", template: `{% set ns = namespace(n=0) %}{% macro inc() %}{% set ns.n = ns.n + 1 %}{% endmacro %}{{ inc() }}{{ inc() }}{{ ns.n }}`},
		{name: "recursion", template: `{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(6) }}`},
		{name: "value", template: "{% macro m() %}\n  x  \n{% endmacro %}{{ m }}|{{ m() | trim }}|{{ m() is string }}|{{ (m() ~ '<') | length }}|{{ [m()] }}"},
		{name: "messages", template: `{% macro turn(m, prefix='') %}{{ prefix }}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endmacro %}{% for m in messages %}{{ turn(m, prefix=loop.index ~ ':') }}{% endfor %}`},
		{name: "too-many", template: `{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}`},
		{name: "keyword", template: `{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}`},
		{name: "unknown-keyword", template: `{% macro m(a) %}{% endmacro %}{{ m(y=2) }}`},
	}
	for i := range cases {
		cases[i].vars = map[string]any{"messages": json.RawMessage(familyConvs["turns"])}
	}
	want, wantErr := jinjaRender(t, cases)
	for i, c := range cases {
		got, err := goRender(c)
		switch {
		case wantErr[i] != "":
			if msg := strings.TrimPrefix(wantErr[i], "TypeError: "); err == nil || !strings.Contains(err.Error(), msg) {
				t.Errorf("%s: rendered %q, %v; Jinja2 raised %s", c.name, got, err, wantErr[i])
			}
		case err != nil || got != want[i]:
			t.Errorf("%s: rendered %q, %v; Jinja2 %q", c.name, got, err, want[i])
		}
	}
	body, err := parseTemplate(`{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := render(context.Background(), body, nil); err == nil || !strings.Contains(err.Error(), "macros called more than 100 deep") {
		t.Errorf("endless recursion: %v", err)
	}
}
