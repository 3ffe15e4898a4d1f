// gen.mjs writes Parquet and Arrow IPC fixture files for data/'s tests with
// an implementation independent of the Go reader: Arrow tables built with
// apache-arrow (JS) and written as Arrow IPC stream/file by it, Parquet
// written from them by parquet-wasm (arrow-rs's parquet crate in WebAssembly).
//
//   node data/testdata/npm/gen.mjs SPEC.json
//
// SPEC.json: {"out": "/abs/dir", "files": [{
//   "name": "sub/x.parquet",                        // relative to out; dirs are created
//   "format": "parquet" | "arrow-stream" | "arrow-file",
//   "compression": "none" | "snappy" | "zstd",      // parquet only, default snappy
//   "dictionary": true | false,                     // parquet only, default true
//   "row_group_rows": N,                            // parquet only, default 1024
//   "batch_rows": N,                                // arrow only, rows per record batch, default all
//   "schema": [{"name": "messages", "type": "list<struct<role:string,content:string>>"}, ...],
//   "rows": [{"messages": [{"role": "user", "content": "hi"}], "text": null}, ...]}]}
//
// Types: string, large_string, int64, float64, bool, list<T>, struct<a:T,b:T>,
// nested arbitrarily. Every field (columns, struct fields, list items) is
// nullable; a JSON null or a missing key is a null. An int64 may be given as a
// JSON integer (|n| <= 2^53) or as a string of decimal digits. Column order is
// schema order. Vectors are built with these explicit Arrow types, never by
// inference. It writes every file and exits 0, or prints one error and exits 1.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import {
  Bool, Field, Float64, Int64, LargeUtf8, List, RecordBatch, Schema, Struct,
  Table, Utf8, makeData, tableToIPC, util, vectorFromArray,
} from "apache-arrow";
import {
  Compression, Table as WasmTable, WriterPropertiesBuilder, writeParquet,
} from "parquet-wasm/node"; // the Node build (CommonJS, the wasm loaded synchronously)

class SpecError extends Error {}
const fail = (msg) => { throw new SpecError(msg); };

// parseType parses the type grammar above into an Arrow DataType.
export function parseType(src) {
  let i = 0;
  const ws = () => { while (i < src.length && /\s/.test(src[i])) i++; };
  const ident = () => {
    ws();
    const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(src.slice(i));
    if (!m) fail(`type ${JSON.stringify(src)}: expected a name at offset ${i}`);
    i += m[0].length;
    return m[0];
  };
  const expect = (c) => {
    ws();
    if (src[i] !== c) fail(`type ${JSON.stringify(src)}: expected ${JSON.stringify(c)} at offset ${i}`);
    i++;
  };
  const type = () => {
    const name = ident();
    switch (name) {
      case "string": return new Utf8();
      case "large_string": return new LargeUtf8();
      case "int64": return new Int64();
      case "float64": return new Float64();
      case "bool": return new Bool();
      case "list": {
        expect("<");
        const t = type();
        expect(">");
        return new List(new Field("item", t, true));
      }
      case "struct": {
        expect("<");
        const fields = [];
        const seen = new Set();
        for (;;) {
          const f = ident();
          if (seen.has(f)) fail(`type ${JSON.stringify(src)}: duplicate struct field ${f}`);
          seen.add(f);
          expect(":");
          fields.push(new Field(f, type(), true));
          ws();
          if (src[i] === ",") { i++; continue; }
          expect(">");
          return new Struct(fields);
        }
      }
      default:
        fail(`type ${JSON.stringify(src)}: unknown type ${name}`);
    }
  };
  const t = type();
  ws();
  if (i !== src.length) fail(`type ${JSON.stringify(src)}: unexpected ${JSON.stringify(src.slice(i))}`);
  return t;
}

