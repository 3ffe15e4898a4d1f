package data

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-ai/strata/internal/jinja"
)

// renderCase is one rendering compared with Jinja2.
type renderCase struct {
	name     string
	template string
	vars     map[string]any // JSON values
	now      string         // strftime_now's time (ISO 8601, naive); "": none
}

// conversations are the messages the templates are rendered with: one
// user turn, system-user-assistant with padding whitespace, several turns,
// a tool call and its result, and text with Unicode and escapes.
var conversations = map[string]string{
	"user":   `[{"role": "user", "content": "Hi there"}]`,
	"system": `[{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": " What is 2+2? "}, {"role": "assistant", "content": "4."}]`,
	"turns":  `[{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]`,
	"tool": `[{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
	          {"role": "tool", "content": "{\"temp\": 20}"}, {"role": "assistant", "content": "It is 20 degrees."}]`,
	"unicode": `[{"role": "user", "content": "Ünïcödé — “quotes” \\ backslash\n new line\t tab {{ not a tag }} <|im_end|>"}, {"role": "assistant", "content": "ok\n\n"}]`,
}

// renderCases is every template against every conversation, with and
// without the generation prompt, and with tools for the templates that
// take them.
func renderCases(t *testing.T) []renderCase {
	t.Helper()
	var cases []renderCase
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates in testdata/templates: %v", err)
	}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Weather of a city",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}}}}}
	for _, f := range append(files, "chatml") {
		src := ChatMLTemplate
		if f != "chatml" {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src = string(b)
		}
		for conv, msgs := range conversations {
			var m any
			if err := json.Unmarshal([]byte(msgs), &m); err != nil {
				t.Fatalf("%s: %v", conv, err)
			}
			for _, agp := range []bool{false, true} {
				vars := map[string]any{"messages": m, "add_generation_prompt": agp, "bos_token": "<|begin_of_text|>", "eos_token": "</s>", "tools": nil, "documents": nil}
				name := filepath.Base(f) + "/" + conv
				if agp {
					name += "/gen"
				}
				cases = append(cases, renderCase{name: name, template: src, vars: vars})
				if strings.Contains(f, "llama31") || strings.Contains(f, "qwen25") {
					v2 := map[string]any{}
					for k, v := range vars {
						v2[k] = v
					}
					v2["tools"], v2["date_string"] = tools, "01 Jan 2030"
					cases = append(cases, renderCase{name: name + "/tools", template: src, vars: v2})
					if strings.Contains(f, "llama31") {
						v3 := map[string]any{}
						for k, v := range v2 {
							v3[k] = v
						}
						v3["builtin_tools"], v3["tools_in_user_message"] = []any{"code_interpreter", "get_weather"}, false
						cases = append(cases, renderCase{name: name + "/builtin", template: src, vars: v3})
					}
				}
			}
		}
	}
	return cases
}

