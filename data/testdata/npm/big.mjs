// big.mjs writes a large chat data set for data/'s end-to-end tests, the
// same examples twice: as Parquet (one column messages:
// list<struct<role:string,content:string>>, zstd, dictionary encoding on,
// 8192 rows per row group, written by parquet-wasm) and as JSONL
// ({"messages": [...]} a line).
//
//   node data/testdata/npm/big.mjs OUT.parquet JSONL_OUT ROWS
//
// Each example has 3 to 6 messages (a system message first in a quarter of
// them, then user and assistant in turn) of English-like words, about 1 to 3
// KB in all, from fixed seeds: batch k of 8192 examples has its own seed, so
// the same ROWS give the same bytes whatever the number of cores, and a
// smaller ROWS gives a prefix of the examples. Worker threads generate the
// batches (BIG_THREADS of them, default the cores less one, at most 4); the
// main thread writes them in order, a few batches ahead of the Parquet writer
// at most, so memory stays bounded whatever ROWS is.
import fs from "node:fs";
import os from "node:os";
import { Worker, isMainThread, parentPort } from "node:worker_threads";
import {
  Field, List, RecordBatch, Schema, Struct, Table, Utf8, makeData, tableToIPC,
} from "apache-arrow";
import {
  Compression, Table as WasmTable, WriterPropertiesBuilder, transformParquetStream, writeParquet,
} from "parquet-wasm/node"; // the Node build (CommonJS, the wasm loaded synchronously)

const ROW_GROUP = 8192;

// writeAll writes all of b (a string or bytes) to the file descriptor fd.
function writeAll(fd, b) {
  const buf = typeof b === "string" ? Buffer.from(b) : b;
  for (let off = 0; off < buf.length;) off += fs.writeSync(fd, buf, off);
  return buf.length;
}

const die = (msg) => {
  console.error(`big.mjs: ${msg}`);
  process.exit(1);
};

// mulberry32: a small seeded PRNG, uniform in [0, 1).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = (
  "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by " +
  "word but what some we can out other were all there when up use your how said an each she which do their time " +
  "if will way about many then them write would like so these her long make thing see him two has look more day " +
  "could go come did number sound no most people my over know water than call first who may down side been now " +
  "find any new work part take get place made live where after back little only round man year came show every " +
  "good me give our under name very through just form sentence great think say help low line differ turn cause " +
  "much mean before move right boy old too same tell does set three want air well also play small end put home " +
  "read hand port large spell add even land here must big high such follow act why ask men change went light " +
  "kind off need house picture try us again animal point mother world near build self earth father head stand " +
  "own page should country found answer school grow study still learn plant cover food sun four between state " +
  "keep eye never last let thought city tree cross farm hard start might story saw far sea draw left late run " +
  "while press close night real life few north open seem together next white children begin got walk example " +
  "ease paper group always music those both mark often letter until mile river car feet care second book carry " +
  "took science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face " +
  "wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog family " +
  "direct pose leave song measure door product black short numeral class wind question happen complete ship " +
  "area half rock order fire south problem piece told knew pass since top whole king space heard best hour " +
  "better true during hundred five remember step early hold west ground interest reach fast verb sing listen " +
  "six table travel less morning ten simple several vowel toward war lay against pattern slow center love " +
  "person money serve appear road map rain rule govern pull cold notice voice unit power town fine certain fly " +
  "fall lead cry dark machine note wait plan figure star box noun field rest correct able pound done beauty " +
  "drive stood contain front teach week final gave green oh quick develop ocean warm free minute strong special " +
  "mind behind clear tail produce fact street inch multiply nothing course stay wheel full force blue object " +
  "decide surface deep moon island foot system busy test record boat common gold possible plane stead dry " +
  "wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes distant fill " +
  "east paint language among"
).split(" ");
const ONSETS = ["b", "br", "c", "ch", "d", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "pl", "r", "s", "sh", "st", "t", "th", "tr", "v", "w"];
const VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"];
const CODAS = ["", "", "n", "r", "s", "t", "nd", "st", "ng", "ck", "l", "m"];

