// Package data turns data files into the rows a training step reads.
//
// Raw text is drawn from in random windows; JSONL examples are tokenized once
// into a token file and packed into rows, with the loss only on what the
// model should learn to say; held-out files become evaluation sets.
//
// # The arithmetic
//
// A fine-tuning set of 10 GB of JSONL is about 2.5G tokens. Held as int32
// ids with a bool per token it would take 12.5 GB of RAM; in the token
// file, at the width the vocabulary needs (1 byte up to 256 ids, 2 up to
// 65536: Llama-3's 128256 and Qwen2's 152064 take 4), it takes 10 GB of
// disk plus a bit per token and 8 bytes per example, and the process keeps
// none of it: each row is a few preads (an example's span, its ids, its
// bits) of the page cache. A row of 2048 tokens is read in about 35 µs on
// this machine (BenchmarkPackedRows: 55-60M tokens/s), under a thousandth
// of the step that consumes it for a 7B model on an H200 (about 24k
// tokens/s), and the page cache holds the token file at 1-4 bytes a token.
//
// # Formats (Open, DetectFormat)
//
// A file is Parquet when it begins and ends with "PAR1", Arrow when it
// begins with the IPC file's "ARROW1" or a stream's 0xFFFFFFFF
// continuation marker, whatever its name; else JSONL when its name ends
// in .jsonl, .json-lines or .jsonlines, or when its first line is a JSON
// object with a convention's key; else raw text, unless its first 64 KiB
// hold a NUL byte: then it is refused (ErrBinary), never trained on as
// text. Each JSONL line, and each row of a table, is one example, read in
// one of five conventions (Convention) by one mapping (encoder.example),
// so that a row and the same JSONL line give the same ids; blank lines
// are skipped, other keys and columns ignored:
//
//	{"text": T}                       T with the tokenizer's special tokens
//	                                  (BOS for Llama-3), then EOS: all trained
//	{"prompt": P, "completion": C}    P with them, not trained; C without,
//	                                  then EOS: trained
//	{"messages": [{"role", "content"}, ...]}
//	                                  the chat template's rendering: the
//	                                  assistant's messages (and the
//	                                  template's end of their turns) trained
//	{"conversations": [{"from", "value"}, ...]}  (ShareGPT)
//	                                  the chat of the messages {role, value}:
//	                                  human and user are user; gpt,
//	                                  assistant, bot and chatgpt assistant;
//	                                  system and tool themselves (another
//	                                  "from" is an error naming it)
//	{"instruction": I, "input": X, "output": O, "system": S}  (Alpaca)
//	                                  the chat [system S when not empty],
//	                                  user I (I + "\n" + X when X is not
//	                                  empty, as LLaMA-Factory joins them),
//	                                  assistant O
//
// A line or row holding two conventions is an error, but for a "text"
// beside Alpaca's fields (the prompt tatsu-lab/alpaca renders from them,
// not read). Options.Columns (--data-columns) names the fields where a
// file holds them under other names ("prompt=question,completion=answer",
// "messages=dialog,role=speaker,content=text"), JSONL and tables alike.
//
// EOS is added when the tokenizer has one (the byte-level tokenizer has
// none). An example without a trained target (an empty completion, a
// conversation without the assistant) is left out and counted
// (Stats.Skipped), and so is a table's row with a null where its
// convention needs a value (Stats.Nulls); a file without any is an error
// (ErrEmpty). A bad line is one error naming the file, the line and what
// is wrong: a line that is not UTF-8 is refused with the offset of its
// first bad byte (never read with U+FFFD in its place); a UTF-8
// byte-order mark before the first line is skipped, as Python's utf-8-sig
// skips it. Raw text gets no special tokens; with the byte-level
// tokenizer it is read in place (model.FileCorpus), with any other it is
// tokenized into a token file a chunk at a time, cut where the
// pre-tokenizers split anyway.
//
// # Tables (Parquet, Arrow)
//
// Hugging Face's data sets come as Parquet shards and as directories of
// datasets.save_to_disk. Open takes a Parquet or Arrow file, a directory
// or a glob of shards (in the order of their names), or a save_to_disk
// directory (the Arrow stream files its state.json lists, in order; of a
// DatasetDict, the first of Options.Splits it has: train for training,
// validation else test for evaluation). The first file's columns decide
// the convention; every column it reads is type-checked against it (a
// string is string, large_string or dictionary-encoded; a conversation a
// list of structs) before a row is read. The files are read with
// apache/arrow-go (pqarrow a Parquet row group at a time, 1,024 rows at
// a time within it; arrow/ipc an Arrow record batch at a time), only the
// convention's columns, and each
// row is tokenized as the JSONL line would be. A file without a usable
// column (its columns named), a column of another type (the types found
// and wanted), a damaged page (the file, row group and column) and a
// file state.json names that is missing are each one error.
//
// # Chat templates (ChatTemplate, LoadChatTemplate)
//
// A model's chat template comes from its tokenizer_config.json (or
// chat_template.jinja), rendered as Hugging Face's apply_chat_template
// renders it, by an interpreter of the Jinja that chat templates use
// (internal/jinja; the real templates of Llama 3, 3.1 and 3.2, Qwen2, Qwen2.5
// and Qwen3, Gemma 2 and 3, Mistral and Mixtral, Phi-3, 3.5, 4 and
// 4-mini and DeepSeek-V3 in testdata/templates, README there for their
// sources, render to the byte as Jinja2 does, their raised errors
// included (template_families_test.go); why not a Jinja library is the
// last section). Macros are built (named parameters with defaults, Jinja2's
// scoping, at most 100 calls deep); strftime_now is defined only through
// ChatTemplate.WithDate, so that training data does not depend on the day.
// A template using what the interpreter lacks (call blocks, a macro's
// varargs, kwargs or caller, a filter or test not listed in
// internal/jinja/filters.go) is refused when it is loaded, naming the line, and a
// str method it lacks when it is called, naming it; without a template the
// default is ChatML (ChatMLTemplate); an empty template (chat_template "",
// an empty chat_template.jinja) and a template file that is not UTF-8 text
// are refused, naming the file. The assistant's tokens are found by
// rendering prefixes: the conversation before each assistant message with
// the generation prompt must begin the conversation up to it, which must
// begin the whole, and what the message adds is trained. A template that
// renders earlier turns differently once later ones follow (Qwen3's think
// block on the last turn, Phi-3's eos_token at the end only, Mixtral
// 8x22B's system message in the last user turn) is rendered once more with
// each assistant's content replaced by a sentinel: the text between the
// sentinels must be the text between the contents in the whole rendering,
// and each content there is trained with its end of turn, the text that
// follows it both there and where the message ends the conversation, less
// a marker begun and not closed ('<' of Phi-3's "<|user|>" and "</s>");
// the text before the content (a header, a think block) is not. A
// template that changes or repeats the content, reads it (a <think> block
// in Qwen3's; reasoning_content is read apart) or ends no turn is refused,
// naming the message.
//
// A template comes with the model, so it is untrusted input: its parser
// and renderer are fuzzed (FuzzParseTemplate, FuzzRenderTemplate, seeded
// with testdata/templates), blocks, brackets and "not"s nested past 200
// are refused when it is parsed, and expressions and values nested past
// 1000 (a chain of operators or filters, a list in a list, a namespace
// holding itself) when it renders (Jinja2 refuses about 100 nested blocks
// or brackets and 1000-long chains itself).
//
// # The budget of a rendering (internal/jinja/budget.go)
//
// Each rendering has one budget, charged before the work where its size
// is known beforehand; past its steps or bytes the rendering ends with an
// error wrapping ErrTemplateBudget that names the bound, and range
// refuses more items with an error of its own, as Jinja2's does:
//
//	steps   10,000,000   every statement, loop iteration and expression,
//	                     every item an operation visits (==, <, in, join,
//	                     select, map, tojson, repr), every 64 bytes a search
//	                     scans (in, find, count, replace, startswith, a dict
//	                     key hashed) and every 16 bytes a walk over
//	                     characters takes (length, s[i])
//	bytes   256 MiB      every string, list and dict built, kept or not,
//	                     at its size in memory (16 bytes an item of a list):
//	                     repeat (*), concatenation (~, +), range, slices,
//	                     literals, each filter's and method's result (join,
//	                     replace, upper, tojson, split, list, ...), repr,
//	                     and the output; four times the largest line
//	range   100,000      items, as in Jinja2's sandbox (its MAX_RANGE)
//
// A text grows by doubling, so a rendering allocates at most about twice
// its bytes (TestTemplateBudget counts every allocation of each hostile
// template, runtime.MemStats.TotalAlloc). Integers are int64: a result
// past it (+, -, *, //, **, unary -, abs, int of a float or of a string)
// is an error, never a wrapped number (Python's would go on). The stop
// signal (the context given to Render, Options.Context when tokenizing)
// is looked at every 1024 steps, so a cancelled rendering ends within
// milliseconds with an error wrapping the context's (TestTemplateStops).
//
// # The token file
//
// Open tokenizes a JSONL file or a table in one streaming pass (a line,
// a row group or record batch at a time) into a token file (tokfile.go: ids at the vocabulary's width, a loss
// bit per token, an offset per example) in Options.Dir, the run's
// directory by default of cmd, so that it lands on the run's disk; its name
// is removed at once, so a crash leaves nothing, and it lives while open.
// Options.Context stops the pass (a signal asking the run to stop): it is
// looked at every line of JSONL, every 1 MiB chunk of raw text, and every
// row group or record batch and 4096 rows of one, and Open returns an
// error wrapping context.Canceled (TestOpenStops, TestTableStops).
//
// # Packing (Packed)
//
// Each epoch takes the examples in an order shuffled from (seed, epoch)
// by a Feistel permutation (no table: O(1) memory for any number of
// examples) or in file order, and packs them greedily (next fit) into rows
// of seq columns. An example of L tokens takes L-1 columns; one longer
// than seq+1 tokens is split into pieces of seq+1 tokens overlapping by
// one, each starting at position 0 (a piece sees nothing of the pieces
// before it; no target is lost). Batch.Pos restarts at each example, piece
// and the padding; targets are model.IgnoreTarget where the loss bit is
// clear, at each example's last token and in padding. Row g is a function
// of (file, seq, seed, shuffle, g) alone, so every rank, stage and way of
// splitting a global batch reads the same rows, and a resumed run reads
// what the uninterrupted one read; epochs follow each other without end.
//
// # Evaluation sets (EvalSet)
//
// A held-out file is a fixed list of rows: JSONL packed in file order,
// raw text cut into consecutive windows of seq (the last one shorter);
// rows past its end are padding without targets.
//
// # Memory
//
// Nothing grows with the data file but the token file on disk: the JSONL
// pass holds one line, a table's one row group or record batch of the
// columns it reads (TestTableStreams counts the batches held, and every
// byte arrow-go holds through a counting allocator: under an eighth of a
// 40-row-group file's text, about two row groups'), rows are read in windows with pread (not mmap:
// mapped pages would count in the process's RSS, and an address-space
// limit would refuse a mapping larger than it), and the permutation and
// the packing cursor are a few words. TestStreamedMemory measures it in a
// child process (its VmHWM): tokenizing a 256 MiB JSONL file and reading
// every row of two shuffled epochs peaks at 15-19 MiB of RSS, as the same
// work on an 8 MiB file does (14-17 MiB); `strata train` on 512 MiB of
// JSONL peaks at 28-40 MiB, on 16 MiB at 25-31 (TestTrainJSONLRSS; the
// spread, run to run, is the garbage collector's lag on a loaded machine,
// which the tests bound with GOMEMLIMIT=32MiB).
//
// # No cache of tokenized examples (ristretto)
//
// The design card names ristretto for a cache of tokenized examples. It
// does not pay, measured: a random example of about 2100 tokens comes from
// the token file in the page cache at 120-170M tokens/s (13-17 µs), from a
// ristretto cache in 160 ns; but a training step needs one global batch
// of rows, read at 55-60M tokens/s (35 µs a row of 2048, most of it
// copying tokens into the batch, which a cache would not save), while
// even GPT-2 124M on an H200 trains about 1M tokens/s: the reads are under
// 4 % of its step and a thousandth of a 7B model's. And the cache could
// only hit on examples read before, that is in a later epoch, so its hit
// rate is its size over the dataset's: it would have to hold the dataset
// in RAM (5 bytes a token decoded) to pay at all, which is what streaming
// avoids; the page cache already keeps the token file, at 1-4 bytes a
// token, with the kernel deciding what stays. (Measured with a scratch
// module and ristretto v2.4.2; the module is not a dependency.)
//
// # No Jinja library (ardanlabs/jinja)
//
// github.com/ardanlabs/jinja, a zero-dependency Go Jinja made for chat
// templates (ordered dicts, Hugging Face's tojson, trim_blocks and
// lstrip_blocks), would replace the interpreter's 3,000 lines, but it does
// not render what Jinja2 renders. Put behind the same rendering (the
// conversation decoded in order, its values handed over as the library's
// ordered values) and run through TestTemplatesMatchJinja, v1.8.0 (the
// newest that builds with this Go) rendered the 90 renderings of the real
// templates checked then (Llama-3, Llama-3.1, Qwen2, Qwen2.5, Mistral, ChatML) to the
// byte, the four raised errors included, and none of the 10 of
// features.jinja, each of which it refuses ({%+ on line 11):
//
//	template/conversation[/gen]   Jinja2 (and the interpreter)                                 ardanlabs
//	features.jinja/user           966 bytes: "  [1/1 r1 0 True True odd]  USER: Hi There / 2 words…"  error: line 11: unknown statement ""
//	features.jinja/user/gen       966 bytes: "  [1/1 r1 0 True True odd]  USER: Hi There / 2 words…"  error: line 11: unknown statement ""
//	features.jinja/system         1093 bytes: "  [1/2 r2 1 True False odd] next=assistant  USER: What…"  error: line 11: unknown statement ""
//	features.jinja/system/gen     1093 bytes: "  [1/2 r2 1 True False odd] next=assistant  USER: What…"  error: line 11: unknown statement ""
//	features.jinja/turns          1368 bytes: "  [1/4 r4 3 True False odd] next=assistant  USER: Hello…" error: line 11: unknown statement ""
//	features.jinja/turns/gen      1368 bytes: "  [1/4 r4 3 True False odd] next=assistant  USER: Hello…" error: line 11: unknown statement ""
//	features.jinja/tool           1354 bytes: "  [1/4 r4 3 True False odd] next=assistant  USER: Weath…" error: line 11: unknown statement ""
//	features.jinja/tool/gen       1354 bytes: "  [1/4 r4 3 True False odd] next=assistant  USER: Weath…" error: line 11: unknown statement ""
//	features.jinja/unicode        1229 bytes: "  [1/2 r2 1 True False odd] next=assistant  USER: Ünïcö…" error: line 11: unknown statement ""
//	features.jinja/unicode/gen    1229 bytes: "  [1/2 r2 1 True False odd] next=assistant  USER: Ünïcö…" error: line 11: unknown statement ""
//
// Rendered one construct at a time (each expression of features.jinja
// alone, with the tool conversation, against Jinja2), it differs in these,
// one of them a panic:
//
//	template                                   Jinja2                      ardanlabs
//	"a\n" (a file ending in a newline)         "a"                         "a\n"
//	"  {%+ if true %}x{% endif %}"             "  x"                       ""
//	{{ -7 // 2 }} {{ -7 % 3 }}                 -4 2                        -3 -1
//	{{ 1.5 * 2 }} {{ 100.0 }} {{ 10 / 5 }}     3.0 100.0 2.0               3 100 2
//	{{ -0.0 }} {{ 1.0 | tojson }}              -0.0 1.0                    -0 1
//	{{ 1e20 }} {{ 1e-5 }}                      1e+20 1e-05                 parse error
//	{{ "a" "b" 'c' }}                          abc                         parse error
//	{{ '\u00e9\x41' }}                         éA                          \u00e9\x41
//	{{ 'a' ~ none }} {{ none | string }}       aNone None                  a ""
//	{{ none | default('k') }} {{ {}.get('z') }} None None                  "" ""
//	{{ (1, 'a') }} {{ (1,) }}                  (1, 'a') (1,)               [1, 'a'] [1]
//	{{ {'b': 1, 'a': 2} | items | list }}      [('b', 1), ('a', 2)]        [['b', 1], ['a', 2]]
//	{{ true == 1 }} {{ [1, 2] < [1, 3] }}      True True                   False False
//	{{ 4 is divisibleby 2 }}, divisibleby(3)   True, False                 parse error, unknown test
//	{{ "they're here".title() }}               They'Re Here                They're Here
//	{{ 'a b c'.split(' ', 1) }}                ['a', 'b c']                ['a', 'b', 'c']
//	{{ '-'.join(['a', 'b']) }}                 a-b                         error: not callable
//	m.content.startswith(('W', 'I'))           True for "Weather…"         False
//	{{ 'abc' | last }} {{ -3 | abs }}          c 3                         "" -3
//	{{ [0, 1, '', 'x'] | select | list }}      [1, 'x']                    panic: slice bounds out of range
//	{{ {'x': [1], 'e': []} | tojson(indent=2) }} keys x, e                 keys e, x (sorted)
//	tojson(ensure_ascii=true), sort_keys=true  "\u00fc", keys sorted       "ü", keys in order
//	{{ loop.index }}, {{ ns.x }}, {{ a + b }}  UndefinedError (undefined)  "", "", 0
//
// The interpreter renders all of them as Jinja2 does (features.jinja is
// in TestTemplatesMatchJinja), so it stays; a library would be worth
// trying again when it renders testdata/templates to the byte. (Measured
// with a scratch module and ardanlabs/jinja v1.8.0; v1.11.0 and later
// need a newer Go; the module is not a dependency.)
package data
