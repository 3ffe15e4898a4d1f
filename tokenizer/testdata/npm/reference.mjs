// The independent implementation tokenizer/'s tests compare with: Hugging
// Face's tokenizers.js (@huggingface/tokenizers), run on the same
// tokenizer.json. Run by reference_test.go and bench_test.go:
//
//   node reference.mjs encode TOKENIZER_JSON ITEMS_JSON
//     ITEMS_JSON: [{"text": "...", "special": true|false}, ...]
//     prints {"ids": [[...], ...], "texts": [...]}: each text's ids, with
//     the post-processor's special tokens when "special" is true, and the
//     text decode gives for those ids (special tokens kept, no clean-up of
//     spaces, as Hugging Face's Rust tokenizers decode).
//   node reference.mjs bench TOKENIZER_JSON ITEMS_JSON REPEATS
//     encodes every text once to warm the cache, then REPEATS times more,
//     timed; prints {"bytes": B, "seconds": S, "mb_per_s": B/S/1e6,
//     "cpu_seconds": C, "cpu_mb_per_s": B/C/1e6}, B the UTF-8 bytes encoded
//     in the timed passes, S their wall time, C their CPU time (user and
//     system, all threads).
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "node:fs";

const [mode, tokenizerPath, itemsPath, repeatsArg] = process.argv.slice(2);
if (!["encode", "bench"].includes(mode) || !tokenizerPath || !itemsPath) {
  console.error("usage: node reference.mjs encode|bench TOKENIZER_JSON ITEMS_JSON [REPEATS]");
  process.exit(2);
}
const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
const items = JSON.parse(fs.readFileSync(itemsPath, "utf8"));
const encode = (it) => tokenizer.encode(it.text, { add_special_tokens: it.special }).ids;

const decode = (ids) => ids.length === 0 ? "" :
  tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });

if (mode === "encode") {
  const ids = items.map(encode);
  process.stdout.write(JSON.stringify({ ids, texts: ids.map(decode) }));
} else {
  const repeats = Number(repeatsArg ?? 3);
  items.forEach(encode);
  const bytes = items.reduce((n, it) => n + Buffer.byteLength(it.text, "utf8"), 0) * repeats;
  const start = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  for (let r = 0; r < repeats; r++) items.forEach(encode);
  const cpu = process.cpuUsage(cpu0);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  process.stdout.write(JSON.stringify({
    bytes, seconds, mb_per_s: bytes / seconds / 1e6,
    cpu_seconds: cpuSeconds, cpu_mb_per_s: bytes / cpuSeconds / 1e6,
  }));
}
