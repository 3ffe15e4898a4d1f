package jinja

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The values of the chat-template interpreter and their Python semantics
// (Jinja evaluates Python objects): nil is None, undef is Jinja's
// Undefined, bool, int64, float64, string, []any (a list), tuple, *dict
// (ordered, string keys, as JSON objects and Python dicts keep their
// insertion order), *namespace, *loopInfo, and fn (a callable).

type (
	undef struct{ desc string } // what was looked up, for the error when it is used
	tuple []any
	dict  struct {
		keys []string
		m    map[string]any
	}
	namespace struct{ d *dict }
	fn        struct {
		name  string
		call  func(b *budget, args []any, kw *dict) (any, error) // b: the rendering's budget
		macro bool                                               // a {% macro %}: printed as Jinja2 prints one
	}
)

func newDict() *dict { return &dict{m: map[string]any{}} }

func (d *dict) set(k string, v any) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

func (d *dict) get(k string) (any, bool) {
	v, ok := d.m[k]
	return v, ok
}

// ErrUndefined is the error of a template using an undefined value (a
// missing key or variable, where Jinja2 raises UndefinedError).
var ErrUndefined = errors.New("undefined")

func (u undef) use() error {
	return fmt.Errorf("%w: %s", ErrUndefined, u.desc)
}

// typeName is Python's name of v's type.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case undef:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case tuple:
		return "tuple"
	case *dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case *loopInfo:
		return "LoopContext"
	case *fn:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

// truthy is Python's bool(v).
func truthy(v any) bool {
	switch x := v.(type) {
	case nil, undef:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case tuple:
		return len(x) > 0
	case *dict:
		return len(x.keys) > 0
	}
	return true
}

// number returns v as a float64 and whether it is a number (bool counts,
// as in Python).
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// integer returns v as an int64 when it is an int or a bool.
func integer(v any) (int64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return x, true
	}
	return 0, false
}

