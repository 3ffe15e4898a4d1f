// Package tokenizer turns text into token ids and back. It owns two kinds
// of tokenizer behind one type, *Tokenizer: the byte tokenizer (Bytes: 256
// ids, id i is byte i; what Strata trained on before it read models) and
// the byte-level BPE of a Hugging Face tokenizer.json (Load: GPT-2,
// Llama-3, Qwen2 and the models that share their tokenizers).
//
// # What Load reads
//
// The arithmetic first: Llama-3's tokenizer.json is 9 MB (128,000 tokens,
// 280,147 merges), Qwen2's 11 MB; loading one takes about a second and
// keeps some tens of MB (the vocabulary both ways and the merge table).
// Every part is checked at Load, and anything outside this list is refused
// with one error that names the JSON path and value (errors.Is
// ErrUnsupported):
//
//   - model: BPE over the byte-level alphabet (every one of the 256 bytes
//     has a token); vocab; merges by rank, as "a b" strings or ["a", "b"]
//     pairs; ignore_merges (Llama-3: a piece that is a whole token is that
//     token). Not WordPiece, Unigram, dropout, byte_fallback or subword
//     affixes.
//   - added_tokens, special or not: found in the text before anything else,
//     leftmost and longest first, in the raw text or, for those marked
//     normalized, after the normalizer. Not lstrip, rstrip, single_word.
//   - normalizer: none, NFC (Qwen2), or a Sequence of them.
//   - pre_tokenizer: ByteLevel (add_prefix_space, use_regex), Split
//     (behavior Isolated, a Regex or String pattern), or a Sequence of
//     them ending in ByteLevel.
//   - post_processor: ByteLevel (offsets only), TemplateProcessing (its
//     single template: the ids around $A that Encode adds when asked to),
//     or a Sequence of them. BOS and EOS are the template's single ids
//     before and after $A, else tokenizer_config.json's bos_token and
//     eos_token when that file lies beside tokenizer.json.
//   - decoder: ByteLevel.
//
// truncation and padding are not read: Encode returns all of the text, and
// the caller cuts it into windows.
//
// # Encode and Decode
//
// Encode finds the added tokens, normalizes and pre-tokenizes the text
// between them, and merges each piece: starting from one token per byte,
// the adjacent pair of lowest merge rank merges first, at its leftmost
// place, until no pair has a rule (Hugging Face's Word::merge_all). The ids
// of pieces up to 256 bytes are cached (bounded; see cache), so a frequent
// word is merged once. Decode maps each id back to its bytes: for
// byte-level tokens Decode(Encode(x)) == x for any bytes x, valid UTF-8 or
// not (after NFC where the file asks for it); an added token decodes to
// its content. Both are safe for concurrent use.
//
// # Pre-tokenizer regexes
//
// The Split patterns of the three families use lookahead (\s+(?!\S)),
// which Go's regexp does not have. The three patterns (gpt2Pattern,
// llama3Pattern, qwen2Pattern; GPT-2's is also what ByteLevel's use_regex
// runs) are matched by hand-written code that tries the alternatives in
// the pattern's order: on the test corpus it is about 40 times as fast as
// github.com/dlclark/regexp2 running the same pattern
// (BenchmarkPreTokenize; figures in README.md), and a dataset pipeline
// spends most of its time there. Any other pattern runs on regexp2, so an
// unknown tokenizer still works. regexp2 is also the oracle: the tests
// compare the hand-written matchers with it on the corpus, on random
// strings and in a fuzz target. Character classes are Oniguruma's (what
// Hugging Face's Rust tokenizers use): \s is Unicode's White_Space, \p{L}
// and \p{N} Go's unicode tables; a byte that is not valid UTF-8 is one
// character of no class. One known difference from regexp2 (and from
// tokenizers.js): (?i:'s) also takes 'ſ, as Oniguruma's case folding does.
package tokenizer
