package data

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Kinds of examples: how a line or row is tokenized (its Convention
// says which fields it came from).
const (
	KindText       = iota // {"text": ...}
	KindCompletion        // {"prompt": ..., "completion": ...}
	KindChat              // a chat template's rendering: {"messages"}, ShareGPT's, Alpaca's
	kindCount
)

// example is one tokenized example: its ids and, per token, whether
// predicting it counts in the loss (the first token's bit is never used:
// nothing precedes it).
type example struct {
	ids   []int32
	train []bool
}

func (e *example) add(ids []int32, train bool) {
	e.ids = append(e.ids, ids...)
	for range ids {
		e.train = append(e.train, train)
	}
}

// targets is the number of trained targets: tokens after the first whose
// bit is set.
func (e *example) targets() int {
	n := 0
	for _, t := range e.train[min(1, len(e.train)):] {
		if t {
			n++
		}
	}
	return n
}

// encoder turns JSONL lines and table rows into examples.
type encoder struct {
	ctx    context.Context // stops a chat template's rendering; nil: nothing does
	cols   Columns         // the names of the conventions' fields
	tok    Tokenizer
	chat   *ChatTemplate
	eos    int32
	hasEOS bool
	ex     example // reused from line to line
}

func newEncoder(tok Tokenizer, chat *ChatTemplate) *encoder {
	e := &encoder{tok: tok, chat: chat}
	e.eos, e.hasEOS = tok.EOS()
	if chat == nil {
		e.chat = DefaultChatTemplate()
	} else {
		// The model's eos_token text (tokenizer_config.json) decides over
		// the tokenizer's default when the vocabulary has it.
		if s, ok := chat.vars["eos_token"].(string); ok && s != "" {
			if id, ok := tok.TokenID(s); ok {
				e.eos, e.hasEOS = id, true
			}
		}
	}
	return e
}

// line encodes one JSONL line (where names it: FILE:LINE) as the
// convention its keys hold (Columns.pick; a null key is not there) says:
// encoder.example, the mapping a table's rows take too. Keys other than
// the convention's are ignored. kind is the example's (KindText, ...).
func (e *encoder) line(b []byte, where string) (example, int, error) {
	ex, conv, err := e.lineConv(b, where)
	if err != nil {
		return ex, 0, err
	}
	return ex, conventions[conv].kind, nil
}

// lineConv is line, saying the convention.
func (e *encoder) lineConv(b []byte, where string) (example, Convention, error) {
	if err := checkText(b); err != nil {
		return example{}, 0, fmt.Errorf("%s: %w", where, err)
	}
	var r jsonRow
	if err := strictJSON(b, &r); err != nil {
		return example{}, 0, fmt.Errorf("%s: %w", where, err)
	}
	conv, err := e.cols.pick(r.has, "a line")
	if err != nil {
		return example{}, 0, fmt.Errorf("%s: %w", where, err)
	}
	ex, _, err := e.example(conv, r, where)
	return ex, conv, err
}

// parseMessages reads a conversation: a non-empty list of objects with
// string "role" and "content" (other keys kept, in order).
func parseMessages(raw []byte) ([]any, error) {
	v, err := decodeOrdered(raw)
	if err != nil {
		return nil, fmt.Errorf("\"messages\": %w", err)
	}
	return Columns(nil).turns(ConvMessages, "messages", v)
}

// utf8BOM is the UTF-8 byte-order mark that Windows tools write at the
// start of a file (Python reads it away as "utf-8-sig").
var utf8BOM = []byte("\xef\xbb\xbf")

// checkText refuses a line that is not UTF-8 (encoding/json would read
// each bad byte as U+FFFD, silently changing the example) and a
// byte-order mark past the file's start (buildJSONL drops the first
// line's).
func checkText(b []byte) error {
	if bytes.HasPrefix(b, utf8BOM) {
		return errors.New("the line begins with a UTF-8 byte-order mark (EF BB BF): only the file's first line may")
	}
	if utf8.Valid(b) {
		return nil
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return fmt.Errorf("invalid UTF-8 at byte %d of the line (%#02x): a JSONL file must be UTF-8 text", i, b[i])
		}
		i += n
	}
	return nil
}

// strictJSON decodes one JSON object from b into v, refusing anything
// after it, with errors that say what is wrong in the line's terms.
func strictJSON(b []byte, v *jsonRow) error {
	err := json.Unmarshal(b, v)
	if err == nil {
		return nil
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se) && strings.Contains(se.Error(), "after top-level value"):
		return fmt.Errorf("invalid JSON: more after the object at byte %d", se.Offset-1)
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON at byte %d: %v", se.Offset, err)
	case errors.As(err, &te) && te.Field != "":
		return fmt.Errorf("%q must be a string, not a JSON %s", te.Field, te.Value)
	case errors.As(err, &te):
		return fmt.Errorf("a line must be a JSON object, not a JSON %s", te.Value)
	}
	return fmt.Errorf("invalid JSON: %v", err)
}

