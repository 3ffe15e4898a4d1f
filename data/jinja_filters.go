package data

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// The filters, tests and methods of the chat-template interpreter: those
// the chat templates of the Llama-3, Qwen2 and Mistral families and their
// like use, with Jinja's (and Hugging Face's tojson) behaviour. A template
// naming another filter or test is refused when it is parsed.

type filterFunc func(r *renderer, v any, args []any, kw *dict) (any, error)

var filters map[string]filterFunc

var tests map[string]func(v any, args []any) (bool, error)

func init() {
	filters = map[string]filterFunc{
		"trim":       fTrim,
		"length":     func(_ *renderer, v any, _ []any, _ *dict) (any, error) { return length(v) },
		"count":      func(_ *renderer, v any, _ []any, _ *dict) (any, error) { return length(v) },
		"tojson":     fToJSON,
		"upper":      strFilter(strings.ToUpper),
		"lower":      strFilter(strings.ToLower),
		"capitalize": strFilter(capitalize),
		"title":      strFilter(jinjaTitle),
		"first":      fFirst,
		"last":       fLast,
		"join":       fJoin,
		"default":    fDefault,
		"d":          fDefault,
		"string":     func(_ *renderer, v any, _ []any, _ *dict) (any, error) { return str(v), nil },
		"safe":       func(_ *renderer, v any, _ []any, _ *dict) (any, error) { return v, nil },
		"int":        fInt,
		"float":      fFloat,
		"list": func(_ *renderer, v any, _ []any, _ *dict) (any, error) {
			xs, err := items(v)
			return append([]any{}, xs...), err
		},
		"replace":    fReplace,
		"select":     selectFilter(false, false),
		"reject":     selectFilter(true, false),
		"selectattr": selectFilter(false, true),
		"rejectattr": selectFilter(true, true),
		"map":        fMap,
		"items":      fItems,
		"abs":        fAbs,
		"reverse":    fReverse,
	}
	tests = map[string]func(v any, args []any) (bool, error){
		"defined":   func(v any, _ []any) (bool, error) { _, u := v.(undef); return !u, nil },
		"undefined": func(v any, _ []any) (bool, error) { _, u := v.(undef); return u, nil },
		"none":      func(v any, _ []any) (bool, error) { return v == nil, nil },
		"string":    func(v any, _ []any) (bool, error) { _, ok := v.(string); return ok, nil },
		"number":    func(v any, _ []any) (bool, error) { _, ok := number(v); return ok, nil },
		"integer":   func(v any, _ []any) (bool, error) { _, ok := v.(int64); return ok, nil },
		"float":     func(v any, _ []any) (bool, error) { _, ok := v.(float64); return ok, nil },
		"boolean":   func(v any, _ []any) (bool, error) { _, ok := v.(bool); return ok, nil },
		"true":      func(v any, _ []any) (bool, error) { return v == true, nil },
		"false":     func(v any, _ []any) (bool, error) { return v == false, nil },
		"mapping":   func(v any, _ []any) (bool, error) { _, ok := v.(*dict); return ok, nil },
		"callable":  func(v any, _ []any) (bool, error) { _, ok := v.(*fn); return ok, nil },
		"iterable": func(v any, _ []any) (bool, error) {
			_, err := items(v)
			return err == nil, nil
		},
		"sequence": func(v any, _ []any) (bool, error) {
			switch v.(type) {
			case string, []any, tuple, *dict:
				return true, nil
			}
			return false, nil
		},
		"odd":         intTest(func(n, _ int64) bool { return n%2 != 0 }),
		"even":        intTest(func(n, _ int64) bool { return n%2 == 0 }),
		"divisibleby": intTest(func(n, d int64) bool { return d != 0 && n%d == 0 }),
		"lower":       func(v any, _ []any) (bool, error) { s, ok := v.(string); return ok && strings.ToLower(s) == s, nil },
		"upper":       func(v any, _ []any) (bool, error) { s, ok := v.(string); return ok && strings.ToUpper(s) == s, nil },
		"in": func(v any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("test in takes one argument")
			}
			return contains(args[0], v)
		},
	}
	for _, op := range [][]string{{"==", "eq", "equalto"}, {"!=", "ne"}, {"<", "lt", "lessthan"}, {">", "gt", "greaterthan"}, {"<=", "le"}, {">=", "ge"}} {
		f := compareTest(op[0])
		for _, name := range op {
			tests[name] = f
		}
	}
}