// Examples generates the examples one by one from a fixed seed.
class Examples {
  constructor(seed) {
    const r = rng(seed);
    const pick = (a) => a[Math.floor(r() * a.length)];
    // 4096 invented words of one to three syllables, then a table that maps
    // a uniform draw to a word: Zipf-like, the common words far more often
    // than the rare ones, an invented word one time in twelve.
    const invented = [];
    for (let i = 0; i < 4096; i++) {
      let w = "";
      const n = 1 + Math.floor(r() * 3);
      for (let k = 0; k < n; k++) w += pick(ONSETS) + pick(VOWELS);
      invented.push(w + pick(CODAS));
    }
    this.table = [];
    for (let i = 0; i < 1 << 16; i++) {
      const u = (i + 0.5) / (1 << 16);
      this.table.push(u < 1 / 12 ? invented[Math.floor(u * 12 * invented.length)] : WORDS[Math.floor(WORDS.length * ((u - 1 / 12) * 12 / 11) ** 2.5)]);
    }
    this.capital = new Map([...new Set(this.table)].map((w) => [w, w[0].toUpperCase() + w.slice(1)]));
  }
  // seek starts batch k's examples.
  seek(k) {
    this.r = rng(Math.imul(k + 1, 0x9e3779b1) ^ 43);
  }
  text(bytes) {
    const r = this.r, table = this.table;
    let s = "", start = true;
    while (s.length < bytes) {
      const w = table[Math.floor(r() * 65536)];
      if (s) s += " ";
      s += start ? this.capital.get(w) : w;
      const u = r();
      start = u < 0.1;
      if (u < 0.08) s += "."; else if (u < 0.1) s += "?"; else if (u < 0.16) s += ",";
    }
    return start ? s : s.replace(/,?$/, ".");
  }
  next() {
    const r = this.r;
    const total = 1000 + Math.floor(r() * 2000);
    const n = 3 + Math.floor(r() * 4);
    const system = r() < 0.25;
    const weights = Array.from({ length: n }, () => 0.3 + r());
    const sum = weights.reduce((a, b) => a + b, 0);
    return weights.map((w, i) => {
      const role = system ? (i === 0 ? "system" : i % 2 ? "user" : "assistant") : (i % 2 ? "assistant" : "user");
      return { role, content: this.text(Math.max(8, Math.round((total * w) / sum))) };
    });
  }
}

// Bytes accumulates bytes in a Buffer of its own ArrayBuffer.
class Bytes {
  constructor(capacity) {
    this.buf = Buffer.allocUnsafe(Math.max(capacity, 8192));
    this.n = 0;
  }
  write(s) {
    const need = this.n + Buffer.byteLength(s);
    if (need > this.buf.length) {
      const b = Buffer.allocUnsafe(Math.max(need, this.buf.length * 2));
      this.buf.copy(b, 0, 0, this.n);
      this.buf = b;
    }
    this.n += this.buf.write(s, this.n);
  }
  // take returns the bytes written, a view of the ArrayBuffer to transfer.
  take() {
    return new Uint8Array(this.buf.buffer, this.buf.byteOffset, this.n);
  }
}

// Utf8Column accumulates the strings of one Utf8 Arrow array.
class Utf8Column {
  constructor(capacity, rows) {
    this.bytes = new Bytes(capacity);
    this.offsets = new Int32Array(rows + 1);
    this.len = 0;
  }
  push(s) {
    this.bytes.write(s);
    if (this.len + 1 === this.offsets.length) {
      const o = new Int32Array(this.offsets.length * 2);
      o.set(this.offsets);
      this.offsets = o;
    }
    this.offsets[++this.len] = this.bytes.n;
  }
  take() {
    return { offsets: this.offsets.subarray(0, this.len + 1), bytes: this.bytes.take() };
  }
}

// generate returns batch k of n examples: the JSONL text and the Arrow
// buffers of its messages column, each in its own ArrayBuffer.
function generate(examples, k, n) {
  examples.seek(k);
  const roles = new Utf8Column(n * 40, n * 6), contents = new Utf8Column(n * 3200, n * 6);
  const jsonl = new Bytes(n * 3400);
  const listOffsets = new Int32Array(n + 1);
  for (let i = 0; i < n; i++) {
    const msgs = examples.next();
    jsonl.write('{"messages":[');
    msgs.forEach((m, j) => {
      roles.push(m.role);
      contents.push(m.content);
      jsonl.write(`${j ? "," : ""}{"role":${JSON.stringify(m.role)},"content":${JSON.stringify(m.content)}}`);
    });
    jsonl.write("]}\n");
    listOffsets[i + 1] = listOffsets[i] + msgs.length;
  }
  return { n, jsonl: jsonl.take(), listOffsets, roles: roles.take(), contents: contents.take() };
}

const transfers = (b) => [b.jsonl.buffer, b.listOffsets.buffer, b.roles.offsets.buffer, b.roles.bytes.buffer,
  b.contents.offsets.buffer, b.contents.bytes.buffer];

