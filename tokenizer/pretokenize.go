package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// A splitter cuts a string into consecutive pieces, as a Split
// pre-tokenizer with behavior Isolated does: every regex match is a piece
// and so is every stretch between two matches.
type splitter interface {
	// split calls emit with each piece of s in order, and whether it is a
	// match: none empty, together s. The pieces are substrings of s.
	split(s string, emit func(piece string, matched bool))
}

// preStep is one pre-tokenizer of the sequence. Each of those Load reads
// rewrites a piece and then splits it: ByteLevel puts a space before a
// piece that lacks one (add_prefix_space) and splits with GPT-2's pattern
// (use_regex); Metaspace writes spaces as its replacement, prepends one
// per its scheme and splits before each (split); Split splits.
type preStep struct {
	prefixSpace bool       // ByteLevel's add_prefix_space
	metaspace   *metaspace // Metaspace's rewrite, nil for the others
	split       splitter   // nil: the piece goes on whole
	behavior    behavior   // what becomes of split's matches
	byteLevel   bool       // this is ByteLevel
}

// behavior is what a Split does with its matches (Hugging Face's
// SplitDelimiterBehavior).
type behavior uint8

const (
	isolated           behavior = iota // each match a piece of its own
	removed                            // matches dropped
	mergedWithPrevious                 // a match joins the piece before it
	mergedWithNext                     // a match joins the piece after it
)

var behaviors = map[string]behavior{"Isolated": isolated, "Removed": removed,
	"MergedWithPrevious": mergedWithPrevious, "MergedWithNext": mergedWithNext}

// apply calls emit with the pieces of s that split cuts, as behavior b
// joins or drops its matches, and whether each holds a match. Hugging
// Face's rules: a match joins its neighbour only when that neighbour is
// not a match itself.
func (b behavior) apply(sp splitter, s string, emit func(piece string, matched bool)) {
	switch b {
	case isolated:
		sp.split(s, emit)
		return
	case removed:
		sp.split(s, func(p string, matched bool) {
			if !matched {
				emit(p, false)
			}
		})
		return
	}
	// The pieces are consecutive substrings of s; s[start:end] is the one
	// not emitted yet, lastMatch says whether its last part matched and
	// anyMatch whether any did.
	start, end, lastMatch, anyMatch := 0, 0, false, false
	sp.split(s, func(p string, matched bool) {
		join := b == mergedWithPrevious && matched && !lastMatch || b == mergedWithNext && !matched && lastMatch
		if !join {
			if end > start {
				emit(s[start:end], anyMatch)
			}
			start, anyMatch = end, false
		}
		end += len(p)
		lastMatch = matched
		anyMatch = anyMatch || matched
	})
	if end > start {
		emit(s[start:end], anyMatch)
	}
}

// prependScheme says where Metaspace puts its replacement before a piece.
type prependScheme uint8

const (
	prependAlways prependScheme = iota // before every piece
	prependFirst                       // before the piece that begins the text
	prependNever
)

var prependSchemes = map[string]prependScheme{"always": prependAlways, "first": prependFirst, "never": prependNever}

// metaspace is Metaspace's rewrite of a piece: spaces become the
// replacement (U+2581 "▁"), and the replacement is prepended to a piece
// that does not start with it, as the scheme says.
type metaspace struct {
	replacement rune
	scheme      prependScheme
}

// rewrite returns piece rewritten; first says it begins the text.
func (m *metaspace) rewrite(piece string, first bool) string {
	rep := string(m.replacement)
	piece = strings.ReplaceAll(piece, " ", rep)
	if (m.scheme == prependAlways || m.scheme == prependFirst && first) && !strings.HasPrefix(piece, rep) {
		piece = rep + piece
	}
	return piece
}