func filterNames() []string {
	var out []string
	for k := range filters {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func testNames() []string {
	var out []string
	for k := range tests {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func compareTest(op string) func(v any, args []any) (bool, error) {
	return func(v any, args []any) (bool, error) {
		if len(args) != 1 {
			return false, fmt.Errorf("test %s takes one argument", op)
		}
		b, err := binaryOp(op, v, args[0])
		return b == true, err
	}
}

func intTest(f func(n, arg int64) bool) func(v any, args []any) (bool, error) {
	return func(v any, args []any) (bool, error) {
		n, ok := integer(v)
		if !ok {
			return false, fmt.Errorf("the test needs an integer, got %s", typeName(v))
		}
		var a int64
		if len(args) > 0 {
			if a, ok = integer(args[0]); !ok {
				return false, fmt.Errorf("the test's argument must be an integer, got %s", typeName(args[0]))
			}
		}
		return f(n, a), nil
	}
}

// arg is argument i by position, else by name, else def.
func arg(args []any, kw *dict, i int, name string, def any) any {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kw.get(name); ok {
		return v
	}
	return def
}

func (r *renderer) evalFilter(x *filterExpr) (any, error) {
	v, err := r.eval(x.x)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(x.args, x.kw)
	if err != nil {
		return nil, err
	}
	out, err := filters[x.name](r, v, args, kw)
	if err != nil {
		return nil, fmt.Errorf("filter %s: %w", x.name, err)
	}
	return out, nil
}

func (r *renderer) evalTest(x *testExpr) (any, error) {
	v, err := r.eval(x.x)
	if err != nil {
		return nil, err
	}
	args, _, err := r.evalArgs(x.args, nil)
	if err != nil {
		return nil, err
	}
	ok, err := tests[x.name](v, args)
	if err != nil {
		return nil, fmt.Errorf("test %s: %w", x.name, err)
	}
	return ok != x.not, nil
}

func strFilter(f func(string) string) filterFunc {
	return func(_ *renderer, v any, _ []any, _ *dict) (any, error) { return f(str(v)), nil }
}

func capitalize(s string) string {
	rs := []rune(strings.ToLower(s))
	if len(rs) > 0 {
		rs[0] = unicode.ToUpper(rs[0])
	}
	return string(rs)
}

var titleSplit = regexp.MustCompile(`[-\s({\[<]+`)

// jinjaTitle is Jinja's title filter: each word (split at whitespace and
// -({[<) capitalized.
func jinjaTitle(s string) string {
	var b strings.Builder
	last := 0
	for _, m := range titleSplit.FindAllStringIndex(s, -1) {
		b.WriteString(capitalize(s[last:m[0]]))
		b.WriteString(s[m[0]:m[1]])
		last = m[1]
	}
	b.WriteString(capitalize(s[last:]))
	return b.String()
}

// pyStrip is Python's str.strip/lstrip/rstrip with optional characters.
func pyStrip(s string, chars any, left, right bool) string {
	is := unicode.IsSpace
	if c, ok := chars.(string); ok {
		is = func(r rune) bool { return strings.ContainsRune(c, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, is)
	}
	if right {
		s = strings.TrimRightFunc(s, is)
	}
	return s
}

func fTrim(_ *renderer, v any, args []any, kw *dict) (any, error) {
	return pyStrip(str(v), arg(args, kw, 0, "chars", nil), true, true), nil
}

func fToJSON(_ *renderer, v any, args []any, kw *dict) (any, error) {
	indent := -1
	if i := arg(args, kw, 0, "indent", nil); i != nil {
		n, ok := integer(i)
		if !ok {
			return nil, fmt.Errorf("indent must be an integer, got %s", typeName(i))
		}
		indent = int(max(n, 0)) // Python: ' ' * indent, empty when negative
	}
	itemSep, keySep := ", ", ": "
	if indent >= 0 {
		itemSep = ","
	}
	if s := arg(args, kw, 2, "separators", nil); s != nil {
		xs, err := items(s)
		if err != nil || len(xs) != 2 {
			return nil, fmt.Errorf("separators must be a pair of strings")
		}
		itemSep, keySep = str(xs[0]), str(xs[1])
	}
	var b strings.Builder
	err := toJSON(&b, v, indent, itemSep, keySep, truthy(arg(args, kw, 3, "sort_keys", false)), truthy(arg(args, kw, 1, "ensure_ascii", false)), 0)
	return b.String(), err
}

func fFirst(_ *renderer, v any, _ []any, _ *dict) (any, error) {
	xs, err := items(v)
	if err != nil {
		return nil, err
	}
	if len(xs) == 0 {
		return undef{"the first item of an empty sequence"}, nil
	}
	return xs[0], nil
}

func fLast(_ *renderer, v any, _ []any, _ *dict) (any, error) {
	xs, err := items(v)
	if err != nil {
		return nil, err
	}
	if len(xs) == 0 {
		return undef{"the last item of an empty sequence"}, nil
	}
	return xs[len(xs)-1], nil
}

func fJoin(_ *renderer, v any, args []any, kw *dict) (any, error) {
	xs, err := items(v)
	if err != nil {
		return nil, err
	}
	attr := arg(args, kw, 1, "attribute", nil)
	parts := make([]string, len(xs))
	for i, x := range xs {
		if a, ok := attr.(string); ok {
			if x, err = getAttr(x, a); err != nil {
				return nil, err
			}
		}
		parts[i] = str(x)
	}
	return strings.Join(parts, str(arg(args, kw, 0, "d", ""))), nil
}

func fDefault(_ *renderer, v any, args []any, kw *dict) (any, error) {
	_, u := v.(undef)
	if u || (truthy(arg(args, kw, 1, "boolean", false)) && !truthy(v)) {
		return arg(args, kw, 0, "default_value", ""), nil
	}
	return v, nil
}

func fInt(_ *renderer, v any, args []any, kw *dict) (any, error) {
	def := arg(args, kw, 0, "default", int64(0))
	switch x := v.(type) {
	case bool, int64:
		n, _ := integer(x)
		return n, nil
	case float64:
		return int64(x), nil
	case string:
		if n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64); err == nil {
			return n, nil
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
			return int64(f), nil
		}
	}
	return def, nil
}

func fFloat(_ *renderer, v any, args []any, kw *dict) (any, error) {
	def := arg(args, kw, 0, "default", 0.0)
	if f, ok := number(v); ok {
		return f, nil
	}
	if s, ok := v.(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			return f, nil
		}
	}
	return def, nil
}

func fReplace(_ *renderer, v any, args []any, kw *dict) (any, error) {
	n := int64(-1)
	if c := arg(args, kw, 2, "count", nil); c != nil {
		var ok bool
		if n, ok = integer(c); !ok {
			return nil, fmt.Errorf("count must be an integer")
		}
	}
	return strings.Replace(str(v), str(arg(args, kw, 0, "old", "")), str(arg(args, kw, 1, "new", "")), int(n)), nil
}

// selectFilter is select/reject (by a test on each item, or its truth)
// and selectattr/rejectattr (the same on an attribute of each item).
func selectFilter(reject, byAttr bool) filterFunc {
	return func(_ *renderer, v any, args []any, _ *dict) (any, error) {
		xs, err := items(v)
		if err != nil {
			return nil, err
		}
		var attr string
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("missing the attribute name")
			}
			attr = str(args[0])
			args = args[1:]
		}
		var test func(any, []any) (bool, error)
		if len(args) > 0 {
			name := str(args[0])
			if test = tests[name]; test == nil {
				return nil, fmt.Errorf("test %q is not supported", name)
			}
			args = args[1:]
		}
		var out []any
		for _, x := range xs {
			y := x
			if byAttr {
				if y, err = getAttr(x, attr); err != nil {
					return nil, err
				}
			}
			ok := truthy(y)
			if test != nil {
				if ok, err = test(y, args); err != nil {
					return nil, err
				}
			}
			if ok != reject {
				out = append(out, x)
			}
		}
		return out, nil
	}
}

func fMap(r *renderer, v any, args []any, kw *dict) (any, error) {
	xs, err := items(v)
	if err != nil {
		return nil, err
	}
	out := make([]any, len(xs))
	for i, x := range xs {
		switch {
		case len(args) > 0:
			f := filters[str(args[0])]
			if f == nil {
				return nil, fmt.Errorf("filter %q is not supported", str(args[0]))
			}
			if out[i], err = f(r, x, args[1:], newDict()); err != nil {
				return nil, err
			}
		default:
			a, ok := kw.get("attribute")
			if !ok {
				return nil, fmt.Errorf("map needs a filter name or attribute=")
			}
			if out[i], err = getAttr(x, str(a)); err != nil {
				return nil, err
			}
			if _, u := out[i].(undef); u {
				if d, ok := kw.get("default"); ok {
					out[i] = d
				}
			}
		}
	}
	return out, nil
}

func fItems(_ *renderer, v any, _ []any, _ *dict) (any, error) {
	switch d := v.(type) {
	case *dict:
		out := make([]any, len(d.keys))
		for i, k := range d.keys {
			out[i] = tuple{k, d.m[k]}
		}
		return out, nil
	case undef:
		return []any{}, nil
	}
	return nil, fmt.Errorf("can only get item pairs from a mapping, not %s", typeName(v))
}

func fAbs(_ *renderer, v any, _ []any, _ *dict) (any, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(v))
}