function worker() {
  const examples = new Examples(43);
  parentPort.on("message", ({ k, n }) => {
    const b = generate(examples, k, n);
    parentPort.postMessage(b, transfers(b));
  });
}

// Generator hands out batches 0, 1, ... in order, made by worker threads,
// threads + 1 of them asked for ahead of the one taken.
class Generator {
  constructor(rows, threads) {
    this.rows = rows;
    this.next = 0; // the next batch to ask for
    this.pending = []; // promises of the batches asked for, in order
    this.workers = Array.from({ length: threads }, () => {
      const w = new Worker(new URL(import.meta.url));
      w.jobs = [];
      w.on("message", (b) => w.jobs.shift().resolve(b));
      w.on("error", (e) => { for (const j of w.jobs.splice(0)) j.reject(e); });
      return w;
    });
    for (let i = 0; i <= threads; i++) this.ask();
  }
  ask() {
    const k = this.next;
    const n = Math.min(ROW_GROUP, this.rows - k * ROW_GROUP);
    if (n <= 0) return;
    this.next++;
    const w = this.workers[k % this.workers.length];
    this.pending.push(new Promise((resolve, reject) => {
      w.jobs.push({ resolve, reject });
      w.postMessage({ k, n });
    }));
  }
  // take returns the next batch, or null after the last.
  async take() {
    if (this.pending.length === 0) return null;
    const b = await this.pending.shift();
    this.ask();
    return b;
  }
  close() {
    for (const w of this.workers) w.terminate();
  }
}

function main(argv) {
  if (argv.length !== 3 || !/^[0-9]+$/.test(argv[2])) die("usage: node big.mjs OUT.parquet JSONL_OUT ROWS");
  const [parquetPath, jsonlPath] = argv;
  const rows = Number(argv[2]);
  const msgType = new Struct([new Field("role", new Utf8(), true), new Field("content", new Utf8(), true)]);
  const listType = new List(new Field("item", msgType, true));
  const schema = new Schema([new Field("messages", listType, true)]);
  const utf8 = (c) => makeData({ type: new Utf8(), length: c.offsets.length - 1, nullCount: 0, valueOffsets: c.offsets, data: c.bytes });
  const threads = Number(process.env.BIG_THREADS) || Math.max(1, Math.min(4, os.availableParallelism() - 1));
  const gen = new Generator(rows, threads);
  const jsonl = fs.openSync(jsonlPath, "w");
  let done = 0, jsonlBytes = 0;

  // batch returns the next examples as a record batch in WebAssembly memory,
  // having written them to the JSONL file; null after the last.
  const batch = async () => {
    const b = await gen.take();
    if (b === null) return null;
    jsonlBytes += writeAll(jsonl, b.jsonl);
    const structData = makeData({
      type: msgType, length: b.listOffsets[b.n], nullCount: 0, children: [utf8(b.roles), utf8(b.contents)],
    });
    const listData = makeData({ type: listType, length: b.n, nullCount: 0, valueOffsets: b.listOffsets, child: structData });
    const rb = new RecordBatch(schema, makeData({ type: new Struct(schema.fields), length: b.n, nullCount: 0, children: [listData] }));
    done += b.n;
    const t = WasmTable.fromIPCStream(tableToIPC(new Table(schema, [rb]), "stream"));
    const wrb = t.recordBatch(0);
    t.free();
    return wrb;
  };

  const input = new ReadableStream({
    async pull(controller) {
      const b = await batch();
      if (b === null) controller.close();
      else controller.enqueue(b);
    },
  }, { highWaterMark: 0 });

  const props = new WriterPropertiesBuilder()
    .setCompression(Compression.ZSTD)
    .setDictionaryEnabled(true)
    .setMaxRowGroupSize(ROW_GROUP)
    .build();
  return (async () => {
    const out = fs.openSync(parquetPath, "w");
    let parquetBytes = 0;
    if (rows === 0) {
      // A stream of no batches would carry no schema: write an empty table.
      const t = WasmTable.fromIPCStream(tableToIPC(new Table(schema), "stream"));
      parquetBytes = writeAll(out, writeParquet(t, props));
    } else {
      for await (const chunk of await transformParquetStream(input, props)) {
        parquetBytes += writeAll(out, chunk);
      }
    }
    fs.closeSync(out);
    fs.closeSync(jsonl);
    gen.close();
    console.error(`big.mjs: ${done} examples, ${parquetPath} ${parquetBytes} bytes, ${jsonlPath} ${jsonlBytes} bytes`);
  })();
}

if (isMainThread) main(process.argv.slice(2)).catch((e) => die(e.code ? e.message : e.stack || e));
else worker();
