package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// pieces returns the pieces sp cuts s into.
func pieces(sp splitter, s string) []string {
	var out []string
	sp.split(s, func(p string, _ bool) { out = append(out, p) })
	return out
}

// knownPatterns are the patterns with hand-written matchers.
var knownPatterns = []struct {
	name, pattern string
	hand          splitter
}{
	{"gpt2", gpt2Pattern, gpt2Splitter{}},
	{"llama3", llama3Pattern, llamaSplitter{maxDigits: 3}},
	{"qwen2", qwen2Pattern, llamaSplitter{maxDigits: 1}},
	{"o200k", o200kPattern, matchSplitter{o200kMatcher{}}},
	{"deepseek-digits", deepseekDigitsPattern, matchSplitter{digitsMatcher{}}},
	{"deepseek-cjk", deepseekCJKPattern, matchSplitter{cjkMatcher{}}},
	{"deepseek", deepseekPattern, matchSplitter{deepseekMatcher{}}},
}

// split is one piece of a splitter's output and whether it is a match.
type split struct {
	piece   string
	matched bool
}

func (s split) String() string { return fmt.Sprintf("%q:%v", s.piece, s.matched) }

// splits returns the pieces sp cuts s into, with whether each matched.
func splits(sp splitter, s string) []split {
	var out []split
	sp.split(s, func(p string, m bool) { out = append(out, split{p, m}) })
	return out
}

// knownRegexp2 are knownPatterns compiled by regexp2, once.
var knownRegexp2 = sync.OnceValue(func() []regexSplitter {
	var res []regexSplitter
	for _, p := range knownPatterns {
		re, err := compileRegexp2(p.pattern)
		if err != nil {
			panic(err)
		}
		res = append(res, re)
	}
	return res
})

// regexp2Differs are the texts on which regexp2 (.NET semantics) and
// Oniguruma disagree, so the hand-written matchers follow Oniguruma:
// (?i:'s) takes 'ſ' (U+017F, which case-folds to 's'), .NET's case
// insensitivity does not.
func regexp2Differs(s string) bool { return strings.Contains(s, "ſ") }

// checkAgainstRegexp2 wants the hand-written matcher's pieces of s to be
// regexp2's for the same pattern, and to cover s.
func checkAgainstRegexp2(t testing.TB, s string) {
	for i, p := range knownPatterns {
		re := knownRegexp2()[i]
		got := splits(p.hand, s)
		joined := ""
		for _, g := range got {
			joined += g.piece
		}
		if joined != s {
			t.Fatalf("%s: the pieces of %q do not cover it: %+q", p.name, s, got)
		}
		if want := splits(re, s); !regexp2Differs(s) && !slices.Equal(got, want) {
			t.Fatalf("%s: %q: hand-written %v, regexp2 %v", p.name, s, got, want)
		}
	}
}

// TestPreTokenizeAgainstRegexp2 compares the hand-written matchers with
// regexp2 running the same patterns, on the corpus and on random strings
// of the characters the patterns tell apart (and invalid UTF-8).
func TestPreTokenizeAgainstRegexp2(t *testing.T) {
	text, random := corpusParts(t)
	for _, d := range append(text[:20], random[:40]...) {
		checkAgainstRegexp2(t, d)
	}
	chars := []string{"a", "Z", "é", "中", "ǅ", "1", "٣", "²", "Ⅻ", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000",
		"\u0085", "\u2028", "\ufeff", "\u200b", "'", "'s", "'S", "'re", "'Ll", "'d", "'x", "!", ".", "-", "\u0301", "🎉", "\xff", "\xe4\xb8",
		// The classes o200k's and DeepSeek-V3's patterns add: letters by
		// case (Lu, Ll, Lt, Lm, Lo), marks (Mn, Mc, Me), punctuation and
		// symbols, '/', controls and format characters, private use, the
		// edges of DeepSeek's CJK ranges, ASCII punctuation before letters.
		"É", "ß", "ʰ", "ا", "あ", "ア", "龥", "龦", "\u3040", "ゟ", "゠", "ヿ", "㐀", "\u0903", "\u20dd", "、", "«", "€", "©",
		"^", "`", "/", "//", "$", "\x01", "\u00ad", "\ue000", "\U000E0041", "'VE", "'LL", "_x", ".A", "ǅa", "Aé", "aA"}
	rng := rand.New(rand.NewPCG(5, 5))
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(chars[rng.IntN(len(chars))])
		}
		checkAgainstRegexp2(t, b.String())
	}
}

