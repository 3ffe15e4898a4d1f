package jinja

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
)

// TestTemplateBudget: the hostile templates of issue 25 (a string
// repeated past memory, past int64, a power past int64, a string doubled
// in a loop) and one for each other operation that allocates or loops
// (concatenation, range, join, replace, upper, tojson, repr, slicing,
// items, comparisons, nesting, loops, macro calls) each end with a clear error, having
// allocated no more than twice the budget's bytes (a text grows by
// doubling; runtime.MemStats.TotalAlloc counts every allocation, kept or
// not). The budget is an eighth of a rendering's, for speed: the same
// counting (TestTemplateBudgetNamed renders the at the full one).
func TestTemplateBudget(t *testing.T) {
	const steps, bytes = MaxSteps / 8, MaxBytes / 8
	const doubled = "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}"
	big := "{% set s = 'x' * 1000000 %}" // 1 MB, within the budget
	for _, tc := range []struct {
		name, src string
		want      error // errors.Is
	}{
		{"repeat 1e10", "{{ 'a' * 10000000000 }}", ErrBudget},
		{"repeat 1e12", "{{ 'a' * 1000000000000 }}", ErrBudget},
		{"repeat past int64", "{{ 'ab' * 9223372036854775807 }}", ErrBudget},
		{"list repeat", "{{ ([1, 2] * 100000000) | length }}", ErrBudget},
		{"power", "{{ 2 ** 100000000 }}", ErrIntOverflow},
		{"power of a big base", "{{ 9223372036854775807 ** 9223372036854775807 }}", ErrIntOverflow},
		{"doubled with ~", doubled, ErrBudget},
		{"doubled with +", strings.Replace(doubled, "ns.s ~ ns.s", "ns.s + ns.s", 1), ErrBudget},
		{"doubled block set", "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}", ErrBudget},
		{"list doubled", "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", ErrBudget},
		{"output", big + "{% for i in range(100000) %}{{ s }}{% endfor %}", ErrBudget},
		{"join", big + "{{ ([s] * 1000) | join(s) | length }}", ErrBudget},
		{"str.join", big + "{{ s.join([s] * 1000) | length }}", ErrBudget},
		{"replace", big + "{{ s | replace('x', s) | length }}", ErrBudget},
		{"replace empty", big + "{{ s | replace('', s) | length }}", ErrBudget},
		{"upper", big + "{% for i in range(100000) %}{% set u = s | upper %}{% endfor %}", ErrBudget},
		{"str.upper", big + "{% for i in range(100000) %}{% set u = s.upper() %}{% endfor %}", ErrBudget},
		{"tojson", big + "{{ ([s] * 1000) | tojson | length }}", ErrBudget},
		{"tojson indent", "{{ [[[[1]]]] | tojson(indent=100000000000) }}", ErrBudget},
		{"repr", big + "{{ [s] * 1000 }}", ErrBudget},
		{"repr in ~", big + "{{ ([s] * 1000) ~ '' }}", ErrBudget},
		{"string", big + "{{ ([s] * 1000) | string | length }}", ErrBudget},
		{"characters", big + "{% for i in range(100000) %}{% for c in s %}{% endfor %}{% endfor %}", ErrBudget},
		{"list of characters", big + "{% for i in range(100000) %}{% set l = s | list %}{% endfor %}", ErrBudget},
		{"slice", big + "{% for i in range(100000) %}{% set l = s[::-1] %}{% endfor %}", ErrBudget},
		{"split", big + "{% for i in range(100000) %}{% set l = s.split('') %}{% endfor %}", ErrBudget},
		{"reverse", big + "{% for i in range(100000) %}{% set l = s | reverse %}{% endfor %}", ErrBudget},
		{"macro calls doubled", "{% macro m(n) %}{% if n < 99 %}{{ m(n + 1) }}{{ m(n + 1) }}{% endif %}{% endmacro %}{{ m(0) }}", ErrBudget},
		{"macro output doubled", big + "{% macro m(n) %}{% if n < 99 %}{{ m(n + 1) }}{{ m(n + 1) }}{% else %}{{ s }}{% endif %}{% endmacro %}{{ m(0) }}", ErrBudget},
		{"range", "{{ range(1000000000) | length }}", nil},
		{"ranges", "{% for i in range(100000) %}{% set l = range(100000) %}{% endfor %}", ErrBudget},
		{"nested loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ErrBudget},
		{"scan in", big + "{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}", ErrBudget},
		{"scan length", big + "{% for i in range(100000) %}{% if s | length > 1 %}{% endif %}{% endfor %}", ErrBudget},
		{"scan index", big + "{% for i in range(100000) %}{% set c = s[-1] %}{% endfor %}", ErrBudget},
		{"scan count", big + "{% for i in range(100000) %}{% set c = s.count('y') %}{% endfor %}", ErrBudget},
		{"scan key", big + "{% set d = {'a': 1} %}{% for i in range(100000) %}{% if s in d or d[s] or d.get(s) %}{% endif %}{% endfor %}", ErrBudget},
		{"scan prefix", big + "{% for i in range(100000) %}{% if s.startswith(s) %}{% endif %}{% endfor %}", ErrBudget},
		{"aliased compare", "{% set a = [1] * 1000 %}{% set b = [a] * 1000 %}{% set c = [b] * 1000 %}{% set d = [b] * 1000 %}{% for i in range(100) %}{% if c == d %}{% endif %}{% endfor %}", ErrBudget},
		{"aliased in", "{% set a = [1] * 1000 %}{% set b = [a] * 1000 %}{% set c = [b] * 1000 %}{% set e = [[1] * 999 + [2]] * 1000 %}{% for i in range(100) %}{% if e in c %}{% endif %}{% endfor %}", ErrBudget},
		{"select", "{% set a = [1] * 100000 %}{% for i in range(1000) %}{% set b = a | select | list %}{% endfor %}", ErrBudget},
		{"nesting", "{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}", nil},
		{"self", "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := parseTemplate(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			out, err := renderWithin(&budget{maxSteps: steps, maxBytes: bytes}, body, map[string]any{})
			runtime.ReadMemStats(&after)
			if err == nil {
				t.Fatalf("rendered %d bytes, want an error", len(out))
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("%v, want %v", err, tc.want)
			}
			if tc.want == nil && errors.Is(err, ErrBudget) {
				t.Errorf("%v, want an error of its own before the budget", err)
			}
			// The budget's bytes, twice (a text grows by doubling), and a
			// little more (rounding to size classes, the small values a
			// step makes).
			if got, most := after.TotalAlloc-before.TotalAlloc, uint64(bytes)*2+4<<20; got > most {
				t.Errorf("allocated %d MiB, more than %d MiB (%v)", got>>20, most>>20, err)
			}
		})
	}
}