// convert checks a JSON value against an Arrow type and returns the value
// apache-arrow's builders take for it (BigInt for int64, objects with every
// struct field present).
function convert(v, t, where) {
  if (v === null || v === undefined) return null;
  const bad = (what) => fail(`${where}: ${JSON.stringify(v)} is not ${what}`);
  if (t instanceof Utf8 || t instanceof LargeUtf8) {
    if (typeof v !== "string") bad("a string");
    return v;
  }
  if (t instanceof Int64) {
    if (typeof v === "number") {
      if (!Number.isSafeInteger(v)) bad("an int64 (give integers beyond 2^53 as strings)");
      return BigInt(v);
    }
    if (typeof v === "string" && /^-?[0-9]+$/.test(v)) {
      const b = BigInt(v);
      if (b < -(2n ** 63n) || b >= 2n ** 63n) bad("an int64");
      return b;
    }
    bad("an int64");
  }
  if (t instanceof Float64) {
    if (typeof v !== "number") bad("a float64");
    return v;
  }
  if (t instanceof Bool) {
    if (typeof v !== "boolean") bad("a bool");
    return v;
  }
  if (t instanceof List) {
    if (!Array.isArray(v)) bad("a list");
    const et = t.children[0].type;
    return v.map((x, k) => convert(x, et, `${where}[${k}]`));
  }
  if (t instanceof Struct) {
    if (typeof v !== "object" || Array.isArray(v)) bad("a struct");
    return objectOf(v, t.children, where);
  }
  fail(`${where}: unsupported type ${t}`);
}

export function objectOf(v, fields, where) {
  const names = new Set(fields.map((f) => f.name));
  for (const k of Object.keys(v)) {
    if (!names.has(k)) fail(`${where}: key ${JSON.stringify(k)} is not in the schema`);
  }
  const o = {};
  for (const f of fields) o[f.name] = convert(v[f.name], f.type, `${where}.${f.name}`);
  return o;
}

// recordBatch builds one record batch of rows (already converted) with schema.
function recordBatch(schema, rows) {
  const children = schema.fields.map((f) => {
    const vec = vectorFromArray(rows.map((r) => r[f.name]), f.type);
    if (vec.data.length !== 1) fail(`internal: column ${f.name} built in ${vec.data.length} chunks`);
    if (!util.compareTypes(vec.type, f.type)) fail(`internal: column ${f.name} built as ${vec.type}, not ${f.type}`);
    return vec.data[0];
  });
  const data = makeData({ type: new Struct(schema.fields), length: rows.length, nullCount: 0, children });
  return new RecordBatch(schema, data);
}

function table(schema, rows, batchRows) {
  const batches = [];
  for (let i = 0; i < rows.length; i += batchRows) {
    batches.push(recordBatch(schema, rows.slice(i, i + batchRows)));
  }
  return new Table(schema, batches);
}

const CODECS = { none: Compression.UNCOMPRESSED, snappy: Compression.SNAPPY, zstd: Compression.ZSTD };
const COMMON_KEYS = ["name", "format", "schema", "rows"];
const KEYS = {
  parquet: [...COMMON_KEYS, "compression", "dictionary", "row_group_rows"],
  "arrow-stream": [...COMMON_KEYS, "batch_rows"],
  "arrow-file": [...COMMON_KEYS, "batch_rows"],
};

const positiveInt = (v, where) => {
  if (!Number.isSafeInteger(v) || v < 1) fail(`${where}: ${JSON.stringify(v)} is not a positive integer`);
  return v;
};