// items returns the elements of a sequence (list, tuple, string's
// characters, dict's keys); Undefined iterates as empty, as in Jinja.
// A list or tuple is returned as it is (not to be changed).
func items(b *budget, v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case tuple:
		return x, nil
	case string:
		// Each character a string in an interface: about 40 bytes.
		if err := b.allocN(int64(len(x)), 40); err != nil {
			return nil, err
		}
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case *dict:
		if err := b.items(len(x.keys)); err != nil {
			return nil, err
		}
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case undef:
		return nil, nil
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

// length is Python's len(v); Undefined has length 0, as in Jinja.
func length(b *budget, v any) (int64, error) {
	switch x := v.(type) {
	case string:
		if err := b.walk(len(x)); err != nil {
			return 0, err
		}
		return int64(utf8.RuneCountInString(x)), nil
	case []any:
		return int64(len(x)), nil
	case tuple:
		return int64(len(x)), nil
	case *dict:
		return int64(len(x.keys)), nil
	case undef:
		return 0, nil
	}
	return 0, fmt.Errorf("object of type '%s' has no len()", typeName(v))
}

// nest counts a level of a value visited in another (a list in a list);
// done undoes it. Values nested past maxExprDepth are an error, as
// Python's recursion limit makes them one (a namespace holding itself is
// one such).
func (b *budget) nest() error {
	if b.depth++; b.depth > maxExprDepth {
		b.depth--
		return fmt.Errorf("values nested more than %d deep", maxExprDepth)
	}
	return b.step(1)
}

func (b *budget) done() { b.depth-- }

// equal is Python's ==.
func equal(b *budget, x, y any) (bool, error) {
	if err := b.nest(); err != nil {
		return false, err
	}
	eq, err := equalIn(b, x, y)
	b.done()
	return eq, err
}

func equalIn(b *budget, x, y any) (bool, error) {
	if x, ok := number(x); ok {
		if y, ok := number(y); ok {
			return x == y, nil
		}
		return false, nil
	}
	switch x := x.(type) {
	case nil:
		return y == nil, nil
	case undef:
		_, ok := y.(undef)
		return ok, nil
	case string:
		y, ok := y.(string)
		if !ok || len(x) != len(y) {
			return false, nil
		}
		return x == y, b.scan(len(x))
	case []any:
		if y, ok := y.([]any); ok {
			return seqEqual(b, x, y)
		}
		return false, nil
	case tuple:
		if y, ok := y.(tuple); ok {
			return seqEqual(b, x, y)
		}
		return false, nil
	case *dict:
		y, ok := y.(*dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false, nil
		}
		for k, v := range x.m {
			w, ok := y.m[k]
			if !ok {
				return false, nil
			}
			if eq, err := equal(b, v, w); !eq || err != nil {
				return false, err
			}
		}
		return true, nil
	}
	return x == y, nil
}

// seqEqual is whether xs and ys are equal item by item.
func seqEqual(b *budget, xs, ys []any) (bool, error) {
	if len(xs) != len(ys) {
		return false, nil
	}
	for i := range xs {
		if eq, err := equal(b, xs[i], ys[i]); !eq || err != nil {
			return false, err
		}
	}
	return true, nil
}

// compare is Python's ordering of two numbers, strings or lists: -1, 0, 1.
func compare(b *budget, x, y any) (int, error) {
	if err := b.nest(); err != nil {
		return 0, err
	}
	c, err := compareIn(b, x, y)
	b.done()
	return c, err
}

func compareIn(b *budget, x, y any) (int, error) {
	if x, ok := number(x); ok {
		if y, ok := number(y); ok {
			switch {
			case x < y:
				return -1, nil
			case x > y:
				return 1, nil
			}
			return 0, nil
		}
	}
	if x, ok := x.(string); ok {
		if y, ok := y.(string); ok {
			return strings.Compare(x, y), b.scan(min(len(x), len(y)))
		}
	}
	xs, okx := x.([]any)
	ys, oky := y.([]any)
	if okx && oky {
		for i := 0; i < len(xs) && i < len(ys); i++ {
			eq, err := equal(b, xs[i], ys[i])
			if err != nil {
				return 0, err
			}
			if !eq {
				return compare(b, xs[i], ys[i])
			}
		}
		return compare(b, int64(len(xs)), int64(len(ys)))
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(x), typeName(y))
}

// contains is Python's a in c.
func contains(b *budget, c, a any) (bool, error) {
	switch x := c.(type) {
	case string:
		s, ok := a.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(a))
		}
		return strings.Contains(x, s), b.scan(len(x))
	case *dict:
		k, ok := a.(string)
		if !ok {
			return false, nil
		}
		_, in := x.m[k]
		return in, b.scan(len(k)) // hashed
	case undef:
		return false, nil
	}
	xs, err := items(b, c)
	if err != nil {
		if errors.Is(err, ErrBudget) {
			return false, err
		}
		return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(c))
	}
	for _, y := range xs {
		if eq, err := equal(b, a, y); eq || err != nil {
			return eq, err
		}
	}
	return false, nil
}

// str is Python's str(v) (Jinja prints it; Undefined prints as ""),
// built within b.
func str(b *budget, v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case undef:
		return "", nil
	}
	t := &text{bud: b}
	if err := reprTo(t, v); err != nil {
		return "", err
	}
	return t.String(), nil
}

// repr is Python's repr(v), built within b.
func repr(b *budget, v any) (string, error) {
	t := &text{bud: b}
	if err := reprTo(t, v); err != nil {
		return "", err
	}
	return t.String(), nil
}

// reprTo writes Python's repr(v) to t.
func reprTo(t *text, v any) error {
	if err := t.bud.nest(); err != nil {
		return err
	}
	err := reprIn(t, v)
	t.bud.done()
	return err
}

