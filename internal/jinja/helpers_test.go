package jinja

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// templatesGlob are the real chat templates package data's tests render
// (Llama-3, Qwen2, ..., and features.jinja: every construct).
const templatesGlob = "../../data/testdata/templates/*.jinja"

// chatML is data.ChatMLTemplate.
const chatML = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// toolConversation is a tool call and its result (data's tests'
// conversations["tool"]).
const toolConversation = `[{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
	{"role": "tool", "content": "{\"temp\": 20}"}, {"role": "assistant", "content": "It is 20 degrees."}]`

// decodeJSON decodes s into the template's values: objects as ordered
// dicts, integers as int64, other numbers as float64.
func decodeJSON(s string) (any, error) {
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	return decodeValue(d)
}

func decodeValue(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '[':
			out := []any{}
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := d.Token()
			return out, err
		case '{':
			m := newDict()
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(d)
				if err != nil {
					return nil, err
				}
				m.set(k.(string), v)
			}
			_, err := d.Token()
			return m, err
		}
		return nil, fmt.Errorf("unexpected %v", x)
	case json.Number:
		if !strings.ContainsAny(x.String(), ".eE") {
			return strconv.ParseInt(x.String(), 10, 64)
		}
		return x.Float64()
	}
	return tok, nil // nil, bool, string
}
