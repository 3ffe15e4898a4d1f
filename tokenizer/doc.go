// Package tokenizer turns text into token ids and back.
//
// It owns three kinds of tokenizer behind one type, *Tokenizer: the byte
// tokenizer (Bytes: 256 ids, id i is byte i; what Strata trained on before
// it read models), and the two kinds of BPE a Hugging Face tokenizer.json
// holds (Load): byte-level BPE (GPT-2, Llama-3, Qwen2, DeepSeek-V3,
// gpt-oss) and BPE over characters with byte fallback, SentencePiece's
// kind (Llama 2, Mistral, Gemma 2 and 3, Phi-3).
//
// # What Load reads
//
// The arithmetic first: Llama-3's tokenizer.json is 9 MB (128,000 tokens,
// 280,147 merges), Qwen2's 11 MB, Gemma 3's 33 MB (262,144 tokens, 514,906
// merges); loading one takes a second or a few and keeps
// some tens of MB (the vocabulary both ways and the merge table). Every
// part is checked at Load, and anything outside this list is refused with
// one error that names the JSON path and value (errors.Is ErrUnsupported):
//
//   - model: BPE; vocab; merges by rank, as "a b" strings or ["a", "b"]
//     pairs; ignore_merges (Llama-3, gpt-oss: a piece that is a whole token
//     is that token). When the pre-tokenizer ends in ByteLevel the
//     vocabulary is in the byte-level alphabet (every one of the 256 bytes
//     has a token). Otherwise the model starts from characters: a
//     character without a token is, with byte_fallback, its UTF-8 bytes as
//     tokens <0xAB>, else unk_token (one for a run with fuse_unk), else
//     nothing. Not WordPiece, Unigram, dropout or subword affixes.
//   - added_tokens, special or not: found in the text before anything else,
//     leftmost and longest first, in the raw text or, for those marked
//     normalized, in the normalizer's output as the normalizer writes them.
//     Not lstrip, rstrip, single_word (no file here sets them).
//   - normalizer: none, NFC, NFD, NFKC, NFKD, Replace (a String or a Regex
//     pattern), Prepend (Llama 2's "▁"), Strip, or a Sequence of them.
//   - pre_tokenizer: ByteLevel (add_prefix_space, use_regex; the last),
//     Split (a Regex or String pattern; behavior Isolated, Removed,
//     MergedWithPrevious or MergedWithNext), Metaspace (replacement,
//     prepend_scheme first, always or never, or the older
//     add_prefix_space; split), or a Sequence of them.
//   - post_processor: ByteLevel (offsets only), TemplateProcessing (its
//     single template: the ids around $A that Encode adds when asked to:
//     <s> for Llama 2, <bos> for Gemma), or a Sequence of them. BOS and EOS
//     are the template's single ids before and after $A, else
//     tokenizer_config.json's bos_token and eos_token when that file lies
//     beside tokenizer.json.
//   - decoder: ByteLevel for a byte-level vocabulary; over characters
//     Replace (a String pattern), ByteFallback, Fuse, Strip (content,
//     start, stop), Metaspace, or a Sequence of them.
//
// truncation and padding are not read: Encode returns all of the text, and
// the caller cuts it into windows.
//
// # Encode and Decode
//
// Encode finds the added tokens, normalizes and pre-tokenizes the text
// between them, and merges each piece: starting from one token per byte (or
// per character), the adjacent pair of lowest merge rank merges first, at
// its leftmost place, until no pair has a rule (Hugging Face's
// Word::merge_all). The ids of pieces up to 256 bytes are cached (bounded;
// see cache), so a frequent word is merged once. Over characters a piece is
// merged word by word, cut before each "▁" where no token of the vocabulary
// spans the cut (wordCut), which gives the ids of the whole piece: Llama
// 2's and Gemma 3's pre-tokenizers leave the text between added tokens
// whole. Decode maps each id back to its bytes: for byte-level tokens
// Decode(Encode(x)) == x for any bytes x, valid UTF-8 or not (after NFC
// where the file asks for it); an added token decodes to its content. Over
// characters Decode runs the file's decoder on the tokens' spellings, as
// Hugging Face does (Llama 2: ▁ becomes a space, <0xAB> tokens their bytes,
// one leading space is cut), except that byte tokens that are not UTF-8
// give their bytes, not U+FFFD. Both are safe for concurrent use.
//
// # Pre-tokenizer regexes
//
// The Split patterns of the byte-level families use lookahead (\s+(?!\S)),
// which Go's regexp does not have. The seven known patterns (gpt2Pattern,
// llama3Pattern, qwen2Pattern, o200kPattern of gpt-oss, and DeepSeek-V3's
// three; GPT-2's is also what ByteLevel's use_regex runs) are matched by
// hand-written code that tries the alternatives in the pattern's order:
// on the test corpus it is about 40 times as fast as
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
