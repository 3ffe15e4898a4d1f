// Package jinja is the Jinja subset that chat templates use: a parser and a
// budgeted interpreter with Python's semantics, rendering Hugging Face chat
// templates as apply_chat_template does (trim_blocks, lstrip_blocks).
//
// It covers what the templates of Llama 3-3.2, Gemma 2 and 3, Mistral,
// Phi-3 to Phi-4, Qwen2 to Qwen3, DeepSeek-V3 and their like use: if, for
// (loop variables, loop filters, else), set (namespaces, block set),
// macros, break/continue, inline if, Python's operators and string and
// dict methods, and the filters and tests of filters.go. A template using
// anything else is refused by Parse, or, for a method of a string, when
// it is called.
//
// A template comes inside a downloaded model repository, so a rendering
// is bounded by the interpreter, not by the template: every rendering has
// a budget of steps and of bytes built (Limits; budget.go), past which it
// fails with an error wrapping ErrBudget, and its context stops it.
//
// Values handed to a rendering are JSON's, as Python sees them: nil, bool,
// int64, float64, string, []any, and ordered dicts made by NewDict. A
// Template is immutable once parsed and may be rendered by several
// goroutines at once.
package jinja

import (
	"context"
	"time"
)

// Template is a parsed template.
type Template struct{ body []tmplNode }

// Parse parses src; an error names the line and what the interpreter
// does not support.
func Parse(src string) (*Template, error) {
	body, err := parseTemplate(src)
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// Render renders t with vars (the template's global variables beside the
// functions Hugging Face gives: raise_exception), within lim; ctx stops
// it (an error wrapping ctx's; nil: nothing does).
func (t *Template) Render(ctx context.Context, vars map[string]any, lim Limits) (string, error) {
	return renderWithin(newBudget(ctx, lim), t.body, vars)
}

// NewDict is an ordered dict value (a JSON object: Python's dicts keep
// their insertion order), its items keys in order, each value
// values[key], itself a value of the package doc's kinds.
func NewDict(keys []string, values map[string]any) any {
	d := &dict{keys: make([]string, 0, len(keys)), m: make(map[string]any, len(keys))}
	for _, k := range keys {
		d.set(k, values[k])
	}
	return d
}

// StrftimeNow is the strftime_now function of transformers (Python's
// datetime.now().strftime(format)) answering with the time at, to be
// given as the variable strftime_now: naive, as datetime.now() is (%z
// and %Z are empty).
func StrftimeNow(at time.Time) any { return strftimeNow(at) }
