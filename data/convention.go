package data

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Convention is a layout of an example's fields: the keys of a JSONL line
// or the columns of a Parquet or Arrow file. Both are read by one mapping
// (encoder.example), so a row and the same JSONL line give the same ids.
type Convention int

const (
	// ConvText is {"text"}: trained whole.
	ConvText Convention = iota
	// ConvCompletion is {"prompt", "completion"}: the completion trained.
	ConvCompletion
	// ConvMessages is {"messages": [{"role", "content"}, ...]}: a chat.
	ConvMessages
	// ConvShareGPT is {"conversations": [{"from", "value"}, ...]}: a chat
	// with ShareGPT's names for the roles.
	ConvShareGPT
	// ConvAlpaca is {"instruction", "input", "output"} (and "system"): a
	// chat of one turn.
	ConvAlpaca
	conventionCount
)

// conventions are each convention's fields, the kind of example it
// makes, and its name.
var conventions = [conventionCount]struct {
	name     string
	need     []string // fields that must all be there
	optional []string // fields read when there
	kind     int
}{
	ConvText:       {"text", []string{"text"}, nil, KindText},
	ConvCompletion: {"prompt/completion", []string{"prompt", "completion"}, nil, KindCompletion},
	ConvMessages:   {"chat", []string{"messages"}, nil, KindChat},
	ConvShareGPT:   {"ShareGPT", []string{"conversations"}, nil, KindChat},
	ConvAlpaca:     {"Alpaca", []string{"instruction", "output"}, []string{"input", "system"}, KindChat},
}

// pickOrder is the order conventions are named in.
var pickOrder = []Convention{ConvText, ConvCompletion, ConvMessages, ConvShareGPT, ConvAlpaca}

func (c Convention) String() string {
	if c < 0 || c >= conventionCount {
		return fmt.Sprintf("Convention(%d)", int(c))
	}
	return conventions[c].name
}

// turnFields are the fields of a conversation's items, by convention.
var turnFields = map[Convention][2]string{ConvMessages: {"role", "content"}, ConvShareGPT: {"from", "value"}}

// shareGPTRoles maps ShareGPT's "from" to a chat role (the values
// FastChat, LLaMA-Factory and axolotl read).
var shareGPTRoles = map[string]string{
	"human": "user", "user": "user",
	"gpt": "assistant", "assistant": "assistant", "bot": "assistant", "chatgpt": "assistant",
	"system": "system", "tool": "tool",
}

// Columns says under which names a file holds a convention's fields
// (--data-columns "messages=dialog" or "prompt=question,completion=answer"):
// a field (text, prompt, completion, messages, conversations, instruction,
// input, output, system, or a turn's role, content, from, value) to its
// name in the file. Fields not in it keep their names.
type Columns map[string]string

// columnFields are the fields Columns may rename.
var columnFields = []string{"text", "prompt", "completion", "messages", "conversations", "instruction", "input", "output", "system", "role", "content", "from", "value"}

// ParseColumns reads --data-columns: FIELD=NAME pairs separated by commas.
func ParseColumns(s string) (Columns, error) {
	c := Columns{}
	for _, pair := range strings.Split(s, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		field, name, ok := strings.Cut(pair, "=")
		field, name = strings.TrimSpace(field), strings.TrimSpace(name)
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("data: columns %q: %q is not FIELD=NAME", s, pair)
		case !slices.Contains(columnFields, field):
			return nil, fmt.Errorf("data: columns %q: %q is not a field: give one of %s", s, field, strings.Join(columnFields, ", "))
		case c[field] != "":
			return nil, fmt.Errorf("data: columns %q: %s is named twice", s, field)
		}
		c[field] = name
	}
	return c, nil
}

