package jinja

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fuzzSeeds are the templates of the tests: testdata/templates, ChatML,
// each line of features.jinja alone, and the refused ones of
// TestTemplateRefused.
func fuzzSeeds(f *testing.F) []string {
	f.Helper()
	files, err := filepath.Glob(templatesGlob)
	if err != nil || len(files) == 0 {
		f.Fatalf("no templates in testdata/templates: %v", err)
	}
	seeds := []string{chatML,
		"{% macro m() %}x{% endmacro %}", "a\n{{ x | wordwrap }}", "{% if x is sameas y %}{% endif %}",
		"{% for x in y %}", "{% if x %}a{% else %}b", "{{ x ", "{{ 'abc }}", "{% endfor %}",
		"{{ raise_exception('no system role') }}", "{% call x %}{% endcall %}"}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, string(b))
		if strings.HasSuffix(name, "features.jinja") {
			seeds = append(seeds, strings.Split(string(b), "\n")...)
		}
	}
	return seeds
}

// FuzzParseTemplate: the parser of chat templates (a model's file, so
// anything) returns a template or an error, never panics, and parses the
// same source the same way twice.
func FuzzParseTemplate(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		body, err := parseTemplate(src)
		if err != nil {
			if body != nil || err.Error() == "" {
				t.Fatalf("error %q with a template of %d nodes", err, len(body))
			}
			if _, err2 := parseTemplate(src); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("parsed twice: %v, then %v", err, err2)
			}
			return
		}
		if _, err2 := parseTemplate(src); err2 != nil {
			t.Fatalf("parsed, then refused: %v", err2)
		}
	})
}

// FuzzRenderTemplate: a template that parses renders with a conversation
// to text or an error, without panicking, in bounded time and memory
// (the budget of a rendering, budget.go).
func FuzzRenderTemplate(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	v, err := decodeJSON(toolConversation)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src string) {
		body, err := parseTemplate(src)
		if err != nil {
			return
		}
		vars := map[string]any{"messages": v, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "tools": nil, "documents": nil}
		start := time.Now()
		out, err := render(context.Background(), body, vars)
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("rendering took %v", d)
		}
		if err != nil {
			if out != "" {
				t.Fatalf("error %v with output %q", err, out)
			}
			return
		}
		if len(out) > MaxBytes {
			t.Fatalf("rendered %d bytes", len(out))
		}
		if utf8.ValidString(src) && !utf8.ValidString(out) {
			t.Fatalf("a template of valid UTF-8 rendered %q", out) // Jinja2's strings are Unicode
		}
	})
}