// decodeOrdered decodes JSON into data's values: objects as
// ordered *object, integers as int64, other numbers as float64 (a small
// recursive-descent parser: encoding/json's token stream was a fifth of
// the time of a chat line).
func decodeOrdered(raw []byte) (any, error) {
	p := &jsonParser{b: raw}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	if p.skip(); p.i < len(p.b) {
		return nil, fmt.Errorf("invalid JSON at byte %d: more after the value", p.i)
	}
	return v, nil
}

type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) skip() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("invalid JSON at byte %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) value(depth int) (any, error) {
	if depth > 1000 {
		return nil, p.errorf("nested more than 1000 deep")
	}
	p.skip()
	if p.i >= len(p.b) {
		return nil, p.errorf("unexpected end")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		d := newObject()
		for first := true; ; first = false {
			p.skip()
			if p.i < len(p.b) && p.b[p.i] == '}' && first {
				p.i++
				return d, nil
			}
			k, err := p.value(depth + 1)
			ks, ok := k.(string)
			if err != nil || !ok {
				return nil, p.errorf("expected a string key")
			}
			if p.skip(); p.i >= len(p.b) || p.b[p.i] != ':' {
				return nil, p.errorf("expected :")
			}
			p.i++
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			d.set(ks, v)
			if p.skip(); p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == '}' {
				p.i++
				return d, nil
			}
			return nil, p.errorf("expected , or }")
		}
	case c == '[':
		p.i++
		out := []any{}
		for first := true; ; first = false {
			p.skip()
			if p.i < len(p.b) && p.b[p.i] == ']' && first {
				p.i++
				return out, nil
			}
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			if p.skip(); p.i < len(p.b) && p.b[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.b) && p.b[p.i] == ']' {
				p.i++
				return out, nil
			}
			return nil, p.errorf("expected , or ]")
		}
	case c == '"':
		return p.str()
	case c == 't' && bytes.HasPrefix(p.b[p.i:], []byte("true")):
		p.i += 4
		return true, nil
	case c == 'f' && bytes.HasPrefix(p.b[p.i:], []byte("false")):
		p.i += 5
		return false, nil
	case c == 'n' && bytes.HasPrefix(p.b[p.i:], []byte("null")):
		p.i += 4
		return nil, nil
	case c == '-' || c >= '0' && c <= '9':
		j := p.i
		for p.i < len(p.b) && strings.IndexByte("+-0123456789.eE", p.b[p.i]) >= 0 {
			p.i++
		}
		num := string(p.b[j:p.i])
		if !strings.ContainsAny(num, ".eE") {
			if n, err := strconv.ParseInt(num, 10, 64); err == nil {
				return n, nil
			}
		}
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return nil, p.errorf("bad number %q", num)
		}
		return f, nil
	}
	return nil, p.errorf("unexpected %q", p.b[p.i])
}

// str reads a JSON string (invalid UTF-8 becomes U+FFFD, as encoding/json
// does; a data file's line is refused before, checkText).
func (p *jsonParser) str() (string, error) {
	p.i++ // "
	j := p.i
	for p.i < len(p.b) && p.b[p.i] != '"' && p.b[p.i] != '\\' && p.b[p.i] >= 0x20 && p.b[p.i] < utf8.RuneSelf {
		p.i++
	}
	if p.i < len(p.b) && p.b[p.i] == '"' { // plain ASCII: no copy of escapes
		s := string(p.b[j:p.i])
		p.i++
		return s, nil
	}
	var sb strings.Builder
	sb.Write(p.b[j:p.i])
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return sb.String(), nil
		case c == '\\':
			if p.i+1 >= len(p.b) {
				return "", p.errorf("unterminated escape")
			}
			e := p.b[p.i+1]
			p.i += 2
			switch e {
			case '"', '\\', '/':
				sb.WriteByte(e)
			case 'b':
				sb.WriteByte('\b')
			case 'f':
				sb.WriteByte('\f')
			case 'n':
				sb.WriteByte('\n')
			case 'r':
				sb.WriteByte('\r')
			case 't':
				sb.WriteByte('\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return "", p.errorf("bad \\u escape")
				}
				if utf16.IsSurrogate(r) {
					r2 := rune(-1)
					if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
						save := p.i
						p.i += 2
						if r2, ok = p.hex4(); !ok {
							p.i = save
						}
					}
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						r = d
					} else {
						r = utf8.RuneError
						if r2 >= 0 {
							p.i -= 6 // the second escape is a character of its own
						}
					}
				}
				sb.WriteRune(r)
			default:
				return "", p.errorf("bad escape \\%c", e)
			}
		case c < 0x20:
			return "", p.errorf("control character in a string")
		case c < utf8.RuneSelf:
			sb.WriteByte(c)
			p.i++
		default:
			r, n := utf8.DecodeRune(p.b[p.i:])
			sb.WriteRune(r)
			p.i += n
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *jsonParser) hex4() (rune, bool) {
	if p.i+4 > len(p.b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.b[p.i:p.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(n), true
}

// jsonType names a decoded JSON value's type.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case int64, float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "list"
	case *object:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
