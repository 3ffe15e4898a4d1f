package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// decoder is the decoder of a vocabulary over characters: steps that turn
// the tokens' spellings into text, run in order on the list of tokens as
// Hugging Face's decoders' decode_chain does; the text is what the last
// leaves, joined.
type decoder []decodeStep

// A decodeStep rewrites the list of tokens being decoded.
type decodeStep interface {
	apply(tokens []string) []string
}

func (d decoder) decode(tokens []string) string {
	for _, st := range d {
		tokens = st.apply(tokens)
	}
	return strings.Join(tokens, "")
}

// replaceTokens is Replace: in each token, every occurrence of old.
type replaceTokens struct{ old, new string }

func (r replaceTokens) apply(tokens []string) []string {
	for i, tok := range tokens {
		tokens[i] = strings.ReplaceAll(tok, r.old, r.new)
	}
	return tokens
}

// byteFallback is ByteFallback: each run of tokens <0xAB> becomes one
// token of those bytes. Hugging Face writes U+FFFD for each byte of a run
// that is not UTF-8; here the bytes stay, as a byte-level Decode keeps
// them, so that a cut in a character gives the bytes so far.
type byteFallback struct{}

func (byteFallback) apply(tokens []string) []string {
	out := tokens[:0]
	var run []byte
	inRun := false
	for _, tok := range tokens {
		if b, ok := fallbackByte(tok); ok {
			run, inRun = append(run, b), true
			continue
		}
		if inRun {
			out, run, inRun = append(out, string(run)), run[:0], false
		}
		out = append(out, tok)
	}
	if inRun {
		out = append(out, string(run))
	}
	return out
}

// fallbackByte returns the byte of a token <0xAB>.
func fallbackByte(tok string) (byte, bool) {
	if len(tok) != 6 || !strings.HasPrefix(tok, "<0x") || tok[5] != '>' {
		return 0, false
	}
	b, err := strconv.ParseUint(tok[3:5], 16, 8)
	return byte(b), err == nil
}

// fuse is Fuse: the tokens joined into one.
type fuse struct{}

func (fuse) apply(tokens []string) []string {
	if len(tokens) == 0 {
		return tokens
	}
	return []string{strings.Join(tokens, "")}
}

// stripTokens is Strip: from each token, up to start leading and stop
// trailing characters that are content.
type stripTokens struct {
	content     rune
	start, stop int
}

func (s stripTokens) apply(tokens []string) []string {
	c := string(s.content)
	for i, tok := range tokens {
		for k := 0; k < s.start && strings.HasPrefix(tok, c); k++ {
			tok = tok[len(c):]
		}
		for k := 0; k < s.stop && strings.HasSuffix(tok, c); k++ {
			tok = tok[:len(tok)-len(c)]
		}
		tokens[i] = tok
	}
	return tokens
}

// metaspaceTokens is the Metaspace decoder: the replacement becomes a
// space, except in the first token where, unless the scheme is never, it
// is dropped (Hugging Face's Rust decoder drops every replacement of the
// first token; tokenizers.js only its leading space).
type metaspaceTokens struct{ m metaspace }

func (d metaspaceTokens) apply(tokens []string) []string {
	rep := string(d.m.replacement)
	for i, tok := range tokens {
		with := " "
		if i == 0 && d.m.scheme != prependNever {
			with = ""
		}
		tokens[i] = strings.ReplaceAll(tok, rep, with)
	}
	return tokens
}

// parseDecodeSteps reads the decoder o of type typ: Replace (String
// pattern), ByteFallback, Fuse, Strip, Metaspace, or a Sequence of them.
func parseDecodeSteps(o *object, typ string) ([]decodeStep, error) {
	switch typ {
	case "Sequence":
		var list []json.RawMessage
		if err := o.get("decoders", &list); err != nil {
			return nil, err
		}
		var steps []decodeStep
		for i, raw := range list {
			d, err := parseObject(fmt.Sprintf("%s.decoders[%d]", o.path, i), raw)
			if err != nil {
				return nil, err
			}
			if d == nil {
				return nil, fmt.Errorf("%s.decoders[%d]: null: want a decoder", o.path, i)
			}
			typ, err := d.typ()
			if err != nil {
				return nil, err
			}
			more, err := parseDecodeSteps(d, typ)
			if err != nil {
				return nil, err
			}
			steps = append(steps, more...)
		}
		return steps, nil
	case "Replace":
		var content string
		if err := o.get("content", &content); err != nil {
			return nil, err
		}
		p, err := parsePattern(o, "pattern")
		if err != nil {
			return nil, err
		}
		if p.regex != nil {
			return nil, o.unsupported("pattern", "a decoder's Replace takes a String pattern")
		}
		return []decodeStep{replaceTokens{p.literal, content}}, nil
	case "ByteFallback":
		return []decodeStep{byteFallback{}}, nil
	case "Fuse":
		return []decodeStep{fuse{}}, nil
	case "Strip":
		s := stripTokens{content: ' '}
		if err := oneChar(o, "content", &s.content); err != nil {
			return nil, err
		}
		for _, f := range []struct {
			key string
			n   *int
		}{{"start", &s.start}, {"stop", &s.stop}} {
			if err := o.get(f.key, f.n); err != nil {
				return nil, err
			}
			if *f.n < 0 {
				return nil, fmt.Errorf("%s.%s: %d: want a count of characters, 0 or more", o.path, f.key, *f.n)
			}
		}
		return []decodeStep{s}, nil
	case "Metaspace":
		m, _, err := parseMetaspace(o)
		if err != nil {
			return nil, err
		}
		return []decodeStep{metaspaceTokens{m}}, nil
	case "ByteLevel":
		return nil, o.unsupported("type", "ByteLevel decodes a byte-level vocabulary, and this one is over characters (no ByteLevel pre-tokenizer)")
	}
	return nil, o.unsupported("type", "supported over characters: Replace, ByteFallback, Fuse, Strip, Metaspace, or a Sequence of them")
}