// encode returns the bytes of one file of the spec.
export function encode(file, where) {
  if (typeof file !== "object" || file === null || Array.isArray(file)) fail(`${where}: not an object`);
  const keys = KEYS[file.format];
  if (!keys) fail(`${where}: format ${JSON.stringify(file.format)} is not parquet, arrow-stream or arrow-file`);
  for (const k of Object.keys(file)) {
    if (!keys.includes(k)) fail(`${where}: key ${JSON.stringify(k)} is not allowed for format ${file.format}`);
  }
  if (!Array.isArray(file.schema) || file.schema.length === 0) fail(`${where}.schema: not a non-empty list`);
  const seen = new Set();
  const fields = file.schema.map((c, k) => {
    const w = `${where}.schema[${k}]`;
    if (typeof c !== "object" || c === null || typeof c.name !== "string" || typeof c.type !== "string") {
      fail(`${w}: not {"name": string, "type": string}`);
    }
    for (const key of Object.keys(c)) if (key !== "name" && key !== "type") fail(`${w}: unknown key ${key}`);
    if (seen.has(c.name)) fail(`${w}: duplicate column ${c.name}`);
    seen.add(c.name);
    try {
      return new Field(c.name, parseType(c.type), true);
    } catch (e) {
      throw e instanceof SpecError ? new SpecError(`${w}: ${e.message}`) : e;
    }
  });
  const schema = new Schema(fields);
  if (!Array.isArray(file.rows)) fail(`${where}.rows: not a list`);
  const rows = file.rows.map((r, k) => {
    const w = `${where}.rows[${k}]`;
    if (typeof r !== "object" || r === null || Array.isArray(r)) fail(`${w}: not an object`);
    return objectOf(r, fields, w);
  });

  if (file.format === "parquet") {
    const compression = file.compression ?? "snappy";
    if (!(compression in CODECS)) fail(`${where}.compression: ${JSON.stringify(compression)} is not none, snappy or zstd`);
    const dictionary = file.dictionary ?? true;
    if (typeof dictionary !== "boolean") fail(`${where}.dictionary: not a bool`);
    const rowGroupRows = positiveInt(file.row_group_rows ?? 1024, `${where}.row_group_rows`);
    // The Arrow table goes to WebAssembly memory as an IPC stream; the
    // writer cuts row groups of rowGroupRows rows whatever the batches.
    const wasmTable = WasmTable.fromIPCStream(tableToIPC(table(schema, rows, Math.max(rows.length, 1)), "stream"));
    const props = new WriterPropertiesBuilder()
      .setCompression(CODECS[compression])
      .setDictionaryEnabled(dictionary)
      .setMaxRowGroupSize(rowGroupRows)
      .build();
    return writeParquet(wasmTable, props);
  }
  const batchRows = positiveInt(file.batch_rows ?? Math.max(rows.length, 1), `${where}.batch_rows`);
  return tableToIPC(table(schema, rows, batchRows), file.format === "arrow-file" ? "file" : "stream");
}

function main(argv) {
  if (argv.length !== 1) fail("usage: node gen.mjs SPEC.json");
  let spec;
  try {
    spec = JSON.parse(fs.readFileSync(argv[0], "utf8"));
  } catch (e) {
    fail(`${argv[0]}: ${e.message}`);
  }
  if (typeof spec !== "object" || spec === null || Array.isArray(spec)) fail(`${argv[0]}: not an object`);
  for (const k of Object.keys(spec)) if (k !== "out" && k !== "files") fail(`${argv[0]}: unknown key ${k}`);
  if (typeof spec.out !== "string" || !path.isAbsolute(spec.out)) fail(`${argv[0]}: out is not an absolute path`);
  if (!Array.isArray(spec.files)) fail(`${argv[0]}: files is not a list`);
  const names = new Set();
  // Encode every file before writing any, so that a bad spec writes nothing.
  const outputs = spec.files.map((file, k) => {
    const where = `files[${k}]`;
    const name = file?.name;
    if (typeof name !== "string" || name === "" || path.isAbsolute(name) ||
        path.normalize(name).split(path.sep).includes("..")) {
      fail(`${where}.name: ${JSON.stringify(name)} is not a relative path inside out`);
    }
    if (names.has(path.normalize(name))) fail(`${where}.name: ${name} appears twice`);
    names.add(path.normalize(name));
    return [path.join(spec.out, name), encode(file, `${where} (${name})`)];
  });
  for (const [p, bytes] of outputs) {
    fs.mkdirSync(path.dirname(p), { recursive: true });
    fs.writeFileSync(p, bytes);
  }
}

// Run as a script, not when imported (check.mjs imports encode).
if (process.argv[1] && import.meta.url === pathToFileURL(fs.realpathSync(process.argv[1])).href) {
  try {
    main(process.argv.slice(2));
  } catch (e) {
    console.error(`gen.mjs: ${e instanceof SpecError ? e.message : e.stack || e}`);
    process.exit(1);
  }
}
