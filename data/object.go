package data

import "github.com/strata-ai/strata/internal/jinja"

// object is a JSON object as data decodes it (decodeOrdered, a table's
// struct column): its keys in the order they came, as Python's dicts keep
// them, so that a chat template sees a message's keys in the file's order.
// JSON's other values are nil, bool, int64, float64, string and []any.
type object struct {
	keys []string
	m    map[string]any
}

func newObject() *object { return &object{m: map[string]any{}} }

func (o *object) set(k string, v any) {
	if _, ok := o.m[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.m[k] = v
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.m[k]
	return v, ok
}

// templateValue is v (a JSON value of data's) as the chat template's
// interpreter takes it: objects as its ordered dicts, in lists too.
func templateValue(v any) any {
	switch x := v.(type) {
	case *object:
		m := make(map[string]any, len(x.keys))
		for _, k := range x.keys {
			m[k] = templateValue(x.m[k])
		}
		return jinja.NewDict(x.keys, m)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = templateValue(e)
		}
		return out
	}
	return v
}

// maxRenderBytes bounds the bytes a chat template's rendering builds, its
// output included: four times MaxLineBytes, the largest conversation a
// JSONL line holds (a template renders a conversation about once, plus
// the strings it concatenates on the way).
const maxRenderBytes = 4 * MaxLineBytes

// ErrTemplateBudget is the error of a rendering that went past its
// budget (steps or bytes): the template loops or builds without bound.
var ErrTemplateBudget = jinja.ErrBudget
