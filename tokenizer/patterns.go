package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The Split patterns of gpt-oss (o200k's, also GPT-4o's) and DeepSeek-V3
// (three Splits in a row), as tokenizer.json spells them. Like the three
// in pretokenize.go they are matched by hand; regexp2 is their oracle in
// the tests.
const (
	o200kPattern = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?` +
		`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?` +
		`|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	deepseekDigitsPattern = `\p{N}{1,3}`
	deepseekCJKPattern    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+" // [一-龥぀-ゟ゠-ヿ]+
	// The file writes \r and \n in the classes as the characters themselves.
	deepseekPattern = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+" +
		"|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// kind is the finer character class the o200k and DeepSeek patterns
// distinguish: letters by case (\p{Lu} with \p{Lt}, \p{Ll}, \p{Lm} with
// \p{Lo}), marks, numbers, punctuation, symbols, \s less \r and \n, \r and
// \n, and everything else. A byte that is not UTF-8 is a symbol: regexp2
// sees it as U+FFFD, which is \p{So}.
type kind uint8

const (
	kOther   kind = iota
	kUpper        // Lu, Lt
	kLower        // Ll
	kLetter       // Lm, Lo
	kMark         // M
	kNumber       // N
	kPunct        // P
	kSymbol       // S
	kSpace        // White_Space less \r, \n
	kNewline      // \r, \n
)

// kinds is a set of kinds, a bit each.
type kinds uint16

func kindSet(ks ...kind) kinds {
	var set kinds
	for _, k := range ks {
		set |= 1 << k
	}
	return set
}

func (set kinds) has(k kind) bool { return set&(1<<k) != 0 }

var asciiKind [utf8.RuneSelf]kind

func init() {
	for c := 0; c < utf8.RuneSelf; c++ {
		asciiKind[c] = kindOf(rune(c))
	}
}

// kindOf returns the kind of r.
func kindOf(r rune) kind {
	switch {
	case r == '\r' || r == '\n':
		return kNewline
	case unicode.IsSpace(r):
		return kSpace
	case unicode.IsLetter(r):
		switch {
		case unicode.IsLower(r):
			return kLower
		case unicode.IsUpper(r) || unicode.IsTitle(r):
			return kUpper
		}
		return kLetter
	case unicode.IsMark(r):
		return kMark
	case unicode.IsNumber(r):
		return kNumber
	case unicode.IsPunct(r):
		return kPunct
	case unicode.IsSymbol(r):
		return kSymbol
	}
	return kOther
}

// kindAt returns the kind of the character at s[i] and its width.
func kindAt(s string, i int) (kind, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiKind[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	return kindOf(r), w // U+FFFD, a symbol, for a byte that is not UTF-8
}

// runOf returns the end of the run of characters of the kinds in set from i.
func runOf(s string, i int, set kinds) int {
	for i < len(s) {
		k, w := kindAt(s, i)
		if !set.has(k) {
			break
		}
		i += w
	}
	return i
}

// matcher is a hand-written pattern: next returns the end of the match
// that starts at s[i], or -1 when none does.
type matcher interface {
	next(s string, i int) int
}

// matchSplitter splits as a regex search does: a match where one starts,
// else the character is passed over and joins the stretch before the next
// match (a piece that is not a match).
type matchSplitter struct{ m matcher }

func (sp matchSplitter) split(s string, emit func(string, bool)) {
	gap := 0 // the start of the stretch no match has taken
	for i := 0; i < len(s); {
		j := sp.m.next(s, i)
		if j < 0 {
			_, w := utf8.DecodeRuneInString(s[i:])
			i += w
			continue
		}
		if gap < i {
			emit(s[gap:i], false)
		}
		emit(s[i:j], true)
		i, gap = j, j
	}
	if gap < len(s) {
		emit(s[gap:], false)
	}
}

var (
	o200kLead   = ^kindSet(kNewline, kUpper, kLower, kLetter, kNumber) // [^\r\n\p{L}\p{N}]
	o200kUpper  = kindSet(kUpper, kLetter, kMark)                      // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	o200kLower  = kindSet(kLower, kLetter, kMark)                      // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	o200kSymbol = kindSet(kMark, kPunct, kSymbol, kOther)              // [^\s\p{L}\p{N}]
)

// o200kMatcher matches o200kPattern, trying the alternatives in its order:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Some alternative matches at every character.
type o200kMatcher struct{}

func (o200kMatcher) next(s string, i int) int {
	k, w := kindAt(s, i)
	lead := o200kLead.has(k) && i+w < len(s) // the optional first character can be taken
	for _, word := range [2]func(string, int) int{upperLower, upperRun} {
		if lead {
			if j := word(s, i+w); j >= 0 {
				return afterContraction(s, j)
			}
		}
		if j := word(s, i); j >= 0 {
			return afterContraction(s, j)
		}
	}
	if k == kNumber {
		return digits(s, i, 3)
	}
	start := i // ?[^\s\p{L}\p{N}]+[\r\n/]*
	if s[i] == ' ' && i+1 < len(s) {
		if k2, _ := kindAt(s, i+1); o200kSymbol.has(k2) {
			k, start = k2, i+1
		}
	}
	if o200kSymbol.has(k) {
		j := runOf(s, start, o200kSymbol)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
			j++
		}
		return j
	}
	return whitespace(s, i, true) // k is a space or a newline
}

// upperLower matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
// at s[i], or returns -1. The star takes the run of its class; a lower
// case letter after it starts the plus's run; else the star gives back
// characters from the end until the plus can take one (a letter of Lm or
// Lo, or a mark: the plus then ends there, as the next is Lu or Lt).
func upperLower(s string, i int) int {
	j, lastBoth := i, -1
	for j < len(s) {
		k, w := kindAt(s, j)
		if !o200kUpper.has(k) {
			break
		}
		j += w
		if o200kLower.has(k) {
			lastBoth = j
		}
	}
	if j < len(s) {
		if k, w := kindAt(s, j); k == kLower {
			return runOf(s, j+w, o200kLower)
		}
	}
	return lastBoth
}

// upperRun matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
// at s[i], or returns -1.
func upperRun(s string, i int) int {
	j := runOf(s, i, o200kUpper)
	if j == i {
		return -1
	}
	return runOf(s, j, o200kLower)
}

// afterContraction returns the end of (?i:'s|'t|'re|'ve|'m|'ll|'d)? at
// s[j].
func afterContraction(s string, j int) int {
	if j < len(s) && s[j] == '\'' {
		if n := contraction(s, j+1, true); n > 0 {
			return j + 1 + n
		}
	}
	return j
}

// digits returns the end of \p{N}{1,max} at s[i], which is a number.
func digits(s string, i, max int) int {
	_, w := kindAt(s, i)
	j := i + w
	for n := 1; n < max && j < len(s); n++ {
		k, w := kindAt(s, j)
		if k != kNumber {
			break
		}
		j += w
	}
	return j
}

// digitsMatcher matches \p{N}{1,3} (DeepSeek-V3's first Split).
type digitsMatcher struct{}

func (digitsMatcher) next(s string, i int) int {
	if k, _ := kindAt(s, i); k == kNumber {
		return digits(s, i, 3)
	}
	return -1
}

// cjkMatcher matches [一-龥぀-ゟ゠-ヿ]+ (DeepSeek-V3's second Split): CJK
// ideographs U+4E00 to U+9FA5, hiragana and katakana U+3040 to U+30FF.
type cjkMatcher struct{}

func isCJK(r rune) bool { return '一' <= r && r <= '龥' || '぀' <= r && r <= 'ヿ' }

func (cjkMatcher) next(s string, i int) int {
	j := i
	for j < len(s) && s[j] >= utf8.RuneSelf {
		r, w := utf8.DecodeRuneInString(s[j:])
		if !isCJK(r) {
			break
		}
		j += w
	}
	if j == i {
		return -1
	}
	return j
}

var (
	deepseekLead   = ^kindSet(kNewline, kUpper, kLower, kLetter, kPunct, kSymbol) // [^\r\n\p{L}\p{P}\p{S}]
	deepseekWord   = kindSet(kUpper, kLower, kLetter, kMark)                      // [\p{L}\p{M}]
	deepseekSymbol = kindSet(kPunct, kSymbol)                                     // [\p{P}\p{S}]
)

// deepseekMatcher matches deepseekPattern (DeepSeek-V3's third Split),
// trying the alternatives in its order:
//
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//	 ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// None matches at a number or a character of kind other (a control or
// format character, a private use or unassigned one) without a letter
// or mark after it.
type deepseekMatcher struct{}

func isASCIILetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func (deepseekMatcher) next(s string, i int) int {
	if c := s[i]; c < utf8.RuneSelf && deepseekSymbol.has(asciiKind[c]) && // ASCII punctuation
		i+1 < len(s) && isASCIILetter(s[i+1]) {
		j := i + 2
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j
	}
	k, w := kindAt(s, i)
	if deepseekLead.has(k) && i+w < len(s) {
		if j := runOf(s, i+w, deepseekWord); j > i+w {
			return j
		}
	}
	if j := runOf(s, i, deepseekWord); j > i {
		return j
	}
	start := i // ?[\p{P}\p{S}]+[\r\n]*
	if s[i] == ' ' && i+1 < len(s) {
		if k2, _ := kindAt(s, i+1); deepseekSymbol.has(k2) {
			k, start = k2, i+1
		}
	}
	if deepseekSymbol.has(k) {
		j := runOf(s, start, deepseekSymbol)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	if k == kSpace || k == kNewline {
		return whitespace(s, i, true)
	}
	return -1
}
