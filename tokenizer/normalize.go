package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// A normalizer rewrites the text between added tokens before it is
// pre-tokenized (Hugging Face's normalizers).
type normalizer interface {
	normalize(text string) string
}

// unicodeForm is NFC, NFD, NFKC or NFKD.
type unicodeForm struct{ form norm.Form }

func (u unicodeForm) normalize(text string) string { return u.form.String(text) }

// unicodeForms are the normalizers named for a Unicode normalization form.
var unicodeForms = map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}

// replaceString is Replace with a String pattern: every occurrence, left
// to right.
type replaceString struct{ old, new string }

func (r replaceString) normalize(text string) string { return strings.ReplaceAll(text, r.old, r.new) }

// replaceRegex is Replace with a Regex pattern, run on regexp2 as Split's
// patterns are.
type replaceRegex struct {
	re  *regexp2.Regexp
	new string
}

func (r replaceRegex) normalize(text string) string {
	out, err := r.re.Replace(text, r.new, -1, -1)
	if err != nil {
		// Only a match timeout fails, and none is set.
		panic(fmt.Sprintf("tokenizer: regexp2 %q: %v", r.re.String(), err))
	}
	return out
}

// prepend is Prepend: the string before any non-empty text (Llama 2's "▁").
type prepend struct{ s string }

func (p prepend) normalize(text string) string {
	if text == "" {
		return text
	}
	return p.s + text
}

// strip is Strip: Unicode White_Space off the left and right ends.
type strip struct{ left, right bool }

func (s strip) normalize(text string) string {
	if s.left {
		text = strings.TrimLeftFunc(text, unicode.IsSpace)
	}
	if s.right {
		text = strings.TrimRightFunc(text, unicode.IsSpace)
	}
	return text
}

// parseNormalizer appends the normalizers at path: NFC, NFD, NFKC, NFKD,
// Replace, Prepend, Strip, or a Sequence of them. A null normalizer leaves
// t.normalizers nil; any other, even an empty Sequence, makes it non-nil
// (added tokens marked normalized are then matched after it).
func (t *Tokenizer) parseNormalizer(path string, raw json.RawMessage) error {
	o, err := parseObject(path, raw)
	if err != nil || o == nil {
		return err
	}
	typ, err := o.typ()
	if err != nil {
		return err
	}
	if t.normalizers == nil {
		t.normalizers = []normalizer{}
	}
	if form, ok := unicodeForms[typ]; ok {
		t.normalizers = append(t.normalizers, unicodeForm{form})
		return nil
	}
	switch typ {
	case "Sequence":
		return o.each(path, "normalizers", t.parseNormalizer)
	case "Replace":
		var content string
		if err := o.get("content", &content); err != nil {
			return err
		}
		p, err := parsePattern(o, "pattern")
		if err != nil {
			return err
		}
		if p.regex != nil {
			t.normalizers = append(t.normalizers, replaceRegex{p.regex, content})
		} else {
			t.normalizers = append(t.normalizers, replaceString{p.literal, content})
		}
		return nil
	case "Prepend":
		var s string
		if err := o.get("prepend", &s); err != nil {
			return err
		}
		t.normalizers = append(t.normalizers, prepend{s})
		return nil
	case "Strip":
		st := strip{left: true, right: true}
		if err := o.get("strip_left", &st.left); err != nil {
			return err
		}
		if err := o.get("strip_right", &st.right); err != nil {
			return err
		}
		t.normalizers = append(t.normalizers, st)
		return nil
	}
	return o.unsupported("type", "supported: null, NFC, NFD, NFKC, NFKD, Replace, Prepend, Strip, or a Sequence of them")
}

// pattern is a Replace's or a Split's pattern: a non-empty String, or a
// Regex compiled by regexp2.
type pattern struct {
	literal string
	regex   *regexp2.Regexp
	source  string // the Regex as written
}

// parsePattern reads the pattern at o.key: {"String": ...} or {"Regex": ...}.
func parsePattern(o *object, key string) (pattern, error) {
	var p struct {
		Regex  *string
		String *string
	}
	if err := o.get(key, &p); err != nil {
		return pattern{}, err
	}
	switch {
	case p.Regex != nil:
		re, err := regexp2.Compile(*p.Regex, regexp2.None)
		if err != nil {
			return pattern{}, fmt.Errorf("%s.%s.Regex: %q: %w: %v", o.path, key, *p.Regex, ErrUnsupported, err)
		}
		return pattern{regex: re, source: *p.Regex}, nil
	case p.String != nil && *p.String != "":
		return pattern{literal: *p.String}, nil
	}
	return pattern{}, fmt.Errorf("%s.%s: %s: want {\"Regex\": ...} or a non-empty {\"String\": ...}", o.path, key, brief(o.fields[key]))
}

// oneChar reads the field key of o, a string of one character, into r
// (left as it is when the field is absent).
func oneChar(o *object, key string, r *rune) error {
	s := string(*r)
	if err := o.get(key, &s); err != nil {
		return err
	}
	c, w := utf8.DecodeRuneInString(s)
	if w == 0 || w != len(s) || c == utf8.RuneError {
		return fmt.Errorf("%s.%s: %s: want one character", o.path, key, brief(o.fields[key]))
	}
	*r = c
	return nil
}