// FuzzPreTokenize: the hand-written matchers against regexp2 on any input
// (go test -fuzz FuzzPreTokenize ./tokenizer; plain go test runs the
// seeds).
func FuzzPreTokenize(f *testing.F) {
	for _, s := range []string{"", "Hello world's  \t\n\n  x", "a\u00a0b 123456 你好 🎉", " \r\n\r\n x", "'S'LL'Re", "\xff\xfe ab"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkAgainstRegexp2(t, s) })
}

// TestPreTokenizeCases pins pieces the patterns' alternatives decide.
func TestPreTokenizeCases(t *testing.T) {
	gpt2, llama, qwen := gpt2Splitter{}, llamaSplitter{maxDigits: 3}, llamaSplitter{maxDigits: 1}
	for _, c := range []struct {
		sp   splitter
		in   string
		want []string
	}{
		{gpt2, "Hello world's", []string{"Hello", " world", "'s"}},
		{gpt2, "I'M  fine\n\n x", []string{"I", "'", "M", " ", " fine", "\n\n", " x"}},
		{gpt2, "a   b", []string{"a", "  ", " b"}},
		{gpt2, "x \t", []string{"x", " \t"}},
		{gpt2, " 12345!?", []string{" 12345", "!?"}},
		{llama, "I'M  fine\n\n x", []string{"I", "'M", " ", " fine", "\n\n", " x"}},
		{llama, "x'ſx", []string{"x", "'ſ", "x"}},
		{llama, " 12345", []string{" ", "123", "45"}},
		{llama, "a.b\t c", []string{"a", ".b", "\t", " c"}},
		{llama, "  \n  x", []string{"  \n", " ", " x"}},
		{llama, "!!\r\n\r\nx", []string{"!!\r\n\r\n", "x"}},
		{qwen, "2024", []string{"2", "0", "2", "4"}},
		// \s is White_Space: U+00A0 and U+0085 are spaces, U+FEFF and
		// U+200B are not (JavaScript's \s takes U+FEFF, leaves U+0085).
		{gpt2, "a\u00a0b", []string{"a", "\u00a0", "b"}},
		{gpt2, "a \ufeffb", []string{"a", " \ufeff", "b"}},
		{gpt2, "a\u0085\u0085b", []string{"a", "\u0085", "\u0085", "b"}},
		{llama, "a\u200bb", []string{"a", "\u200bb"}},
		// Invalid UTF-8 bytes are characters of class other.
		{llama, "a\xff\xfe b", []string{"a", "\xff\xfe", " b"}},
	} {
		if got := pieces(c.sp, c.in); !slices.Equal(got, c.want) {
			t.Errorf("%T %q: %q, want %q", c.sp, c.in, got, c.want)
		}
	}
}

// TestUnknownPatternAndLiteral: a pattern with no hand-written matcher
// runs on regexp2 (rune offsets mapped back to bytes, invalid UTF-8
// included); a String pattern splits on the string.
func TestUnknownPatternAndLiteral(t *testing.T) {
	sp, err := newRegexSplitter(`\p{N}{1,2}|[^\p{N}]+`)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sp.(regexSplitter); !ok {
		t.Fatalf("%T, want regexSplitter", sp)
	}
	if got, want := pieces(sp, "ab12345é\xff٣٤٥"), []string{"ab", "12", "34", "5", "é\xff", "٣٤", "٥"}; !slices.Equal(got, want) {
		t.Errorf("regexp2: %q, want %q", got, want)
	}
	gaps, err := newRegexSplitter(`\d+`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pieces(gaps, "ab12cd3"), []string{"ab", "12", "cd", "3"}; !slices.Equal(got, want) {
		t.Errorf("regexp2 with gaps: %q, want %q", got, want)
	}
	if got, want := pieces(literalSplitter{"\n"}, "a\n\nb\n"), []string{"a", "\n", "\n", "b", "\n"}; !slices.Equal(got, want) {
		t.Errorf("literal: %q, want %q", got, want)
	}
	for _, p := range knownPatterns {
		sp, err := newRegexSplitter(p.pattern)
		if err != nil || sp != p.hand {
			t.Errorf("%s: %T %v, want the hand-written matcher", p.name, sp, err)
		}
	}
}