func fReverse(_ *renderer, v any, _ []any, _ *dict) (any, error) {
	if s, ok := v.(string); ok {
		rs := []rune(s)
		slices.Reverse(rs)
		return string(rs), nil
	}
	xs, err := items(v)
	if err != nil {
		return nil, err
	}
	out := append([]any{}, xs...)
	slices.Reverse(out)
	return out, nil
}

// method is the method name of v (a string's or a dict's), nil when v has none.
func method(v any, name string) *fn {
	m := func(f func(args []any, kw *dict) (any, error)) *fn {
		return &fn{name: typeName(v) + "." + name, call: f}
	}
	switch x := v.(type) {
	case string:
		return strMethod(x, name, m)
	case *dict:
		switch name {
		case "items":
			return m(func([]any, *dict) (any, error) { return fItems(nil, x, nil, nil) })
		case "keys":
			return m(func([]any, *dict) (any, error) { return items(x) })
		case "values":
			return m(func([]any, *dict) (any, error) {
				out := make([]any, len(x.keys))
				for i, k := range x.keys {
					out[i] = x.m[k]
				}
				return out, nil
			})
		case "get":
			return m(func(args []any, kw *dict) (any, error) {
				if v, ok := x.get(str(arg(args, kw, 0, "key", ""))); ok {
					return v, nil
				}
				return arg(args, kw, 1, "default", nil), nil
			})
		}
	}
	return nil
}