// jinjaRender renders cases with Jinja2 (testdata/render.py, set up as
// Hugging Face's apply_chat_template): the output, or "" and the error.
func jinjaRender(t *testing.T, cases []renderCase) (outs, errs []string) {
	t.Helper()
	type pyCase struct {
		Template string         `json:"template"`
		Vars     map[string]any `json:"vars"`
		Now      string         `json:"now,omitempty"`
	}
	var in []pyCase
	for _, c := range cases {
		in = append(in, pyCase{c.template, c.vars, c.now})
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/python3", "testdata/render.py")
	cmd.Stdin = bytes.NewReader(b)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("testdata/render.py (Debian's python3-jinja2, which .ci/run installs): %v\n%s", err, stderr.String())
	}
	var res []struct {
		Out   *string `json:"out"`
		Error string  `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(cases) {
		t.Fatalf("render.py answered %d results for %d cases: %v", len(res), len(cases), err)
	}
	for _, r := range res {
		if r.Out != nil {
			outs, errs = append(outs, *r.Out), append(errs, "")
		} else {
			outs, errs = append(outs, ""), append(errs, r.Error)
		}
	}
	return outs, errs
}

// parseTemplate and render run the interpreter (internal/jinja) as
// ChatTemplate does: data's JSON values as the template's, within a chat
// template's budget.
func parseTemplate(src string) (*jinja.Template, error) { return jinja.Parse(src) }

func render(ctx context.Context, tmpl *jinja.Template, vars map[string]any) (string, error) {
	tv := make(map[string]any, len(vars))
	for k, v := range vars {
		tv[k] = templateValue(v)
	}
	return tmpl.Render(ctx, tv, jinja.Limits{Bytes: maxRenderBytes})
}

// goRender renders a case with Strata's interpreter, given strftime_now
// at the case's time where it has one (ChatTemplate.WithDate's).
func goRender(c renderCase) (string, error) {
	body, err := parseTemplate(c.template)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(c.vars)
	if err != nil {
		return "", err
	}
	v, err := decodeOrdered(b)
	if err != nil {
		return "", err
	}
	vars := map[string]any{}
	for _, k := range v.(*object).keys {
		vars[k] = v.(*object).m[k]
	}
	if c.now != "" {
		at, err := time.Parse("2006-01-02T15:04:05", c.now)
		if err != nil {
			return "", err
		}
		vars["strftime_now"] = jinja.StrftimeNow(at)
	}
	return render(context.Background(), body, vars)
}

// TestTemplatesMatchJinja: the real chat templates of Llama-3 and Qwen2,
// Llama-3.1- and Qwen2.5-style templates with tools, a Mistral-style one
// that raises on a system message, ChatML, and a template using every
// construct the interpreter has (testdata/templates/features.jinja), each
// rendered with five conversations with and without the generation
// prompt: the same text as Jinja2 set up as Hugging Face's, to the byte,
// and an error where Jinja2 raises one.
func TestTemplatesMatchJinja(t *testing.T) {
	cases := renderCases(t)
	want, wantErr := jinjaRender(t, cases)
	raised := 0
	for i, c := range cases {
		got, err := goRender(c)
		switch {
		case wantErr[i] != "":
			raised++
			if err == nil {
				t.Errorf("%s: Jinja2 raised %s; Strata rendered %q", c.name, wantErr[i], got)
			}
		case err != nil:
			t.Errorf("%s: %v; Jinja2 rendered %q", c.name, err, want[i])
		case got != want[i]:
			t.Errorf("%s: rendered\n%q\nJinja2 rendered\n%q", c.name, got, want[i])
		}
	}
	if raised == 0 || raised == len(cases) {
		t.Errorf("%d of %d cases raised: the error cases are not exercised", raised, len(cases))
	}
	t.Logf("%d renderings, %d of them errors in both", len(cases), raised)
}

// TestTemplateRefused: what the interpreter does not have is refused when
// the template is parsed, naming the line and the construct; a raised
// exception names its message.
func TestTemplateRefused(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"{% filter upper %}x{% endfilter %}", "line 1: {% filter %} is not supported"},
		{"{% macro m(a) %}\n{{ a }}{{ varargs }}{% endmacro %}", "line 2: a macro's varargs is not supported"},
		{"{% macro m(a, a) %}{% endmacro %}", "macro m has two parameters named a"},
		{"{% macro m(a) %}x", "{% macro %} without {% endmacro %}"},
		{"a\n{{ x | wordwrap }}", "line 2: filter \"wordwrap\" is not supported"},
		{"{% if x is sameas y %}{% endif %}", "test \"sameas\" is not supported"},
		{"{% for x in y %}", "{% for %} without {% endfor %}"},
		{"{% if x %}a{% else %}b", "{% if %} without {% endif %}"},
		{"{{ x ", "tag not closed"},
		{"{{ 'abc }}", "string not closed"},
		{"{% endfor %}", "unexpected {% endfor %}"},
	} {
		_, err := parseTemplate(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one saying %q", c.src, err, c.want)
		}
	}
	body, err := parseTemplate("{{ raise_exception('no system role') }}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := render(context.Background(), body, nil); !errors.Is(err, jinja.ErrRaised) || !strings.Contains(err.Error(), "no system role") {
		t.Errorf("raise_exception: %v", err)
	}
	if _, err := ParseChatTemplate("{% call x %}{% endcall %}", "tokenizer_config.json", nil); err == nil || !strings.Contains(err.Error(), "chat template tokenizer_config.json: line 1: {% call %} is not supported") {
		t.Errorf("ParseChatTemplate: %v", err)
	}
}

// TestChatTemplateEndOfTurn: what each template puts after an assistant's
// message (generate --chat stops there), the markers of the default ChatML
// a tokenizer lacks (the note train and eval print), and a conversation
// given as JSON rendered with the generation prompt.
func TestChatTemplateEndOfTurn(t *testing.T) {
	special := map[string]string{"bos_token": "<s>", "eos_token": "</s>"}
	for file, want := range map[string]string{"": "<|im_end|>", "llama3.jinja": "<|eot_id|>", "qwen2.jinja": "<|im_end|>", "mistral.jinja": "</s>"} {
		c := DefaultChatTemplate()
		if file != "" {
			b, err := os.ReadFile(filepath.Join("testdata/templates", file))
			if err != nil {
				t.Fatal(err)
			}
			if c, err = ParseChatTemplate(string(b), file, special); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := c.EndOfTurn(); err != nil || got != want {
			t.Errorf("%s: EndOfTurn %q, %v; want %q", c.Source(), got, err, want)
		}
		if got := c.SplitMarkers(Bytes{}); (file == "") != (len(got) == 2) {
			t.Errorf("%s: SplitMarkers(bytes) %q", c.Source(), got)
		}
	}
	if c, _ := ParseChatTemplate(ChatMLTemplate, "a copy", nil); len(c.SplitMarkers(Bytes{})) != 2 {
		t.Errorf("ChatML's text from a file: SplitMarkers %q", c.SplitMarkers(Bytes{}))
	}
	c := DefaultChatTemplate()
	for _, in := range []string{`[{"role": "user", "content": "hi"}]`, `{"messages": [{"role": "user", "content": "hi"}]}`} {
		got, err := c.RenderMessages(context.Background(), []byte(in), true)
		if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"; err != nil || got != want {
			t.Errorf("RenderMessages(%s): %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{`[]`, `{"msgs": []}`, `[{"role": "user"}]`, `"hi"`} {
		if _, err := c.RenderMessages(context.Background(), []byte(in), true); err == nil {
			t.Errorf("RenderMessages(%s): no error", in)
		}
	}
}
