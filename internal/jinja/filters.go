package jinja

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The filters, tests and methods of the chat-template interpreter: those
// the chat templates of the Llama-3, Qwen2 and Mistral families and their
// like use, with Jinja's (and Hugging Face's tojson) behaviour. A template
// naming another filter or test is refused when it is parsed.

type filterFunc func(r *renderer, v any, args []any, kw *dict) (any, error)

var filters map[string]filterFunc

// testFunc is a test (x is name): b is the rendering's budget.
type testFunc func(b *budget, v any, args []any) (bool, error)

var tests map[string]testFunc

func init() {
	filters = map[string]filterFunc{
		"trim":       fTrim,
		"length":     func(r *renderer, v any, _ []any, _ *dict) (any, error) { return length(r.bud, v) },
		"count":      func(r *renderer, v any, _ []any, _ *dict) (any, error) { return length(r.bud, v) },
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
		"string":     func(r *renderer, v any, _ []any, _ *dict) (any, error) { return str(r.bud, v) },
		"safe":       func(_ *renderer, v any, _ []any, _ *dict) (any, error) { return v, nil },
		"int":        fInt,
		"float":      fFloat,
		"list": func(r *renderer, v any, _ []any, _ *dict) (any, error) {
			xs, err := items(r.bud, v)
			if err == nil {
				err = r.bud.items(len(xs))
			}
			if err != nil {
				return nil, err
			}
			return append([]any{}, xs...), nil
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
	tests = map[string]testFunc{
		"defined":   func(_ *budget, v any, _ []any) (bool, error) { _, u := v.(undef); return !u, nil },
		"undefined": func(_ *budget, v any, _ []any) (bool, error) { _, u := v.(undef); return u, nil },
		"none":      func(_ *budget, v any, _ []any) (bool, error) { return v == nil, nil },
		"string":    func(_ *budget, v any, _ []any) (bool, error) { _, ok := v.(string); return ok, nil },
		"number":    func(_ *budget, v any, _ []any) (bool, error) { _, ok := number(v); return ok, nil },
		"integer":   func(_ *budget, v any, _ []any) (bool, error) { _, ok := v.(int64); return ok, nil },
		"float":     func(_ *budget, v any, _ []any) (bool, error) { _, ok := v.(float64); return ok, nil },
		"boolean":   func(_ *budget, v any, _ []any) (bool, error) { _, ok := v.(bool); return ok, nil },
		"true":      func(_ *budget, v any, _ []any) (bool, error) { return v == true, nil },
		"false":     func(_ *budget, v any, _ []any) (bool, error) { return v == false, nil },
		"mapping":   func(_ *budget, v any, _ []any) (bool, error) { _, ok := v.(*dict); return ok, nil },
		"callable":  func(_ *budget, v any, _ []any) (bool, error) { _, ok := v.(*fn); return ok, nil },
		"iterable": func(_ *budget, v any, _ []any) (bool, error) {
			switch v.(type) {
			case string, []any, tuple, *dict, undef:
				return true, nil
			}
			return false, nil
		},
		"sequence": func(_ *budget, v any, _ []any) (bool, error) {
			switch v.(type) {
			case string, []any, tuple, *dict:
				return true, nil
			}
			return false, nil
		},
		"odd":         intTest(func(n, _ int64) bool { return n%2 != 0 }),
		"even":        intTest(func(n, _ int64) bool { return n%2 == 0 }),
		"divisibleby": intTest(func(n, d int64) bool { return d != 0 && n%d == 0 }),
		"lower":       caseTest(strings.ToLower),
		"upper":       caseTest(strings.ToUpper),
		"in": func(b *budget, v any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("test in takes one argument")
			}
			return contains(b, args[0], v)
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

func compareTest(op string) testFunc {
	return func(b *budget, v any, args []any) (bool, error) {
		if len(args) != 1 {
			return false, fmt.Errorf("test %s takes one argument", op)
		}
		t, err := binaryOp(b, op, v, args[0])
		return t == true, err
	}
}

// caseTest is the lower (upper) test: a string that lowering (uppering)
// leaves as it is.
func caseTest(f func(string) string) testFunc {
	return func(b *budget, v any, _ []any) (bool, error) {
		s, ok := v.(string)
		if !ok {
			return false, nil
		}
		if err := b.allocN(int64(len(s)), 2); err != nil { // f's result, at most half as long again
			return false, err
		}
		return f(s) == s, nil
	}
}

func intTest(f func(n, arg int64) bool) testFunc {
	return func(_ *budget, v any, args []any) (bool, error) {
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
	ok, err := tests[x.name](r.bud, v, args)
	if err != nil {
		return nil, fmt.Errorf("test %s: %w", x.name, err)
	}
	return ok != x.not, nil
}

// strFilter is a filter of str(v) that builds a string about as long
// (upper, lower, capitalize, title: changing a letter's case can make it
// longer, by half at most).
func strFilter(f func(string) string) filterFunc {
	return func(r *renderer, v any, _ []any, _ *dict) (any, error) {
		s, err := str(r.bud, v)
		if err != nil {
			return nil, err
		}
		return caseMap(r.bud, f, s)
	}
}

// caseMap is f(s) charged to b (f builds a string up to twice as long
// as s, with the runes capitalize and title convert).
func caseMap(b *budget, f func(string) string, s string) (string, error) {
	if err := b.allocN(int64(len(s)), 2); err != nil {
		return "", err
	}
	return f(s), nil
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
func pyStrip(b *budget, s string, chars any, left, right bool) (string, error) {
	is := unicode.IsSpace
	if c, ok := chars.(string); ok {
		// Each character of s is looked for in c: charge the pairs.
		if err := b.step(int64(len(s)) * (int64(len(c))/scanBytesPerStep + 1) / scanBytesPerStep); err != nil {
			return "", err
		}
		is = func(r rune) bool { return strings.ContainsRune(c, r) }
	}
	if err := b.scan(len(s)); err != nil {
		return "", err
	}
	if left {
		s = strings.TrimLeftFunc(s, is)
	}
	if right {
		s = strings.TrimRightFunc(s, is)
	}
	return s, nil
}

func fTrim(r *renderer, v any, args []any, kw *dict) (any, error) {
	s, err := str(r.bud, v)
	if err != nil {
		return nil, err
	}
	return pyStrip(r.bud, s, arg(args, kw, 0, "chars", nil), true, true)
}

func fToJSON(r *renderer, v any, args []any, kw *dict) (any, error) {
	indent := -1
	if i := arg(args, kw, 0, "indent", nil); i != nil {
		n, ok := integer(i)
		if !ok {
			return nil, fmt.Errorf("indent must be an integer, got %s", typeName(i))
		}
		indent = int(max(n, 0)) // Python: ' ' * indent, empty when negative
	}
	o := &jsonOpts{indent: indent, itemSep: ", ", keySep: ": ", sortKeys: truthy(arg(args, kw, 3, "sort_keys", false)), ascii: truthy(arg(args, kw, 1, "ensure_ascii", false))}
	if indent >= 0 {
		o.itemSep = ","
	}
	if s := arg(args, kw, 2, "separators", nil); s != nil {
		xs, err := items(r.bud, s)
		if errors.Is(err, ErrBudget) {
			return nil, err
		}
		if err != nil || len(xs) != 2 {
			return nil, fmt.Errorf("separators must be a pair of strings")
		}
		if o.itemSep, err = str(r.bud, xs[0]); err != nil {
			return nil, err
		}
		if o.keySep, err = str(r.bud, xs[1]); err != nil {
			return nil, err
		}
	}
	t := &text{bud: r.bud}
	if err := toJSON(t, v, o, 0); err != nil {
		return nil, err
	}
	return t.String(), nil
}

func fFirst(r *renderer, v any, _ []any, _ *dict) (any, error) {
	if s, ok := v.(string); ok { // not every character made a string
		if c, ok, err := runeAt(r.bud, s, 0); ok || err != nil {
			return c, err
		}
	}
	xs, err := items(r.bud, v)
	if err != nil {
		return nil, err
	}
	if len(xs) == 0 {
		return undef{"the first item of an empty sequence"}, nil
	}
	return xs[0], nil
}

func fLast(r *renderer, v any, _ []any, _ *dict) (any, error) {
	if s, ok := v.(string); ok {
		if c, ok, err := runeAt(r.bud, s, -1); ok || err != nil {
			return c, err
		}
	}
	xs, err := items(r.bud, v)
	if err != nil {
		return nil, err
	}
	if len(xs) == 0 {
		return undef{"the last item of an empty sequence"}, nil
	}
	return xs[len(xs)-1], nil
}

func fJoin(r *renderer, v any, args []any, kw *dict) (any, error) {
	return join(r.bud, v, arg(args, kw, 0, "d", ""), arg(args, kw, 1, "attribute", nil))
}

// join is the join filter and str.join: the items of v (or their
// attribute attr) as strings, sep between them.
func join(b *budget, v, sep, attr any) (any, error) {
	xs, err := items(b, v)
	if err != nil {
		return nil, err
	}
	d, err := str(b, sep)
	if err != nil {
		return nil, err
	}
	if err := b.allocN(int64(len(xs)), 16); err != nil { // the parts
		return nil, err
	}
	parts := make([]string, len(xs))
	n := int64(0)
	for i, x := range xs {
		if a, ok := attr.(string); ok {
			if x, err = getAttr(b, x, a); err != nil {
				return nil, err
			}
		}
		if parts[i], err = str(b, x); err != nil {
			return nil, err
		}
		n += int64(len(parts[i])) + int64(len(d))
	}
	if err := b.alloc(n); err != nil {
		return nil, err
	}
	return strings.Join(parts, d), nil
}

func fDefault(_ *renderer, v any, args []any, kw *dict) (any, error) {
	_, u := v.(undef)
	if u || (truthy(arg(args, kw, 1, "boolean", false)) && !truthy(v)) {
		return arg(args, kw, 0, "default_value", ""), nil
	}
	return v, nil
}

func fInt(r *renderer, v any, args []any, kw *dict) (any, error) {
	def := arg(args, kw, 0, "default", int64(0))
	if s, ok := v.(string); ok {
		if err := r.bud.scan(len(s)); err != nil {
			return nil, err
		}
	}
	switch x := v.(type) {
	case bool, int64:
		n, _ := integer(x)
		return n, nil
	case float64:
		return floatToInt(x, def)
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		if err == nil {
			return n, nil
		}
		if errors.Is(err, strconv.ErrRange) {
			return nil, ErrIntOverflow
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
			return floatToInt(f, def)
		}
	}
	return def, nil
}

// floatToInt is Python's int(f) within int64: NaN gives def (Jinja's int
// filter catches Python's ValueError), an infinity or a number past int64
// is an error (Python's OverflowError, or an integer too large for the
// template's), never a wrapped number.
func floatToInt(f float64, def any) (any, error) {
	switch {
	case math.IsNaN(f):
		return def, nil
	case f >= -math.MinInt64 || f < math.MinInt64: // -MinInt64: 2^63, exact
		return nil, ErrIntOverflow
	}
	return int64(f), nil
}

func fFloat(r *renderer, v any, args []any, kw *dict) (any, error) {
	def := arg(args, kw, 0, "default", 0.0)
	if s, ok := v.(string); ok {
		if err := r.bud.scan(len(s)); err != nil {
			return nil, err
		}
	}
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

func fReplace(r *renderer, v any, args []any, kw *dict) (any, error) {
	return replace(r.bud, v, args, kw)
}

// replace is the replace filter and str.replace: old replaced by new in
// str(v), count times at most (all when count < 0).
func replace(b *budget, v any, args []any, kw *dict) (any, error) {
	n := int64(-1)
	if c := arg(args, kw, 2, "count", nil); c != nil {
		var ok bool
		if n, ok = integer(c); !ok {
			return nil, fmt.Errorf("count must be an integer")
		}
	}
	var ss [3]string
	for i, x := range []any{v, arg(args, kw, 0, "old", ""), arg(args, kw, 1, "new", "")} {
		var err error
		if ss[i], err = str(b, x); err != nil {
			return nil, err
		}
	}
	s, old, new := ss[0], ss[1], ss[2]
	if err := b.scan(len(s)); err != nil {
		return nil, err
	}
	m := int64(strings.Count(s, old)) // an empty old: between the characters
	if n >= 0 {
		m = min(m, n)
	}
	if err := b.allocN(m, int64(len(new))); err != nil {
		return nil, fmt.Errorf("%d replacements of %d bytes: %w", m, len(new), err)
	}
	if err := b.alloc(int64(len(s))); err != nil {
		return nil, err
	}
	return strings.Replace(s, old, new, int(m)), nil
}

// selectFilter is select/reject (by a test on each item, or its truth)
// and selectattr/rejectattr (the same on an attribute of each item).
func selectFilter(reject, byAttr bool) filterFunc {
	return func(r *renderer, v any, args []any, _ *dict) (any, error) {
		xs, err := items(r.bud, v)
		if err != nil {
			return nil, err
		}
		var attr string
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("missing the attribute name")
			}
			if attr, err = str(r.bud, args[0]); err != nil {
				return nil, err
			}
			args = args[1:]
		}
		var test testFunc
		if len(args) > 0 {
			name, err := str(r.bud, args[0])
			if err != nil {
				return nil, err
			}
			if test = tests[name]; test == nil {
				return nil, fmt.Errorf("test %q is not supported", name)
			}
			args = args[1:]
		}
		if err := r.bud.items(len(xs)); err != nil {
			return nil, err
		}
		out := make([]any, 0, len(xs))
		for _, x := range xs {
			if err := r.bud.step(1); err != nil {
				return nil, err
			}
			y := x
			if byAttr {
				if y, err = getAttr(r.bud, x, attr); err != nil {
					return nil, err
				}
			}
			ok := truthy(y)
			if test != nil {
				if ok, err = test(r.bud, y, args); err != nil {
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
	xs, err := items(r.bud, v)
	if err != nil {
		return nil, err
	}
	var f filterFunc
	var name string
	if len(args) > 0 {
		if name, err = str(r.bud, args[0]); err != nil {
			return nil, err
		}
		f = filters[name]
	}
	if err := r.bud.items(len(xs)); err != nil {
		return nil, err
	}
	out := make([]any, len(xs))
	for i, x := range xs {
		if err := r.bud.step(1); err != nil {
			return nil, err
		}
		switch {
		case len(args) > 0:
			if f == nil { // as Jinja2, only once there is an item to map
				return nil, fmt.Errorf("filter %q is not supported", name)
			}
			if out[i], err = f(r, x, args[1:], newDict()); err != nil {
				return nil, err
			}
		default:
			a, ok := kw.get("attribute")
			if !ok {
				return nil, fmt.Errorf("map needs a filter name or attribute=")
			}
			name, err := str(r.bud, a)
			if err != nil {
				return nil, err
			}
			if out[i], err = getAttr(r.bud, x, name); err != nil {
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

func fItems(r *renderer, v any, _ []any, _ *dict) (any, error) {
	return dictItems(r.bud, v)
}

// dictItems is the items filter and dict.items(): (key, value) tuples.
func dictItems(b *budget, v any) (any, error) {
	switch d := v.(type) {
	case *dict:
		if err := b.allocN(int64(len(d.keys)), itemBytes+3*itemBytes); err != nil { // a tuple of two in an interface
			return nil, err
		}
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
		if x == math.MinInt64 {
			return nil, ErrIntOverflow
		}
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case bool:
		n, _ := integer(x)
		return n, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(v))
}

func fReverse(r *renderer, v any, _ []any, _ *dict) (any, error) {
	if s, ok := v.(string); ok {
		if err := r.bud.allocN(int64(len(s)), 4+4); err != nil { // the runes, then the string (4 bytes a rune at most)
			return nil, err
		}
		rs := []rune(s)
		slices.Reverse(rs)
		return string(rs), nil
	}
	xs, err := items(r.bud, v)
	if err == nil {
		err = r.bud.items(len(xs))
	}
	if err != nil {
		return nil, err
	}
	out := append([]any{}, xs...)
	slices.Reverse(out)
	return out, nil
}

// method is the method name of v (a string's or a dict's), nil when v has none.
func method(v any, name string) *fn {
	m := func(f func(b *budget, args []any, kw *dict) (any, error)) *fn {
		return &fn{name: typeName(v) + "." + name, call: f}
	}
	switch x := v.(type) {
	case string:
		return strMethod(x, name, m)
	case *dict:
		switch name {
		case "items":
			return m(func(b *budget, _ []any, _ *dict) (any, error) { return dictItems(b, x) })
		case "keys":
			return m(func(b *budget, _ []any, _ *dict) (any, error) { return items(b, x) })
		case "values":
			return m(func(b *budget, _ []any, _ *dict) (any, error) {
				if err := b.items(len(x.keys)); err != nil {
					return nil, err
				}
				out := make([]any, len(x.keys))
				for i, k := range x.keys {
					out[i] = x.m[k]
				}
				return out, nil
			})
		case "get":
			return m(func(b *budget, args []any, kw *dict) (any, error) {
				k, err := str(b, arg(args, kw, 0, "key", ""))
				if err == nil {
					err = b.scan(len(k)) // hashed
				}
				if err != nil {
					return nil, err
				}
				if v, ok := x.get(k); ok {
					return v, nil
				}
				return arg(args, kw, 1, "default", nil), nil
			})
		}
	}
	return nil
}

// builtStrMethods are the methods of a string strMethod builds.
var builtStrMethods = []string{"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize", "startswith", "endswith", "split", "replace", "find", "count", "join"}

// unbuiltStrMethods are the other methods of Python's str: a template
// calling one is refused with an error naming it (Jinja2 would call it),
// not handed an undefined value.
var unbuiltStrMethods = func() map[string]bool {
	m := map[string]bool{}
	for _, name := range strings.Fields(`casefold center encode expandtabs format format_map index isalnum isalpha
		isascii isdecimal isdigit isidentifier islower isnumeric isprintable isspace istitle isupper ljust
		maketrans partition removeprefix removesuffix rfind rindex rjust rpartition rsplit splitlines
		swapcase translate zfill`) {
		m[name] = true
	}
	return m
}()

func strMethod(s, name string, m func(func(*budget, []any, *dict) (any, error)) *fn) *fn {
	switch name {
	case "strip", "lstrip", "rstrip":
		return m(func(b *budget, args []any, kw *dict) (any, error) {
			return pyStrip(b, s, arg(args, kw, 0, "chars", nil), name != "rstrip", name != "lstrip")
		})
	case "upper", "lower", "title", "capitalize":
		f := map[string]func(string) string{"upper": strings.ToUpper, "lower": strings.ToLower, "title": pyTitle, "capitalize": capitalize}[name]
		return m(func(b *budget, _ []any, _ *dict) (any, error) { return caseMap(b, f, s) })
	case "startswith", "endswith":
		return m(func(b *budget, args []any, kw *dict) (any, error) {
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
				if err := b.scan(min(len(s), len(cs))); err != nil {
					return nil, err
				}
				if name == "startswith" && strings.HasPrefix(s, cs) || name == "endswith" && strings.HasSuffix(s, cs) {
					return true, nil
				}
			}
			return false, nil
		})
	case "split":
		return m(func(b *budget, args []any, kw *dict) (any, error) {
			n, _ := integer(arg(args, kw, 1, "maxsplit", int64(-1)))
			n = min(n, int64(len(s))) // no more splits than bytes
			if err := b.scan(len(s)); err != nil {
				return nil, err
			}
			var parts []string
			if sep := arg(args, kw, 0, "sep", nil); sep == nil {
				if err := b.allocN(int64(len(s))/2+1, 3*itemBytes); err != nil { // at most a part every two bytes
					return nil, err
				}
				parts = pySplitSpace(s, int(n))
			} else {
				d, err := str(b, sep)
				if err != nil {
					return nil, err
				}
				m := int64(strings.Count(s, d)) + 1
				if n >= 0 {
					m = min(m, n+1)
				}
				if err := b.allocN(m, 3*itemBytes); err != nil { // a part (a string in an interface, in a list)
					return nil, err
				}
				parts = strings.SplitN(s, d, int(m))
			}
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out, nil
		})
	case "replace":
		return m(func(b *budget, args []any, kw *dict) (any, error) { return replace(b, s, args, kw) })
	case "find", "count":
		return m(func(b *budget, args []any, kw *dict) (any, error) {
			sub, err := str(b, arg(args, kw, 0, "sub", ""))
			if err != nil {
				return nil, err
			}
			if err := b.scan(len(s)); err != nil {
				return nil, err
			}
			if name == "count" {
				return int64(strings.Count(s, sub)), nil
			}
			i := strings.Index(s, sub)
			if i < 0 {
				return int64(-1), nil
			}
			return int64(utf8.RuneCountInString(s[:i])), nil
		})
	case "join":
		return m(func(b *budget, args []any, kw *dict) (any, error) {
			return join(b, arg(args, kw, 0, "iterable", nil), s, nil)
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