// The three pre-tokenizer regexes of the byte-level BPE families, as
// tokenizer.json spells them. They are matched by hand (gpt2Splitter,
// llamaSplitter); any other pattern goes to regexp2.
const (
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// newRegexSplitter returns the splitter of a Split pre-tokenizer's Regex
// pattern: a hand-written matcher for the known patterns (these three,
// and o200k's and DeepSeek-V3's in patterns.go), regexp2 for any other.
func newRegexSplitter(pattern string) (splitter, error) {
	switch pattern {
	case gpt2Pattern:
		return gpt2Splitter{}, nil
	case llama3Pattern:
		return llamaSplitter{maxDigits: 3}, nil
	case qwen2Pattern:
		return llamaSplitter{maxDigits: 1}, nil
	case o200kPattern:
		return matchSplitter{o200kMatcher{}}, nil
	case deepseekDigitsPattern:
		return matchSplitter{digitsMatcher{}}, nil
	case deepseekCJKPattern:
		return matchSplitter{cjkMatcher{}}, nil
	case deepseekPattern:
		return matchSplitter{deepseekMatcher{}}, nil
	}
	return compileRegexp2(pattern)
}

// compileRegexp2 returns the regexp2 splitter of pattern.
func compileRegexp2(pattern string) (regexSplitter, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return regexSplitter{}, err
	}
	return regexSplitter{re}, nil
}

// class is the character class the known patterns distinguish: \p{L},
// \p{N}, \s less \r and \n, \r and \n, and everything else.
type class uint8

const (
	other class = iota
	letter
	number
	space
	newline
)

var asciiClass [utf8.RuneSelf]class

func init() {
	for c := 0; c < utf8.RuneSelf; c++ {
		r := rune(c)
		switch {
		case r == '\r' || r == '\n':
			asciiClass[c] = newline
		case unicode.IsSpace(r):
			asciiClass[c] = space
		case unicode.IsLetter(r):
			asciiClass[c] = letter
		case unicode.IsNumber(r):
			asciiClass[c] = number
		}
	}
}

// classAt returns the class of the character at s[i] and its width in
// bytes. \s is Unicode's White_Space (unicode.IsSpace), which is
// Oniguruma's \s; a byte that is not valid UTF-8 is one character of
// class other (U+FFFD is a symbol), so arbitrary bytes pre-tokenize too.
func classAt(s string, i int) (class, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return letter, w
	case unicode.IsNumber(r):
		return number, w
	case unicode.IsSpace(r):
		return space, w
	}
	return other, w
}

// run returns the end of the run of characters of class want from i.
func run(s string, i int, want class) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c != want {
			break
		}
		i += w
	}
	return i
}

// contraction returns the length of the contraction suffix ('s, 't, 're,
// 've, 'm, 'll, 'd without the apostrophe) at s[i:], or 0. With fold it is
// (?i:...): ASCII case, and 'ſ' (U+017F), whose simple case folding is 's'
// as Oniguruma and Rust's regex apply it.
func contraction(s string, i int, fold bool) int {
	if i >= len(s) {
		return 0
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch lower(s[i]) {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if i+1 < len(s) && lower(s[i+1]) == 'e' {
			return 2
		}
	case 'l':
		if i+1 < len(s) && lower(s[i+1]) == 'l' {
			return 2
		}
	}
	if fold && strings.HasPrefix(s[i:], "ſ") {
		return len("ſ")
	}
	return 0
}

// whitespace matches the whitespace alternatives at s[i], a space or
// newline character: \s+(?!\S) takes a run that ends the text whole and
// otherwise all of it but its last character (which the next piece takes
// as its leading space); a single whitespace character before a
// non-space is \s+. With newlines (Llama-3, Qwen2), \s*[\r\n]+ comes
// first: the run up to and including its last \r or \n.
func whitespace(s string, i int, newlines bool) int {
	j, last, lastNewline := i, i, -1
	for j < len(s) {
		c, w := classAt(s, j)
		if c != space && c != newline {
			break
		}
		if c == newline {
			lastNewline = j
		}
		last = j
		j += w
	}
	switch {
	case newlines && lastNewline >= 0:
		return lastNewline + 1
	case j == len(s) || last == i:
		return j
	}
	return last
}

// gpt2Splitter matches gpt2Pattern:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
type gpt2Splitter struct{}

func (gpt2Splitter) split(s string, emit func(string, bool)) {
	for i := 0; i < len(s); {
		j := gpt2Next(s, i)
		emit(s[i:j], true)
		i = j
	}
}

// gpt2Next returns the end of the match at s[i] (one always starts there:
// the alternatives cover every character and none matches empty).
func gpt2Next(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i+1, false); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(s, i)
	if s[i] == ' ' && i+1 < len(s) { // the optional leading space
		if c2, w2 := classAt(s, i+1); c2 != space && c2 != newline {
			c, w = c2, 1+w2
		}
	}
	if c == space || c == newline {
		return whitespace(s, i, false)
	}
	return run(s, i+w, c)
}

