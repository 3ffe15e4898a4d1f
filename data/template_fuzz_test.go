package data

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/jinja"
)

// TestTemplateEdgesMatchJinja: what the fuzz targets found, against
// Jinja2: an empty subscript (x[()]), an empty block set, slice steps and
// ranges at the ends of int64, tojson with a negative indent; range at
// and past the sandbox's 100000 items, int and abs at their edges,
// escapes in repr and tojson, indexing a string from either end; and
// expressions past the render bounds, which Jinja2 cannot render either;
// integers at the ends of int64 (past them, where Python's go on, an
// error).
func TestTemplateEdgesMatchJinja(t *testing.T) {
	var cases []renderCase
	for _, src := range []string{
		"{{ x[] }}|{{ d[] }}|{{ s[] }}|{{ 0[] }}|{{ x[] is defined }}",
		"{% set a %}{% endset %}[{{ a }}]{% set b -%}   {%- endset %}[{{ b }}]",
		"{{ x[1:3:9223372036854775807] }} {{ x[2::-9223372036854775807] }} {{ x[::-9223372036854775807] }} {{ s[1:3:9223372036854775807] }} {{ x[-9223372036854775807:9223372036854775807] }}",
		"{{ range(9223372036854775806, 9223372036854775807, 100) | list }} {{ range(-9223372036854775807, -9223372036854775807 - 1, -5) | list }}",
		"{{ x | tojson(indent=-5) }} {{ d | tojson(indent=0) }}",
		"{{ 'ab' * 9223372036854775807 }}",
		"{{ x * 9223372036854775807 }}",
		"{{ x | tojson(indent=99999999999) }}",
		"{{ range(100000) | length }} {{ range(5, -99995, -1) | length }} {{ range(0, 9223372036854775807, 92233720368547759) | length }} {{ range(-9223372036854775807 - 1, 9223372036854775807, 9223372036854775807) | list }}",
		"{{ range(100001) | length }}",
		"{{ range(-9223372036854775807 - 1, 9223372036854775807) | length }}",
		"{{ 'nan' | int }} {{ 'x' | int(7) }} {{ -5 | abs }} {{ true | abs }} {{ 2.5 | int }} {{ -2.5 | int }} {{ '12' | int }}",
		"{{ 'inf' | int }}",
		"{{ '-inf' | int }}",
		`{{ 'caf\u00e9 \x01\x7f"\'' | tojson }} {{ 'caf\u00e9 \x01\x7f"\'' | tojson(ensure_ascii=true) }} {{ ['caf\u00e9 \x01\x7f"\'\\'] }} {{ ['\U0001F600'] | tojson(ensure_ascii=true) }}`,
		`{{ s[0] }}{{ s[-1] }}{{ s[2] }}{{ s[-3] }}|{{ s[3] }}|{{ s[-4] }}|{{ s | first }}{{ s | last }}{{ '' | first }}{{ 'h\u00e9llo'[1] }}{{ 'h\u00e9llo'[-4] }}`,
		"{{ '' * 9223372036854775807 }}|{{ [] * 9223372036854775807 }}|{{ 3 ** 39 }}|{{ (-2) ** 63 }}|{{ 9223372036854775807 + -1 }}|{{ -9223372036854775807 - 1 }}|{{ 3037000499 * 3037000499 }}",
	} {
		cases = append(cases, renderCase{name: src, template: src, vars: map[string]any{"x": []any{1, 2, 3}, "d": map[string]any{"k": []any{"v"}}, "s": "abc"}})
	}
	want, wantErr := jinjaRender(t, cases)
	for i, c := range cases {
		got, err := goRender(c)
		switch {
		case wantErr[i] != "":
			if err == nil {
				t.Errorf("%s: Jinja2 raised %s; Strata rendered %q", c.name, wantErr[i], got)
			}
		case err != nil:
			t.Errorf("%s: %v; Jinja2 rendered %q", c.name, err, want[i])
		case got != want[i]:
			t.Errorf("%s: rendered\n%q\nJinja2 rendered\n%q", c.name, got, want[i])
		}
	}
	for _, src := range []string{"{{ 3 ** 40 }}", "{{ 2 ** 63 }}", "{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}", "{{ 3037000500 * 3037000500 }}",
		"{{ (-9223372036854775807 - 1) // -1 }}", "{{ -(-9223372036854775807 - 1) }}"} {
		if got, err := goRender(renderCase{name: src, template: src, vars: map[string]any{}}); !errors.Is(err, jinja.ErrIntOverflow) {
			t.Errorf("%s: rendered %q, %v; want the overflow error", src, got, err)
		}
	}
}

// TestTemplateNesting: blocks, brackets, signs and "not"s nested past
// maxNesting are refused when the template is parsed, and expressions
// nested past maxExprDepth (chains of operators, filters, attributes or
// calls) are an error when it renders: neither overflows the stack, as
// 10^5 of any did. Less deep ones (as deep as Jinja2 takes) render.
func TestTemplateNesting(t *testing.T) {
	const n = 100_000
	for _, src := range []string{
		"{{ " + strings.Repeat("(", n) + "1" + strings.Repeat(")", n) + " }}",
		"{{ " + strings.Repeat("[", n) + strings.Repeat("]", n) + " }}",
		"{{ {" + strings.Repeat("'a': {", n) + strings.Repeat("}", n) + "} }}",
		"{{ " + strings.Repeat("not ", n) + "1 }}",
		"{{ " + strings.Repeat("-", n) + "1 }}",
		strings.Repeat("{% if true %}", n) + strings.Repeat("{% endif %}", n),
		strings.Repeat("{% for x in [1] %}", n) + strings.Repeat("{% endfor %}", n),
	} {
		if _, err := parseTemplate(src); err == nil || !strings.Contains(err.Error(), "nested more than 200") && !strings.Contains(err.Error(), "more than 200 nested") {
			t.Errorf("%.40s...: %v, want it refused as nested too deep", src, err)
		}
	}
	for _, src := range []string{
		"{{ 1" + strings.Repeat("+1", n) + " }}",
		"{{ 1" + strings.Repeat("|string", n) + " }}",
		"{{ x" + strings.Repeat(".a", n) + " }}",
		"{{ x" + strings.Repeat("()", n) + " }}",
		"{{ 1 if " + strings.Repeat("1 if ", n) + " 1 }}",
	} {
		body, err := parseTemplate(src)
		if err != nil {
			t.Fatalf("%.40s...: %v", src, err)
		}
		if _, err := render(context.Background(), body, map[string]any{}); err == nil || !strings.Contains(err.Error(), "nested more than 1000 deep") {
			t.Errorf("%.40s...: %v, want an error saying it nests too deep", src, err)
		}
	}
	src := "{{ 1" + strings.Repeat("+1", 900) + " }} {{ " + strings.Repeat("(", 150) + "1" + strings.Repeat(")", 150) + " }} " +
		strings.Repeat("{% if true %}", 150) + "x" + strings.Repeat("{% endif %}", 150)
	if got, err := goRender(renderCase{name: "deep", template: src, vars: map[string]any{}}); err != nil || got != "901 1 x" {
		t.Errorf("nested as deep as Jinja2 takes: %q, %v", got, err)
	}
}
