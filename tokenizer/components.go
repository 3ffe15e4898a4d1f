package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// parsePreTokenizer appends the steps of the pre-tokenizer at path:
// ByteLevel, Split (behavior Isolated, not inverted) or a Sequence of them.
func (t *Tokenizer) parsePreTokenizer(path string, raw json.RawMessage) error {
	o, err := parseObject(path, raw)
	if err != nil || o == nil {
		return err
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	if n := len(t.steps); n > 0 && t.steps[n-1].byteLevel {
		return fmt.Errorf("%s: %s after ByteLevel: %w (ByteLevel must be the last pre-tokenizer)", path, typ, ErrUnsupported)
	}
	switch typ {
	case "Sequence":
		var list []json.RawMessage
		if err := o.get("pretokenizers", &list); err != nil {
			return err
		}
		for i, p := range list {
			if err := t.parsePreTokenizer(fmt.Sprintf("%s.pretokenizers[%d]", path, i), p); err != nil {
				return err
			}
		}
		return nil
	case "ByteLevel":
		// use_regex defaults to true as in Hugging Face tokenizers;
		// trim_offsets changes offsets only, which Encode does not return.
		addPrefix, useRegex := false, true
		if err := o.get("add_prefix_space", &addPrefix); err != nil {
			return err
		}
		if err := o.get("use_regex", &useRegex); err != nil {
			return err
		}
		st := preStep{prefixSpace: addPrefix, byteLevel: true}
		if useRegex {
			st.split = gpt2Splitter{}
		}
		t.steps = append(t.steps, st)
		return nil
	case "Split":
		return t.parseSplit(o)
	}
	return o.unsupported("type", "supported: ByteLevel, Split, Sequence")
}

// parseSplit reads a Split pre-tokenizer.
func (t *Tokenizer) parseSplit(o *object) error {
	var (
		behavior = "Isolated"
		invert   bool
		pattern  struct {
			Regex  *string
			String *string
		}
	)
	if err := o.get("behavior", &behavior); err != nil {
		return err
	}
	if behavior != "Isolated" {
		return o.unsupported("behavior", `only "Isolated"`)
	}
	if err := o.get("invert", &invert); err != nil {
		return err
	}
	if invert {
		return o.unsupported("invert", "only false")
	}
	if err := o.get("pattern", &pattern); err != nil {
		return err
	}
	switch {
	case pattern.Regex != nil:
		sp, err := newRegexSplitter(*pattern.Regex)
		if err != nil {
			return fmt.Errorf("%s.pattern.Regex: %q: %w: %v", o.path, *pattern.Regex, ErrUnsupported, err)
		}
		t.steps = append(t.steps, preStep{split: sp})
	case pattern.String != nil && *pattern.String != "":
		t.steps = append(t.steps, preStep{split: literalSplitter{*pattern.String}})
	default:
		return fmt.Errorf("%s.pattern: %s: want {\"Regex\": ...} or a non-empty {\"String\": ...}", o.path, brief(o.fields["pattern"]))
	}
	return nil
}

// parsePostProcessor reads the post-processor: ByteLevel (offsets only),
// TemplateProcessing (its single template: special tokens around $A), or a
// Sequence of them with at most one template.
func (t *Tokenizer) parsePostProcessor(path string, raw json.RawMessage) error {
	o, err := parseObject(path, raw)
	if err != nil || o == nil {
		return err
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	switch typ {
	case "ByteLevel":
		return nil
	case "Sequence":
		var list []json.RawMessage
		if err := o.get("processors", &list); err != nil {
			return err
		}
		for i, p := range list {
			if err := t.parsePostProcessor(fmt.Sprintf("%s.processors[%d]", path, i), p); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		return t.parseTemplate(o)
	}
	return o.unsupported("type", "supported: ByteLevel, TemplateProcessing, Sequence")
}

// templatePiece is one element of a TemplateProcessing template.
type templatePiece struct {
	SpecialToken *struct{ ID string } `json:"SpecialToken"`
	Sequence     *struct{ ID string } `json:"Sequence"`
}

func (t *Tokenizer) parseTemplate(o *object) error {
	if t.prefix != nil || t.suffix != nil {
		return fmt.Errorf("%s: a second TemplateProcessing: %w", o.path, ErrUnsupported)
	}
	var (
		single  []templatePiece
		special map[string]struct{ IDs []int64 }
	)
	if err := o.get("single", &single); err != nil {
		return err
	}
	if err := o.get("special_tokens", &special); err != nil {
		return err
	}
	t.prefix, t.suffix = []int32{}, []int32{}
	seenA := false
	for i, p := range single {
		at := fmt.Sprintf("%s.single[%d]", o.path, i)
		switch {
		case p.Sequence != nil && p.Sequence.ID == "A" && !seenA:
			seenA = true
		case p.Sequence != nil:
			return fmt.Errorf("%s: sequence %q: %w (a single template holds $A once)", at, p.Sequence.ID, ErrUnsupported)
		case p.SpecialToken != nil:
			tok, ok := special[p.SpecialToken.ID]
			if !ok || len(tok.IDs) == 0 {
				return fmt.Errorf("%s: special token %q has no ids in %s.special_tokens", at, p.SpecialToken.ID, o.path)
			}
			for _, id := range tok.IDs {
				if id < 0 || id >= int64(t.vocabSize) || !t.known[id] {
					return fmt.Errorf("%s.special_tokens[%q]: id %d names no token", o.path, p.SpecialToken.ID, id)
				}
				if seenA {
					t.suffix = append(t.suffix, int32(id))
				} else {
					t.prefix = append(t.prefix, int32(id))
				}
			}
		default:
			return fmt.Errorf("%s: want {\"SpecialToken\": ...} or {\"Sequence\": ...}", at)
		}
	}
	if !seenA {
		return fmt.Errorf("%s.single: no {\"Sequence\": {\"id\": \"A\"}}", o.path)
	}
	return nil
}

// parseDecoder checks the decoder: ByteLevel, or a Sequence holding only
// it; Decode maps the byte-level alphabet back to bytes.
func parseDecoder(path string, raw json.RawMessage) error {
	o, err := parseObject(path, raw)
	if err != nil {
		return err
	}
	if o == nil {
		return fmt.Errorf("%s: null is %w (a byte-level BPE decodes with ByteLevel)", path, ErrUnsupported)
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	switch typ {
	case "ByteLevel":
		return nil
	case "Sequence":
		var list []json.RawMessage
		if err := o.get("decoders", &list); err != nil {
			return err
		}
		if len(list) != 1 {
			return o.unsupported("decoders", "only a Sequence of one ByteLevel")
		}
		return parseDecoder(path+".decoders[0]", list[0])
	}
	return o.unsupported("type", "a byte-level BPE decodes with ByteLevel")
}

// readConfig takes bos_token and eos_token from a tokenizer_config.json,
// if the file exists, for BOS and EOS the post-processor does not name.
func (t *Tokenizer) readConfig(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: not valid JSON: %v", path, err)
	}
	for _, f := range []struct {
		key string
		id  *int32
	}{{"bos_token", &t.bos}, {"eos_token", &t.eos}} {
		raw := cfg[f.key]
		if *f.id >= 0 || isNull(raw) {
			continue
		}
		var content string
		var obj struct{ Content string }
		if json.Unmarshal(raw, &content) != nil {
			if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == "" {
				return fmt.Errorf("%s: %s: %s: want a string or {\"content\": ...}", path, f.key, brief(raw))
			}
			content = obj.Content
		}
		id, ok := t.TokenID(content)
		if !ok {
			return fmt.Errorf("%s: %s: %q is not a token of tokenizer.json", path, f.key, content)
		}
		*f.id = id
	}
	return nil
}
