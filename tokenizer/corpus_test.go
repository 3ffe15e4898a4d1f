package tokenizer

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// corpus is the text the reference comparison and the benchmarks encode,
// as documents: testdata/mixed.txt (prose, code in several languages,
// scripts, emoji, odd whitespace, written to cover the pre-tokenizer's
// cases), the repository's Markdown and Go sources (English prose and
// code), and generated documents that mix the hard cases at random.
// Deterministic for a given repository.
func corpus(t testing.TB) []string {
	text, random := corpusParts(t)
	return append(text, random...)
}

// corpusParts returns the corpus in two parts: the written text (mixed.txt
// whole and by paragraph, the repository's files) and the generated
// documents.
func corpusParts(t testing.TB) (text, random []string) {
	t.Helper()
	mixed, err := os.ReadFile("testdata/mixed.txt")
	if err != nil {
		t.Fatal(err)
	}
	text = []string{string(mixed)}
	text = append(text, strings.Split(string(mixed), "\n\n")...)
	text = append(text, repoDocs(t, 600<<10)...)
	rng := rand.New(rand.NewPCG(13, 3))
	for range 400 {
		random = append(random, randomDoc(rng, 50+rng.IntN(400)))
	}
	return text, random
}

// repoDocs returns the repository's Markdown and Go files, in path order,
// up to about limitBytes.
func repoDocs(t testing.TB, limitBytes int) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".md") || strings.HasSuffix(path, ".go")) {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(paths)
	// All the prose, and every k-th Go file so that the code of every
	// package comes in.
	var docs []string
	total, goFiles := 0, 0
	for _, p := range paths {
		if strings.HasSuffix(p, ".go") {
			goFiles++
			if goFiles%5 != 0 {
				continue
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
		if total += len(b); total >= limitBytes {
			break
		}
	}
	return docs
}

// atoms are the pieces randomDoc strings together: each is a case some
// pre-tokenizer or the merges treat specially.
var atoms = [][]string{
	{"the", "The", "THE", "quick", "Brown", "fox", "jumps", "over", "lazy", "dog", "tokenizer", "Strata", "offload", "naïve", "Straße", "İstanbul", "ǅemal", "café", "coöperate", "x", "a", "I"},
	{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'", "''", "'x", "’s", "don't", "WON'T", "y'all", "rock'n'roll", "'tis"},
	{"0", "7", "42", "123", "1234", "12345", "1234567890", "3.14", "1,000,000", "0x7fff", "٣٤٥", "１２３", "²³", "Ⅻ", "①", "½", "1st", "2nd", "x86_64", "v1.2.3"},
	{"中文", "我们在北京", "東京都", "ひらがな", "カタカナ", "안녕하세요", "Привет", "Ελληνικά", "مرحبا", "שלום", "नमस्ते", "สวัสดี", "Tiếng Việt", "\u200fשלום\u200e", "\u202bمرحبا\u202c"},
	{"😀", "🎉", "👍🏽", "👩\u200d👩\u200d👧", "🇫🇷", "1\ufe0f\u20e3", "❤\ufe0f", "🏳\ufe0f\u200d🌈", "🤖🤖🤖", "✈"},
	{"e\u0301", "a\u0308\u0323", "n\u0303", "\u0301", "o\u0336\u0336", "\u1100\u1161\u11a8", "Z\u0351\u0352"},
	{" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n ", "\t \n", "\u00a0", "\u3000", "\u2003", "\u0085", "\u2028", "\v", "\f", "    ", "        ", " \t\r\n "},
	{".", ",", "!", "?", "...", "!!!", "?!", "--", "—", "«", "»", "「", "」", "()", "{}", "[]", "->", "=>", "::", "==", "!=", "&&", "||", "#", "@", "$", "%", "^", "&", "*", "_", "~", "`", "\"", "\\", "/"},
	{"\u200b", "\u200d", "\ufeff", "\u2060", "\ufffd"},
	{"<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endof", "<|im_", "<|reserved_special_token_5|>"},
	{"func main() {", "return nil, err", "if x := f(); x != nil {", "def f(x):", "    return x * 2", "#include <stdio.h>", "SELECT * FROM t;", "console.log(`${x}`);", "fn main() -> Result<(), Box<dyn Error>>", "<div class=\"a\">", "$ ls -la | grep .go"},
}

// randomDoc strings n atoms together, with long runs (a piece the tree
// merges and the cache skips) now and then.
func randomDoc(rng *rand.Rand, n int) string {
	var b strings.Builder
	seps := []string{" ", " ", " ", "", "\n", "  ", "\t", "\r\n"}
	for range n {
		switch rng.IntN(60) {
		case 0:
			runs := []string{"a", "b", "🎉", " ", "\n", "9", "=", "\u00a0"}
			b.WriteString(strings.Repeat(runs[rng.IntN(len(runs))], 30+rng.IntN(300)))
		case 1:
			b.WriteString(strings.Repeat("xyzzy", 10+rng.IntN(80)))
		default:
			group := atoms[rng.IntN(len(atoms))]
			b.WriteString(group[rng.IntN(len(group))])
		}
		b.WriteString(seps[rng.IntN(len(seps))])
	}
	return b.String()
}