func reprIn(t *text, v any) error {
	switch x := v.(type) {
	case nil:
		return t.add("None")
	case undef:
		return nil
	case bool:
		if x {
			return t.add("True")
		}
		return t.add("False")
	case int64:
		return t.add(strconv.FormatInt(x, 10))
	case float64:
		return t.add(pyFloat(x))
	case string:
		return pyQuote(t, x)
	case []any:
		return reprSeq(t, "[", x, "]")
	case tuple:
		if len(x) == 1 {
			return reprSeq(t, "(", x, ",)")
		}
		return reprSeq(t, "(", x, ")")
	case *dict:
		if err := t.add("{"); err != nil {
			return err
		}
		for i, k := range x.keys {
			if i > 0 {
				if err := t.add(", "); err != nil {
					return err
				}
			}
			if err := pyQuote(t, k); err != nil {
				return err
			}
			if err := t.add(": "); err != nil {
				return err
			}
			if err := reprTo(t, x.m[k]); err != nil {
				return err
			}
		}
		return t.add("}")
	case *namespace:
		if err := t.add("<Namespace "); err != nil {
			return err
		}
		if err := reprTo(t, x.d); err != nil {
			return err
		}
		return t.add(">")
	case *fn:
		if x.macro {
			return t.add("<Macro '" + x.name + "'>")
		}
		return t.add("<function " + x.name + ">")
	}
	return t.add(fmt.Sprint(v))
}

func reprSeq(t *text, open string, xs []any, end string) error {
	if err := t.add(open); err != nil {
		return err
	}
	for i, x := range xs {
		if i > 0 {
			if err := t.add(", "); err != nil {
				return err
			}
		}
		if err := reprTo(t, x); err != nil {
			return err
		}
	}
	return t.add(end)
}

// pyFloat is Python's repr of a float: the shortest digits that round-trip,
// fixed notation for exponents -4 .. 15 (always with a decimal point),
// else d.ddde+XX.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	mant, expS, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expS)
	neg := strings.HasPrefix(mant, "-")
	digits := strings.Replace(strings.TrimPrefix(mant, "-"), ".", "", 1)
	sign := ""
	if neg {
		sign = "-"
	}
	if exp < -4 || exp >= 16 {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		es := fmt.Sprintf("%+03d", exp)
		return sign + m + "e" + es
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// pyQuote writes Python's repr of a string: single quotes unless the
// string holds a single quote and no double quote.
func pyQuote(t *text, s string) error {
	if err := t.bud.scan(len(s)); err != nil {
		return err
	}
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		q = '"'
	}
	return writeQuoted(t, s, q, func(r rune) string {
		switch {
		case r == rune(q) || r == '\\':
			return "\\" + string(r)
		case r == '\n':
			return `\n`
		case r == '\r':
			return `\r`
		case r == '\t':
			return `\t`
		case r < 0x20 || r == 0x7f:
			return fmt.Sprintf(`\x%02x`, r)
		}
		return ""
	})
}

// writeQuoted writes s between quotes q: a character that esc gives an
// escape for (one of q, \\, a control character or any non-ASCII one may
// have one) as its escape, a byte that is not UTF-8 as U+FFFD (as Python
// decodes it), and the runs between them copied whole.
func writeQuoted(t *text, s string, q byte, esc func(rune) string) error {
	if err := t.bud.alloc(int64(len(s)) + 2); err != nil { // escapes charged as they come
		return err
	}
	t.reserve(len(s) + 2)
	t.writeByte(q)
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f && s[i] != q && s[i] != '\\' {
			i++
		}
		t.writeString(s[:i])
		if s = s[i:]; s == "" {
			break
		}
		r, size := utf8.DecodeRuneInString(s)
		e := esc(r)
		if e == "" && r == utf8.RuneError && size == 1 {
			e = string(utf8.RuneError)
		}
		if e == "" {
			e = s[:size]
		} else {
			if err := t.bud.alloc(int64(len(e) - size)); err != nil {
				return err
			}
			t.reserve(len(e))
		}
		t.writeString(e)
		s = s[size:]
	}
	t.writeByte(q)
	return nil
}