// TestTemplateBudgetNamed: the hostile templates of issue 25 at the full
// budget, and the errors: the budget's say which bound was passed and
// how large it is; range's says Jinja2's sandbox's bound; nesting says
// how deep; overflow says the integers are 64-bit.
func TestTemplateBudgetNamed(t *testing.T) {
	for src, want := range map[string]string{
		"{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": "line 1: the chat template went past its budget: more than 268435456 bytes (256 MiB) built in one rendering (strings, lists and the output)",
		"{{ 'a' * 1000000000000 }}":        "line 1: a string of 1 bytes repeated 1000000000000 times: the chat template went past its budget: more than 268435456 bytes (256 MiB) built in one rendering (strings, lists and the output)",
		"{{ 'ab' * 9223372036854775807 }}": "line 1: a string of 2 bytes repeated 9223372036854775807 times: the chat template went past its budget: more than 268435456 bytes (256 MiB) built in one rendering (strings, lists and the output)",
		"{{ 'a' * 10000000000 }}":          "line 1: a string of 1 bytes repeated 10000000000 times: the chat template went past its budget: more than 268435456 bytes (256 MiB) built in one rendering (strings, lists and the output)",
		"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "the chat template went past its budget: more than 10000000 steps (statements, loop iterations, expressions, items visited) in one rendering",
		"{{ range(100001) | length }}":                           "line 1: range: more than 100000 items (the most Jinja2's sandbox gives)",
		"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}": "line 1: values nested more than 1000 deep",
		"{{ 2 ** 100000000 }}":                                   "line 1: integer overflow: the template's integers are 64-bit",
		"{{ 1e300 | int }}":                                      "line 1: filter int: integer overflow: the template's integers are 64-bit",
		"{{ (-9223372036854775807 - 1) | abs }}":                 "line 1: filter abs: integer overflow: the template's integers are 64-bit",
		"{{ '99999999999999999999' | int }}":                     "line 1: filter int: integer overflow: the template's integers are 64-bit",
		"{% set x, y = [1] * 100000 %}":                          "line 1: cannot unpack [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ... into 2 names",
	} {
		body, err := parseTemplate(src)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := render(context.Background(), body, map[string]any{}); err == nil || err.Error() != want {
			t.Errorf("%s:\n got %v\nwant %s", src, err, want)
		}
	}
}

// stopAfter is a context whose Err is nil for its first n calls and
// context.Canceled after: a stop signal that arrives in the middle of a
// rendering, at a known point.
type stopAfter struct {
	context.Context
	n, calls int
}

func (s *stopAfter) Err() error {
	if s.calls++; s.calls > s.n {
		return context.Canceled
	}
	return nil
}

// TestTemplateStops: a rendering looks at its stop signal every
// stopEverySteps steps, so a cancelled context ends a long rendering (a
// loop of 10^10 iterations, or one building a string) within that many
// steps, with an error wrapping context.Canceled (data's
// TestTemplateStopsOpen: Open stops in the middle of a line's rendering
// the same way).
func TestTemplateStops(t *testing.T) {
	for _, src := range []string{
		"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
		"{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ 'x' %}{% endfor %}",
	} {
		body, err := parseTemplate(src)
		if err != nil {
			t.Fatal(err)
		}
		ctx := &stopAfter{Context: context.Background(), n: 10}
		_, err = render(ctx, body, map[string]any{})
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "rendering stopped after") {
			t.Fatalf("%s: %v, want the stop (context.Canceled)", src, err)
		}
		if ctx.calls != ctx.n+1 {
			t.Errorf("the stop signal was looked at %d times, want %d (it stops at the first look after the cancel)", ctx.calls, ctx.n+1)
		}
	}
}

// TestBrief: a value in an error message is cut at a few hundred bytes,
// a long string at a character's start, whatever its size.
func TestBrief(t *testing.T) {
	long := strings.Repeat("é", 1<<20)
	for v, want := range map[any]string{
		"abc":      "'abc'",
		long:       "'" + strings.Repeat("é", 100) + "'...",
		"a" + long: "'a" + strings.Repeat("é", 99) + "'...",
	} {
		if got := brief(v); got != want {
			t.Errorf("brief of %d bytes: %q, want %q", len(v.(string)), got, want)
		}
	}
	if got := brief([]any{1, long}); !strings.HasPrefix(got, "[1, ") || !strings.HasSuffix(got, "...") || len(got) > 210 {
		t.Errorf("brief of a list: %q", got)
	}
}