// String is c as ParseColumns reads it, fields sorted.
func (c Columns) String() string {
	var pairs []string
	for f, n := range c {
		pairs = append(pairs, f+"="+n)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// name is the name a file holds field under.
func (c Columns) name(field string) string {
	if n := c[field]; n != "" {
		return n
	}
	return field
}

// pick is the convention of a line's keys or a table's columns (have
// says whether a field's name is there): the one whose fields are all
// there. Several are an error (which would the example be?), but for a
// "text" beside Alpaca's fields: Alpaca data sets (tatsu-lab/alpaca,
// alpaca-gpt4) carry the prompt rendered from them there, not read. what
// names the holder in the errors ("a line").
func (c Columns) pick(have func(name string) bool, what string) (Convention, error) {
	var all []Convention
	for _, conv := range pickOrder {
		n := 0
		for _, f := range conventions[conv].need {
			if have(c.name(f)) {
				n++
			}
		}
		if n == len(conventions[conv].need) {
			all = append(all, conv)
		}
	}
	if len(all) == 2 && all[0] == ConvText && all[1] == ConvAlpaca {
		all = all[1:]
	}
	switch {
	case len(all) == 1:
		return all[0], nil
	case len(all) > 1:
		var names []string
		for _, conv := range all {
			names = append(names, fmt.Sprintf("%q", strings.Join(c.names(conventions[conv].need), `"/"`)))
		}
		return 0, fmt.Errorf("%s holds one of %s, not several: it has %s", what, c.wanted(), strings.Join(names, " and "))
	}
	for _, conv := range pickOrder {
		need := conventions[conv].need
		for i, f := range need {
			if len(need) == 2 && have(c.name(f)) {
				return 0, fmt.Errorf("%q and %q go together; %s has only %q", c.name(need[0]), c.name(need[1]), what, c.name(need[i]))
			}
		}
	}
	return 0, fmt.Errorf("%s needs %s", what, c.wanted())
}

// names is fields under c's names.
func (c Columns) names(fields []string) []string {
	out := make([]string, len(fields))
	for i, f := range fields {
		out[i] = c.name(f)
	}
	return out
}

// wanted lists the conventions' fields under c's names.
func (c Columns) wanted() string {
	q := func(f string) string { return fmt.Sprintf("%q", c.name(f)) }
	return fmt.Sprintf("%s, %s and %s, or %s (or ShareGPT's %s, Alpaca's %s and %s)",
		q("text"), q("prompt"), q("completion"), q("messages"), q("conversations"), q("instruction"), q("output"))
}

// row is one example's fields by name: a JSONL line's keys (jsonRow) or a
// table's columns at one row (tableRow).
type row interface {
	// str is the string field name; ok is false when it is absent or null.
	str(name string) (s string, ok bool, err error)
	// value is the field name as the chat template's values (lists as
	// []any, objects and structs as *object); ok as for str.
	value(name string) (v any, ok bool, err error)
}

// example encodes the example of convention conv from r (where names it:
// FILE:LINE, FILE: row N). The text of "text" is tokenized with the
// tokenizer's special tokens added and trained whole; a prompt with them,
// not trained, then the completion without them, trained; a chat
// (messages, ShareGPT's conversations, an Alpaca instruction) is the chat
// template's rendering, the assistant's parts trained. Each but a chat
// ends with EOS (trained) when the tokenizer has one. null says a field
// the convention needs is null or absent: nothing is encoded.
func (e *encoder) example(conv Convention, r row, where string) (ex example, null bool, err error) {
	ex = example{ids: e.ex.ids[:0], train: e.ex.train[:0]}
	defer func() { e.ex = ex }()
	cols := e.cols
	strs := func(fields ...string) ([]string, bool, error) {
		out := make([]string, len(fields))
		for i, f := range fields {
			s, ok, err := r.str(cols.name(f))
			if err != nil {
				return nil, false, fmt.Errorf("%s: %w", where, err)
			}
			if !ok {
				return nil, true, nil
			}
			out[i] = s
		}
		return out, false, nil
	}
	switch conv {
	case ConvText:
		s, null, err := strs("text")
		if err != nil || null {
			return ex, null, err
		}
		ids, err := encode(e.tok, s[0], true, where)
		if err != nil {
			return ex, false, err
		}
		ex.add(ids, true)
	case ConvCompletion:
		s, null, err := strs("prompt", "completion")
		if err != nil || null {
			return ex, null, err
		}
		p, err := encode(e.tok, s[0], true, where+": prompt")
		if err != nil {
			return ex, false, err
		}
		c, err := encode(e.tok, s[1], false, where+": completion")
		if err != nil {
			return ex, false, err
		}
		ex.add(p, false)
		ex.add(c, true)
	case ConvMessages, ConvShareGPT:
		name := cols.name(conventions[conv].need[0])
		v, ok, err := r.value(name)
		if err != nil {
			return ex, false, fmt.Errorf("%s: %w", where, err)
		}
		if !ok {
			return ex, true, nil
		}
		msgs, err := cols.turns(conv, name, v)
		if err != nil {
			return ex, false, fmt.Errorf("%s: %w", where, err)
		}
		if err := e.renderChat(&ex, msgs, where); err != nil {
			return ex, false, err
		}
	case ConvAlpaca:
		s, null, err := strs("instruction", "output")
		if err != nil || null {
			return ex, null, err
		}
		opt := make([]string, 2)
		for i, f := range conventions[ConvAlpaca].optional {
			if opt[i], _, err = r.str(cols.name(f)); err != nil {
				return ex, false, fmt.Errorf("%s: %w", where, err)
			}
		}
		if err := e.renderChat(&ex, alpacaMessages(s[0], opt[0], s[1], opt[1]), where); err != nil {
			return ex, false, err
		}
	default:
		panic(fmt.Sprintf("data: convention %d", conv))
	}
	if e.hasEOS && len(ex.ids) > 0 && ex.ids[len(ex.ids)-1] != e.eos && conventions[conv].kind != KindChat {
		ex.add([]int32{e.eos}, true)
	}
	return ex, false, nil
}

// alpacaMessages is an Alpaca example as a chat, as LLaMA-Factory reads
// it: the system message when there is one; the user's turn the
// instruction, then a line break and the input when there is one; the
// assistant's the output.
func alpacaMessages(instruction, input, output, system string) []any {
	var msgs []any
	if system != "" {
		msgs = append(msgs, newMessage("system", system))
	}
	if input != "" {
		instruction += "\n" + input
	}
	return append(msgs, newMessage("user", instruction), newMessage("assistant", output))
}

// turns checks a conversation (the value of field name, convention conv:
// a non-empty list of objects with string role and content, or from and
// value, under c's names) and returns it as messages with "role" and
// "content" (ShareGPT's roles mapped; messages' other keys kept, in order).
func (c Columns) turns(conv Convention, name string, v any) ([]any, error) {
	f := turnFields[conv]
	role, content := c.name(f[0]), c.name(f[1])
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		return nil, fmt.Errorf("%q must be a non-empty list of {%q, %q} objects", name, role, content)
	}
	out := list
	for i, m := range list {
		d, ok := m.(*object)
		if !ok {
			return nil, fmt.Errorf("message %d is a %s, not an object with %q and %q", i+1, jsonType(m), role, content)
		}
		for _, k := range []string{role, content} {
			x, ok := d.get(k)
			if !ok {
				return nil, fmt.Errorf("message %d has no %q", i+1, k)
			}
			if _, ok := x.(string); !ok {
				return nil, fmt.Errorf("message %d: %q must be a string, not %s", i+1, k, jsonType(x))
			}
		}
		r, _ := d.get(role)
		x, _ := d.get(content)
		switch {
		case conv == ConvShareGPT:
			to, ok := shareGPTRoles[r.(string)]
			if !ok {
				return nil, fmt.Errorf("message %d: %q is %q, not one of ShareGPT's human, user, gpt, assistant, bot, chatgpt, system, tool", i+1, role, r)
			}
			if i == 0 {
				out = make([]any, len(list))
			}
			out[i] = newMessage(to, x.(string))
		case role != "role" || content != "content":
			if i == 0 {
				out = make([]any, len(list))
			}
			m := newObject()
			for _, k := range d.keys {
				switch k {
				case role:
					m.set("role", r)
				case content:
					m.set("content", x)
				default:
					m.set(k, d.m[k])
				}
			}
			out[i] = m
		}
	}
	return out, nil
}

// renderChat renders and tokenizes a conversation.
func (e *encoder) renderChat(ex *example, msgs []any, where string) error {
	spans, err := e.chat.spans(e.ctx, msgs)
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

// jsonRow is a JSONL line's keys.
type jsonRow map[string]json.RawMessage

// has says whether the line has key name, not null.
func (r jsonRow) has(name string) bool {
	v, ok := r[name]
	return ok && string(v) != "null"
}

func (r jsonRow) str(name string) (string, bool, error) {
	if !r.has(name) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(r[name], &s); err != nil {
		return "", false, fmt.Errorf("%q must be a string, not a JSON %s", name, rawType(r[name]))
	}
	return s, true, nil
}

func (r jsonRow) value(name string) (any, bool, error) {
	if !r.has(name) {
		return nil, false, nil
	}
	v, err := decodeOrdered(r[name])
	if err != nil {
		return nil, false, fmt.Errorf("%q: %w", name, err)
	}
	return v, true, nil
}

// rawType names the type of a JSON value, as encoding/json's errors do.
func rawType(raw json.RawMessage) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	}
	return "number"
}
