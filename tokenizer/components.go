package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// parsePreTokenizer appends the steps of the pre-tokenizer at path:
// ByteLevel (the last), Split (not inverted), Metaspace, or a Sequence of
// them.
func (t *Tokenizer) parsePreTokenizer(path string, raw json.RawMessage) error {
	o, err := parseObject(path, raw)
	if err != nil || o == nil {
		return err
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	if t.byteLevel() {
		return fmt.Errorf("%s: %s after ByteLevel: %w (ByteLevel must be the last pre-tokenizer)", path, typ, ErrUnsupported)
	}
	switch typ {
	case "Sequence":
		return o.each(path, "pretokenizers", t.parsePreTokenizer)
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
	case "Metaspace":
		m, split, err := parseMetaspace(o)
		if err != nil {
			return err
		}
		st := preStep{metaspace: &m}
		if split {
			st.split, st.behavior = literalSplitter{string(m.replacement)}, mergedWithNext
		}
		t.steps = append(t.steps, st)
		return nil
	}
	return o.unsupported("type", "supported: ByteLevel, Split, Metaspace, Sequence")
}

// parseSplit reads a Split pre-tokenizer.
func (t *Tokenizer) parseSplit(o *object) error {
	var (
		name   = "Isolated"
		invert bool
	)
	if err := o.get("behavior", &name); err != nil {
		return err
	}
	b, ok := behaviors[name]
	if !ok {
		return o.unsupported("behavior", "supported: Isolated, Removed, MergedWithPrevious, MergedWithNext")
	}
	if err := o.get("invert", &invert); err != nil {
		return err
	}
	if invert {
		return o.unsupported("invert", "only false")
	}
	p, err := parsePattern(o, "pattern")
	if err != nil {
		return err
	}
	st := preStep{split: literalSplitter{p.literal}, behavior: b}
	if p.regex != nil {
		if st.split, err = newRegexSplitter(p.source); err != nil {
			return fmt.Errorf("%s.pattern.Regex: %q: %w: %v", o.path, p.source, ErrUnsupported, err)
		}
	}
	t.steps = append(t.steps, st)
	return nil
}

// parseMetaspace reads a Metaspace pre-tokenizer or decoder, and whether
// it splits.
func parseMetaspace(o *object) (metaspace, bool, error) {
	m := metaspace{replacement: '▁', scheme: prependAlways}
	if err := oneChar(o, "replacement", &m.replacement); err != nil {
		return m, false, err
	}
	// Files before prepend_scheme have add_prefix_space (true: always).
	addPrefix := true
	if err := o.get("add_prefix_space", &addPrefix); err != nil {
		return m, false, err
	}
	if !addPrefix {
		m.scheme = prependNever
	}
	if raw, ok := o.fields["prepend_scheme"]; ok && !isNull(raw) {
		var name string
		if err := o.get("prepend_scheme", &name); err != nil {
			return m, false, err
		}
		scheme, ok := prependSchemes[name]
		if !ok {
			return m, false, o.unsupported("prepend_scheme", `want "first", "always" or "never"`)
		}
		m.scheme = scheme
	}
	split := true
	if err := o.get("split", &split); err != nil {
		return m, false, err
	}
	return m, split, nil
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
		return o.each(path, "processors", t.parsePostProcessor)
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

// parseDecoder reads the decoder: for a byte-level vocabulary ByteLevel
// (or a Sequence of it alone), which Decode runs as the concatenation of
// the tokens' raw bytes; over characters a Sequence of Replace,
// ByteFallback, Fuse, Strip and Metaspace, run as Hugging Face runs them.
func (t *Tokenizer) parseDecoder(path string, raw json.RawMessage) error {
	o, err := parseObject(path, raw)
	if err != nil {
		return err
	}
	if o == nil {
		return fmt.Errorf("%s: null is %w (a byte-level BPE decodes with ByteLevel, one over characters with a Sequence such as Replace, ByteFallback, Fuse)", path, ErrUnsupported)
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	if t.byteLevel() {
		switch typ {
		case "ByteLevel":
			return nil
		case "Sequence":
			var list []json.RawMessage
			if err := o.get("decoders", &list); err != nil {
				return err
			}
			if len(list) != 1 {
				return o.unsupported("decoders", "a byte-level BPE decodes with a Sequence of one ByteLevel")
			}
			return t.parseDecoder(path+".decoders[0]", list[0])
		}
		return o.unsupported("type", "a byte-level BPE decodes with ByteLevel")
	}
	steps, err := parseDecodeSteps(o, typ)
	if err != nil {
		return err
	}
	t.decoder = decoder(steps)
	return nil
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
