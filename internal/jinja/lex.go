package jinja

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer of the chat-template interpreter: Jinja's, with the options
// Hugging Face renders chat templates with (trim_blocks, lstrip_blocks):
// the first newline after a block or comment tag is dropped, spaces and
// tabs from the start of a line to a block or comment tag are dropped,
// "{%-" / "-%}" (and for {{ }} and {# #}) strip all whitespace on that
// side, "{%+" / "+%}" keep it. Line breaks are normalised to "\n" and one
// trailing newline of the template is dropped, as Jinja does.

// tmplItem is a piece of a template: text, an output tag {{ }} or a block
// tag {% %} with its expression tokens.
type tmplItem struct {
	kind   byte // 't' text, 'v' {{ }}, 'b' {% %}
	text   string
	toks   []tok
	lineNo int
}

// tok is one token inside a tag.
type tok struct {
	kind byte // 'n' name, 's' string, 'i' integer, 'f' float, 'o' operator
	s    string
}

func (t tok) String() string {
	if t.kind == 's' {
		return fmt.Sprintf("%q", t.s)
	}
	return t.s
}

// lexTemplate splits a template into items.
func lexTemplate(src string) ([]tmplItem, error) {
	src = strings.ReplaceAll(strings.ReplaceAll(src, "\r\n", "\n"), "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	var items []tmplItem
	pos, line := 0, 1
	lineStarting := true
	emit := func(text string) {
		if text != "" {
			items = append(items, tmplItem{kind: 't', text: text, lineNo: line})
		}
		line += strings.Count(text, "\n")
	}
	for {
		i := nextTag(src, pos)
		if i < 0 {
			emit(src[pos:])
			return items, nil
		}
		kind := src[i+1]
		text := src[pos:i]
		p := i + 2
		sign := byte(0)
		if p < len(src) && (src[p] == '-' || src[p] == '+') {
			sign = src[p]
			p++
		}
		switch {
		case sign == '-':
			stripped := strings.TrimRightFunc(text, unicode.IsSpace)
			emit(stripped)
			line += strings.Count(text[len(stripped):], "\n")
		case sign != '+' && kind != '{':
			// lstrip_blocks: only whitespace from the line's start to the tag.
			l := strings.LastIndexByte(text, '\n') + 1
			if (l > 0 || lineStarting) && l < len(text) && strings.TrimFunc(text[l:], unicode.IsSpace) == "" {
				emit(text[:l])
				line += strings.Count(text[l:], "\n")
			} else {
				emit(text)
			}
		default:
			emit(text)
		}
		tagLine := line
		var q int
		var err error
		switch kind {
		case '#':
			q, err = lexComment(src, p)
		default:
			var toks []tok
			toks, q, err = lexTag(src, p, kind)
			if err == nil {
				k := byte('b')
				if kind == '{' {
					k = 'v'
				}
				items = append(items, tmplItem{kind: k, toks: toks, lineNo: tagLine})
			}
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", tagLine, err)
		}
		line += strings.Count(src[i:q], "\n")
		lineStarting = q > 0 && src[q-1] == '\n'
		pos = q
	}
}

// nextTag is the index of the next "{{", "{%" or "{#" at or after pos, -1
// when none.
func nextTag(src string, pos int) int {
	for i := pos; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return -1
}

// tagEnd is the position after a block or comment end at src[q:]
// ("-%}" strips the whitespace after it; "%}" drops one newline after it;
// "+%}" keeps it), with the close string given.
func tagEnd(src string, q int, sign byte, closeLen int, trim bool) int {
	q += closeLen
	switch {
	case sign == '-':
		q = skipSpace(src, q)
	case sign != '+' && trim && q < len(src) && src[q] == '\n':
		q++
	}
	return q
}

// skipSpace is the position of the first non-space rune at or after p.
func skipSpace(src string, p int) int {
	for p < len(src) {
		r, n := utf8.DecodeRuneInString(src[p:])
		if !unicode.IsSpace(r) {
			break
		}
		p += n
	}
	return p
}

// lexComment skips a comment from p (after "{#" and its sign) and returns
// the position after it.
func lexComment(src string, p int) (int, error) {
	end := strings.Index(src[p:], "#}")
	if end < 0 {
		return 0, fmt.Errorf("comment {# without #}")
	}
	end += p
	sign := byte(0)
	if end > p && (src[end-1] == '-' || src[end-1] == '+') {
		sign = src[end-1]
	}
	return tagEnd(src, end, sign, 2, true), nil
}

// lexTag reads the tokens of a {{ }} (kind '{') or {% %} tag from p up to
// its end, and returns them and the position after the end.
func lexTag(src string, p int, kind byte) ([]tok, int, error) {
	var toks []tok
	depth := 0
	for {
		p = skipSpace(src, p)
		if p >= len(src) {
			return nil, 0, fmt.Errorf("tag not closed")
		}
		if depth == 0 {
			if kind == '{' {
				if strings.HasPrefix(src[p:], "-}}") {
					return toks, tagEnd(src, p+1, '-', 2, false), nil
				}
				if strings.HasPrefix(src[p:], "}}") {
					return toks, p + 2, nil
				}
			} else {
				for _, s := range []byte{'-', '+', 0} {
					end := "%}"
					if s != 0 {
						end = string(s) + end
					}
					if strings.HasPrefix(src[p:], end) {
						return toks, tagEnd(src, p+len(end)-2, s, 2, true), nil
					}
				}
			}
		}
		t, n, err := lexToken(src[p:])
		if err != nil {
			return nil, 0, err
		}
		if t.kind == 'o' {
			switch t.s {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
				if depth < 0 {
					return nil, 0, fmt.Errorf("unexpected %q", t.s)
				}
			}
		}
		toks = append(toks, t)
		p += n
	}
}

// lexToken reads one token at the start of s and returns it and its length.
func lexToken(s string) (tok, int, error) {
	c := s[0]
	switch {
	case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		n := 1
		for n < len(s) && (s[n] == '_' || s[n] >= 'a' && s[n] <= 'z' || s[n] >= 'A' && s[n] <= 'Z' || s[n] >= '0' && s[n] <= '9') {
			n++
		}
		return tok{'n', s[:n]}, n, nil
	case c >= '0' && c <= '9':
		n := 0
		for n < len(s) && (s[n] >= '0' && s[n] <= '9' || s[n] == '_') {
			n++
		}
		kind := byte('i')
		if n+1 < len(s) && s[n] == '.' && s[n+1] >= '0' && s[n+1] <= '9' {
			kind = 'f'
			n++
			for n < len(s) && (s[n] >= '0' && s[n] <= '9' || s[n] == '_') {
				n++
			}
		}
		if n < len(s) && (s[n] == 'e' || s[n] == 'E') {
			m := n + 1
			if m < len(s) && (s[m] == '+' || s[m] == '-') {
				m++
			}
			if m < len(s) && s[m] >= '0' && s[m] <= '9' {
				kind = 'f'
				for n = m; n < len(s) && s[n] >= '0' && s[n] <= '9'; n++ {
				}
			}
		}
		return tok{kind, strings.ReplaceAll(s[:n], "_", "")}, n, nil
	case c == '\'' || c == '"':
		return lexString(s)
	}
	for _, op := range []string{"//", "**", "==", "!=", ">=", "<="} {
		if strings.HasPrefix(s, op) {
			return tok{'o', op}, 2, nil
		}
	}
	if strings.IndexByte("+-*/%~<>=()[]{},.:|", c) >= 0 {
		return tok{'o', s[:1]}, 1, nil
	}
	return tok{}, 0, fmt.Errorf("unexpected character %q", c)
}

// lexString reads a quoted string literal with Python's backslash escapes.
func lexString(s string) (tok, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return tok{'s', b.String()}, i + 1, nil
		case c != '\\':
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '\\', '\'', '"':
			b.WriteByte(e)
		case '\n':
			// a backslash-newline continues the line
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0':
			b.WriteByte(0)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return tok{}, 0, fmt.Errorf("truncated \\%c escape in a string", e)
			}
			var r rune
			for _, h := range s[i+1 : i+1+n] {
				d := strings.IndexRune("0123456789abcdef", unicode.ToLower(h))
				if d < 0 {
					return tok{}, 0, fmt.Errorf("bad \\%c escape in a string", e)
				}
				r = r*16 + rune(d)
			}
			b.WriteRune(r)
			i += n
		default:
			b.WriteByte('\\') // Python keeps an unknown escape as written
			b.WriteByte(e)
		}
	}
	return tok{}, 0, fmt.Errorf("string not closed")
}
