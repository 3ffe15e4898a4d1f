package data

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
		name string
		call func(args []any, kw *dict) (any, error)
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

// errUndefined is an error of a template using an undefined value.
var errUndefined = errors.New("undefined")

func (u undef) use() error {
	return fmt.Errorf("%w: %s", errUndefined, u.desc)
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
func items(v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case tuple:
		return x, nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case *dict:
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
func length(v any) (int64, error) {
	switch x := v.(type) {
	case string:
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

// equal is Python's ==.
func equal(a, b any) bool {
	if x, ok := number(a); ok {
		if y, ok := number(b); ok {
			return x == y
		}
		return false
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case undef:
		_, ok := b.(undef)
		return ok
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		return ok && slices.EqualFunc(x, y, equal)
	case tuple:
		y, ok := b.(tuple)
		return ok && slices.EqualFunc(x, y, equal)
	case *dict:
		y, ok := b.(*dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false
		}
		for k, v := range x.m {
			if w, ok := y.m[k]; !ok || !equal(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

// compare is Python's ordering of two numbers, strings or sequences: -1, 0, 1.
func compare(a, b any) (int, error) {
	if x, ok := number(a); ok {
		if y, ok := number(b); ok {
			switch {
			case x < y:
				return -1, nil
			case x > y:
				return 1, nil
			}
			return 0, nil
		}
	}
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			return strings.Compare(x, y), nil
		}
	}
	xs, okx := a.([]any)
	ys, oky := b.([]any)
	if okx && oky {
		for i := 0; i < len(xs) && i < len(ys); i++ {
			if !equal(xs[i], ys[i]) {
				return compare(xs[i], ys[i])
			}
		}
		return compare(int64(len(xs)), int64(len(ys)))
	}
	return 0, fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

// contains is Python's a in b.
func contains(b, a any) (bool, error) {
	switch x := b.(type) {
	case string:
		s, ok := a.(string)
		if !ok {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(a))
		}
		return strings.Contains(x, s), nil
	case *dict:
		k, ok := a.(string)
		if !ok {
			return false, nil
		}
		_, in := x.m[k]
		return in, nil
	case undef:
		return false, nil
	}
	xs, err := items(b)
	if err != nil {
		return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(b))
	}
	return slices.ContainsFunc(xs, func(y any) bool { return equal(a, y) }), nil
}

// str is Python's str(v) (Jinja prints it; Undefined prints as "").
func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case undef:
		return ""
	}
	return repr(v)
}

// repr is Python's repr(v).
func repr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case undef:
		return ""
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	case string:
		return pyQuote(x)
	case []any:
		return "[" + joinRepr(x) + "]"
	case tuple:
		if len(x) == 1 {
			return "(" + repr(x[0]) + ",)"
		}
		return "(" + joinRepr(x) + ")"
	case *dict:
		parts := make([]string, len(x.keys))
		for i, k := range x.keys {
			parts[i] = pyQuote(k) + ": " + repr(x.m[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case *namespace:
		return "<Namespace " + repr(x.d) + ">"
	case *fn:
		return "<function " + x.name + ">"
	}
	return fmt.Sprint(v)
}

func joinRepr(xs []any) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = repr(x)
	}
	return strings.Join(parts, ", ")
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

// pyQuote is Python's repr of a string: single quotes unless the string
// holds a single quote and no double quote.
func pyQuote(s string) string {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// toJSON is Hugging Face's tojson filter: Python's json.dumps with
// ensure_ascii false by default, indent, separators and sort_keys.
func toJSON(b *strings.Builder, v any, indent int, itemSep, keySep string, sortKeys, ascii bool, depth int) error {
	nl := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	if indent > maxRenderBytes/(depth+1) || b.Len() > maxRenderBytes {
		return fmt.Errorf("tojson: more than %d bytes", maxRenderBytes)
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[x])
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
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
		b.WriteString(s)
	case string:
		jsonString(b, x, ascii)
	case []any, tuple:
		xs, _ := items(x)
		if len(xs) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, y := range xs {
			if i > 0 {
				b.WriteString(itemSep)
			}
			nl(depth + 1)
			if err := toJSON(b, y, indent, itemSep, keySep, sortKeys, ascii, depth+1); err != nil {
				return err
			}
		}
		nl(depth)
		b.WriteByte(']')
	case *dict:
		if len(x.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := x.keys
		if sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(itemSep)
			}
			nl(depth + 1)
			jsonString(b, k, ascii)
			b.WriteString(keySep)
			if err := toJSON(b, x.m[k], indent, itemSep, keySep, sortKeys, ascii, depth+1); err != nil {
				return err
			}
		}
		nl(depth)
		b.WriteByte('}')
	default:
		return fmt.Errorf("object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// jsonString writes s as Python's json module does.
func jsonString(b *strings.Builder, s string, ascii bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r > 0x7f && r <= 0xffff:
				fmt.Fprintf(b, `\u%04x`, r)
			case ascii && r > 0xffff:
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