// llamaSplitter matches llama3Pattern (maxDigits 3) and qwen2Pattern
// (maxDigits 1):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
type llamaSplitter struct{ maxDigits int }

func (l llamaSplitter) split(s string, emit func(string, bool)) {
	for i := 0; i < len(s); {
		j := l.next(s, i)
		emit(s[i:j], true)
		i = j
	}
}

// next returns the end of the match at s[i], trying the alternatives in
// the pattern's order.
func (l llamaSplitter) next(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i+1, true); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(s, i)
	switch c {
	case letter:
		return run(s, i+w, letter)
	case number:
		j := i + w
		for k := 1; k < l.maxDigits && j < len(s); k++ {
			c2, w2 := classAt(s, j)
			if c2 != number {
				break
			}
			j += w2
		}
		return j
	}
	// c is other, space or newline.
	if c != newline && i+w < len(s) { // [^\r\n\p{L}\p{N}]?\p{L}+
		if c2, w2 := classAt(s, i+w); c2 == letter {
			return run(s, i+w+w2, letter)
		}
	}
	start := i // ?[^\s\p{L}\p{N}]+[\r\n]*
	if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2 == other {
			c, start = other, i+1
		}
	}
	if c == other {
		j := run(s, start, other)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	return whitespace(s, i, true)
}

// regexSplitter is a Split pre-tokenizer with a pattern that has no
// hand-written matcher, run by regexp2: a backtracking engine with .NET's
// syntax, which has what tokenizer.json patterns take from Oniguruma's
// (lookaround, \p{..} classes, (?i:...), atomic groups) but not
// possessive quantifiers (a pattern with them fails to compile and Load
// refuses it). Its \s, \p{L} and \p{N} are the Unicode classes, as here.
type regexSplitter struct{ re *regexp2.Regexp }

func (r regexSplitter) split(s string, emit func(string, bool)) {
	runes := []rune(s) // one rune per invalid byte, as the offsets below count
	offsets := make([]int, len(runes)+1)
	off := 0
	for k := range runes {
		offsets[k] = off
		_, w := utf8.DecodeRuneInString(s[off:])
		off += w
	}
	offsets[len(runes)] = len(s)
	prev := 0
	m, err := r.re.FindRunesMatch(runes)
	for ; m != nil && err == nil; m, err = r.re.FindNextMatch(m) {
		start, end := offsets[m.Index], offsets[m.Index+m.Length]
		if start == end {
			continue
		}
		if start > prev {
			emit(s[prev:start], false)
		}
		emit(s[start:end], true)
		prev = end
	}
	if err != nil {
		// Only a match timeout fails, and none is set (DefaultMatchTimeout).
		panic(fmt.Sprintf("tokenizer: regexp2 %q: %v", r.re.String(), err))
	}
	if prev < len(s) {
		emit(s[prev:], false)
	}
}

// literalSplitter is a Split pre-tokenizer with a String pattern: each
// occurrence of the string is a piece.
type literalSplitter struct{ sep string }

func (l literalSplitter) split(s string, emit func(string, bool)) {
	prev := 0
	for prev < len(s) {
		k := strings.Index(s[prev:], l.sep)
		if k < 0 {
			break
		}
		if k > 0 {
			emit(s[prev:prev+k], false)
		}
		emit(s[prev+k:prev+k+len(l.sep)], true)
		prev += k + len(l.sep)
	}
	if prev < len(s) {
		emit(s[prev:], false)
	}
}