func strMethod(s, name string, m func(func([]any, *dict) (any, error)) *fn) *fn {
	switch name {
	case "strip", "lstrip", "rstrip":
		return m(func(args []any, kw *dict) (any, error) {
			return pyStrip(s, arg(args, kw, 0, "chars", nil), name != "rstrip", name != "lstrip"), nil
		})
	case "upper", "lower", "title", "capitalize":
		f := map[string]func(string) string{"upper": strings.ToUpper, "lower": strings.ToLower, "title": pyTitle, "capitalize": capitalize}[name]
		return m(func([]any, *dict) (any, error) { return f(s), nil })
	case "startswith", "endswith":
		return m(func(args []any, kw *dict) (any, error) {
			p := arg(args, kw, 0, "prefix", "")
			cands, ok := p.(tuple)
			if !ok {
				cands = tuple{p}
			}
			for _, c := range cands {
				cs, ok := c.(string)
				if !ok {
					return nil, fmt.Errorf("%s arg must be str or a tuple of str, not %s", name, typeName(c))
				}
				if name == "startswith" && strings.HasPrefix(s, cs) || name == "endswith" && strings.HasSuffix(s, cs) {
					return true, nil
				}
			}
			return false, nil
		})
	case "split":
		return m(func(args []any, kw *dict) (any, error) {
			n, _ := integer(arg(args, kw, 1, "maxsplit", int64(-1)))
			var parts []string
			if sep := arg(args, kw, 0, "sep", nil); sep == nil {
				parts = pySplitSpace(s, int(n))
			} else if n < 0 {
				parts = strings.Split(s, str(sep))
			} else {
				parts = strings.SplitN(s, str(sep), int(n)+1)
			}
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out, nil
		})
	case "replace":
		return m(func(args []any, kw *dict) (any, error) { return fReplace(nil, s, args, kw) })
	case "find":
		return m(func(args []any, kw *dict) (any, error) {
			i := strings.Index(s, str(arg(args, kw, 0, "sub", "")))
			if i < 0 {
				return int64(-1), nil
			}
			return int64(len([]rune(s[:i]))), nil
		})
	case "count":
		return m(func(args []any, kw *dict) (any, error) {
			return int64(strings.Count(s, str(arg(args, kw, 0, "sub", "")))), nil
		})
	case "join":
		return m(func(args []any, kw *dict) (any, error) {
			return fJoin(nil, arg(args, kw, 0, "iterable", nil), []any{s}, newDict())
		})
	}
	return nil
}

// pySplitSpace is Python's str.split() without a separator: runs of
// whitespace separate, none at the ends, at most n splits (n < 0: all).
func pySplitSpace(s string, n int) []string {
	var out []string
	s = strings.TrimLeftFunc(s, unicode.IsSpace)
	for s != "" {
		if n >= 0 && len(out) == n {
			out = append(out, s)
			break
		}
		i := strings.IndexFunc(s, unicode.IsSpace)
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i])
		s = strings.TrimLeftFunc(s[i:], unicode.IsSpace)
	}
	return out
}

// pyTitle is Python's str.title: a letter after a non-letter is upper
// case, after a letter lower case.
func pyTitle(s string) string {
	rs := []rune(s)
	prev := false
	for i, r := range rs {
		if unicode.IsLetter(r) {
			if prev {
				rs[i] = unicode.ToLower(r)
			} else {
				rs[i] = unicode.ToUpper(r)
			}
			prev = true
		} else {
			prev = false
		}
	}
	return string(rs)
}
