package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Kinds of JSONL lines.
const (
	KindText       = iota // {"text": ...}
	KindCompletion        // {"prompt": ..., "completion": ...}
	KindChat              // {"messages": [{"role": ..., "content": ...}, ...]}
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

// encoder turns JSONL lines into examples.
type encoder struct {
	tok    Tokenizer
	chat   *ChatTemplate
	eos    int32
	hasEOS bool
	ex     example // reused from line to line
}

func newEncoder(tok Tokenizer, chat *ChatTemplate) *encoder {
	e := &encoder{tok: tok, chat: chat}
	e.eos, e.hasEOS = tok.EOS()
	if chat != nil {
		// The model's eos_token text (tokenizer_config.json) decides over
		// the tokenizer's default when the vocabulary has it.
		if s, ok := chat.vars["eos_token"].(string); ok && s != "" {
			if id, ok := tok.SpecialID(s); ok {
				e.eos, e.hasEOS = id, true
			}
		}
	}
	return e
}

// record is a JSONL line's known keys.
type record struct {
	Text       *string         `json:"text"`
	Prompt     *string         `json:"prompt"`
	Completion *string         `json:"completion"`
	Messages   json.RawMessage `json:"messages"`
}

// line encodes one JSONL line (where names it: FILE:LINE). The text of
// {"text"} is tokenized with the tokenizer's special tokens added and
// trained whole; {"prompt", "completion"}: the prompt with them, not
// trained, then the completion without them, trained; {"messages"}: the
// chat template's rendering, the assistant's parts trained. Each ends
// with EOS (trained) when the tokenizer has one and the chat template
// did not end it so. Keys other than these are ignored.
func (e *encoder) line(b []byte, where string) (example, int, error) {
	var r record
	if err := strictJSON(b, &r); err != nil {
		return example{}, 0, fmt.Errorf("%s: %w", where, err)
	}
	ex := example{ids: e.ex.ids[:0], train: e.ex.train[:0]}
	defer func() { e.ex = ex }()
	kind := -1
	have := 0
	if r.Text != nil {
		kind, have = KindText, have+1
	}
	if r.Prompt != nil || r.Completion != nil {
		kind, have = KindCompletion, have+1
	}
	if r.Messages != nil && string(r.Messages) != "null" {
		kind, have = KindChat, have+1
	}
	switch {
	case have == 0:
		return ex, 0, fmt.Errorf("%s: a line needs \"text\", \"prompt\" and \"completion\", or \"messages\"", where)
	case have > 1:
		return ex, 0, fmt.Errorf("%s: a line holds one of \"text\", \"prompt\"/\"completion\" or \"messages\", not several", where)
	}
	switch kind {
	case KindText:
		ids, err := encode(e.tok, *r.Text, true, where)
		if err != nil {
			return ex, 0, err
		}
		ex.add(ids, true)
	case KindCompletion:
		if r.Prompt == nil || r.Completion == nil {
			return ex, 0, fmt.Errorf("%s: \"prompt\" and \"completion\" go together; this line has only one of them", where)
		}
		p, err := encode(e.tok, *r.Prompt, true, where+": prompt")
		if err != nil {
			return ex, 0, err
		}
		c, err := encode(e.tok, *r.Completion, false, where+": completion")
		if err != nil {
			return ex, 0, err
		}
		ex.add(p, false)
		ex.add(c, true)
	case KindChat:
		if err := e.chatLine(&ex, r.Messages, where); err != nil {
			return ex, 0, err
		}
	}
	if e.hasEOS && len(ex.ids) > 0 && ex.ids[len(ex.ids)-1] != e.eos && kind != KindChat {
		ex.add([]int32{e.eos}, true)
	}
	return ex, kind, nil
}

// chatLine renders and tokenizes a conversation.
func (e *encoder) chatLine(ex *example, raw json.RawMessage, where string) error {
	v, err := decodeOrdered(raw)
	if err != nil {
		return fmt.Errorf("%s: \"messages\": %w", where, err)
	}
	msgs, ok := v.([]any)
	if !ok || len(msgs) == 0 {
		return fmt.Errorf("%s: \"messages\" must be a non-empty list of {\"role\", \"content\"} objects", where)
	}
	for i, m := range msgs {
		d, ok := m.(*dict)
		if !ok {
			return fmt.Errorf("%s: message %d is a %s, not an object with \"role\" and \"content\"", where, i+1, jsonType(m))
		}
		for _, k := range []string{"role", "content"} {
			x, ok := d.get(k)
			if !ok {
				return fmt.Errorf("%s: message %d has no %q", where, i+1, k)
			}
			if _, ok := x.(string); !ok {
				return fmt.Errorf("%s: message %d: %q must be a string, not %s", where, i+1, k, jsonType(x))
			}
		}
	}
	chat := e.chat
	if chat == nil {
		chat = DefaultChatTemplate()
	}
	spans, err := chat.spans(msgs)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	for _, s := range spans {
		ids, err := encode(e.tok, s.text, false, where)
		if err != nil {
			return err
		}
		ex.add(ids, s.train)
	}
	return nil
}

// strictJSON decodes one JSON object from b into v, refusing anything
// after it, with errors that say what is wrong in the line's terms.
func strictJSON(b []byte, v *record) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return fmt.Errorf("invalid JSON at byte %d: %v", se.Offset, err)
		case errors.As(err, &te) && te.Field != "":
			return fmt.Errorf("%q must be a string, not a JSON %s", te.Field, te.Value)
		case errors.As(err, &te):
			return fmt.Errorf("a line must be a JSON object, not a JSON %s", te.Value)
		case errors.Is(err, io.ErrUnexpectedEOF):
			return fmt.Errorf("invalid JSON: the line ends inside the object")
		}
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if off := dec.InputOffset(); len(bytes.TrimSpace(b[off:])) > 0 {
		return fmt.Errorf("invalid JSON: more after the object at byte %d", off)
	}
	return nil
}

// decodeOrdered decodes JSON into the template's values: objects as
// ordered *dict, integers as int64, other numbers as float64.
func decodeOrdered(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return decodeValue(dec)
}

func decodeValue(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch x := t.(type) {
	case json.Delim:
		switch x {
		case '{':
			d := newDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				d.set(k.(string), v)
			}
			_, err := dec.Token() // }
			return d, err
		case '[':
			out := []any{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := dec.Token() // ]
			return out, err
		}
	case json.Number:
		if i, err := x.Int64(); err == nil && !strings.ContainsAny(string(x), ".eE") {
			return i, nil
		}
		return x.Float64()
	}
	return t, nil // string, bool, nil
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
	case *dict:
		return "object"
	}
	return typeName(v)
}