// jsonOpts are the options of Hugging Face's tojson filter.
type jsonOpts struct {
	indent          int // < 0: none
	itemSep, keySep string
	sortKeys, ascii bool
}

// toJSON is Hugging Face's tojson filter: Python's json.dumps with
// ensure_ascii false by default, indent, separators and sort_keys.
func toJSON(t *text, v any, o *jsonOpts, depth int) error {
	if err := t.bud.nest(); err != nil {
		return err
	}
	err := toJSONIn(t, v, o, depth)
	t.bud.done()
	return err
}

func toJSONIn(t *text, v any, o *jsonOpts, depth int) error {
	nl := func(d int) error {
		if o.indent < 0 {
			return nil
		}
		if err := t.bud.allocN(int64(o.indent), int64(d)); err != nil {
			return err
		}
		t.reserve(o.indent*d + 1)
		t.writeByte('\n') // the newline rides on the indent's charge
		t.writeString(strings.Repeat(" ", o.indent*d))
		return nil
	}
	switch x := v.(type) {
	case nil:
		return t.add("null")
	case bool:
		return t.add(map[bool]string{true: "true", false: "false"}[x])
	case int64:
		return t.add(strconv.FormatInt(x, 10))
	case float64:
		s := pyFloat(x)
		switch s {
		case "inf":
			s = "Infinity"
		case "-inf":
			s = "-Infinity"
		case "nan":
			s = "NaN"
		}
		return t.add(s)
	case string:
		return jsonString(t, x, o.ascii)
	case []any, tuple:
		xs, _ := items(t.bud, x)
		if len(xs) == 0 {
			return t.add("[]")
		}
		if err := t.add("["); err != nil {
			return err
		}
		for i, y := range xs {
			if i > 0 {
				if err := t.add(o.itemSep); err != nil {
					return err
				}
			}
			if err := nl(depth + 1); err != nil {
				return err
			}
			if err := toJSON(t, y, o, depth+1); err != nil {
				return err
			}
		}
		if err := nl(depth); err != nil {
			return err
		}
		return t.add("]")
	case *dict:
		if len(x.keys) == 0 {
			return t.add("{}")
		}
		keys := x.keys
		if o.sortKeys {
			if err := t.bud.allocN(int64(len(keys)), 16); err != nil {
				return err
			}
			keys = slices.Sorted(slices.Values(keys))
		}
		if err := t.add("{"); err != nil {
			return err
		}
		for i, k := range keys {
			if i > 0 {
				if err := t.add(o.itemSep); err != nil {
					return err
				}
			}
			if err := nl(depth + 1); err != nil {
				return err
			}
			if err := jsonString(t, k, o.ascii); err != nil {
				return err
			}
			if err := t.add(o.keySep); err != nil {
				return err
			}
			if err := toJSON(t, x.m[k], o, depth+1); err != nil {
				return err
			}
		}
		if err := nl(depth); err != nil {
			return err
		}
		return t.add("}")
	}
	return fmt.Errorf("object of type %s is not JSON serializable", typeName(v))
}

// jsonString writes s as Python's json module does.
func jsonString(t *text, s string, ascii bool) error {
	if err := t.bud.scan(len(s)); err != nil {
		return err
	}
	return writeQuoted(t, s, '"', func(r rune) string {
		switch r {
		case '"':
			return `\"`
		case '\\':
			return `\\`
		case '\n':
			return `\n`
		case '\r':
			return `\r`
		case '\t':
			return `\t`
		case '\b':
			return `\b`
		case '\f':
			return `\f`
		}
		switch {
		case r < 0x20:
			return fmt.Sprintf(`\u%04x`, r)
		case ascii && r >= 0x7f && r <= 0xffff: // Python escapes all but space to ~
			return fmt.Sprintf(`\u%04x`, r)
		case ascii && r > 0xffff:
			r -= 0x10000
			return fmt.Sprintf(`\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		}
		return ""
	})
}
