// check.mjs verifies the files gen.mjs wrote for a spec:
//
//   node data/testdata/npm/check.mjs SPEC.json
//
// For each file it prints one JSON line describing it and exits 1 at the
// first thing that does not match the spec.
//
// Parquet: "PAR1" at both ends; the footer, decoded here from its Thrift
// compact encoding (independent of parquet-wasm), must have
// ceil(rows/row_group_rows) row groups of row_group_rows rows (the last one
// fewer), every column chunk the spec's codec, and with dictionary on a
// dictionary page and only RLE_DICTIONARY/PLAIN_DICTIONARY data pages in every
// chunk whose type has a dictionary (arrow-rs never dictionary-encodes bool),
// with it off no dictionary page and no dictionary encoding. parquet-wasm's
// own metadata reader must agree on the row groups, codecs and encodings;
// and the rows read back with parquet-wasm must equal the spec's rows, the
// columns having exactly the spec's Arrow types.
//
// Arrow: a stream starts with the 0xFFFFFFFF continuation marker, a file
// starts and ends with "ARROW1"; apache-arrow reads back batches of
// batch_rows rows, the spec's Arrow types and rows.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { DataType, Field, RecordBatchReader, Schema, tableFromIPC, util } from "apache-arrow";
import { Compression, Encoding, ParquetFile, readParquet } from "parquet-wasm/node";
import { objectOf, parseType } from "./gen.mjs";

class CheckError extends Error {}
const fail = (msg) => { throw new CheckError(msg); };

// --- Thrift compact protocol, enough for Parquet's FileMetaData ---------
// A struct decodes to an object keyed by field id.
function thriftStruct(buf, pos) {
  const r = { buf, pos };
  const v = readStruct(r);
  return [v, r.pos];
}
function varint(r) {
  let shift = 0n, v = 0n;
  for (;;) {
    const b = r.buf[r.pos++];
    v |= BigInt(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
    shift += 7n;
  }
}
const zigzag = (v) => (v >> 1n) ^ -(v & 1n);
function readValue(r, t) {
  switch (t) {
    case 1: return true; // BOOLEAN_TRUE (in a struct field header)
    case 2: return false; // BOOLEAN_FALSE
    case 3: return r.buf[r.pos++] << 24 >> 24; // byte
    case 4: case 5: return Number(zigzag(varint(r))); // i16, i32
    case 6: return zigzag(varint(r)); // i64, as BigInt
    case 7: { const d = r.buf.readDoubleLE(r.pos); r.pos += 8; return d; }
    case 8: { // binary
      const n = Number(varint(r));
      const s = r.buf.subarray(r.pos, r.pos + n);
      r.pos += n;
      return s;
    }
    case 9: case 10: { // list, set
      const h = r.buf[r.pos++];
      let n = h >> 4;
      if (n === 15) n = Number(varint(r));
      const et = h & 15;
      const out = [];
      for (let i = 0; i < n; i++) out.push(et === 1 || et === 2 ? r.buf[r.pos++] === 1 : readValue(r, et));
      return out;
    }
    case 11: fail("thrift map in the footer is not expected");
    case 12: return readStruct(r);
    default: fail(`thrift type ${t} at ${r.pos}`);
  }
}
function readStruct(r) {
  const o = {};
  let id = 0;
  for (;;) {
    const h = r.buf[r.pos++];
    if (h === 0) return o;
    const t = h & 15;
    const d = h >> 4;
    id = d ? id + d : Number(zigzag(varint(r)));
    o[id] = readValue(r, t);
  }
}

const CODEC = ["UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"]; // parquet.thrift
const ENCODING = ["PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED", "DELTA_BINARY_PACKED",
  "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"];
const PAGE = ["DATA_PAGE", "INDEX_PAGE", "DICTIONARY_PAGE", "DATA_PAGE_V2"];
const PHYSICAL = ["BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"];

// parquetFooter decodes a Parquet file's FileMetaData.
export function parquetFooter(buf) {
  if (buf.subarray(0, 4).toString("latin1") !== "PAR1" || buf.subarray(-4).toString("latin1") !== "PAR1") {
    fail("no PAR1 magic at both ends");
  }
  const n = buf.readUInt32LE(buf.length - 8);
  const [fmd, end] = thriftStruct(buf, buf.length - 8 - n);
  if (end !== buf.length - 8) fail(`footer decoded to ${end}, not ${buf.length - 8}`);
  return {
    version: fmd[1],
    numRows: Number(fmd[3]),
    createdBy: fmd[6]?.toString(),
    rowGroups: (fmd[4] ?? []).map((rg) => ({
      numRows: Number(rg[3]),
      columns: rg[1].map((cc) => {
        const md = cc[3];
        return {
          path: md[3].map((b) => b.toString()).join("."),
          type: PHYSICAL[md[1]],
          codec: CODEC[md[4]],
          encodings: md[2].map((e) => ENCODING[e]),
          dictionaryPage: md[11] !== undefined,
          pages: (md[13] ?? []).map((s) => `${PAGE[s[1]]}:${ENCODING[s[2]]}x${s[3]}`),
        };
      }),
    })),
  };
}

// plain turns what apache-arrow reads into JSON-able values (int64 as strings).
function plain(v, t) {
  if (v === null || v === undefined) return null;
  if (DataType.isList(t)) return [...v].map((x) => plain(x, t.children[0].type));
  if (DataType.isStruct(t)) return Object.fromEntries(t.children.map((f) => [f.name, plain(v[f.name], f.type)]));
  if (DataType.isInt(t) && t.bitWidth === 64) return String(v);
  return v;
}
const json = (v) => JSON.stringify(v, (k, x) => (typeof x === "bigint" ? String(x) : x));

function compareTable(table, schema, rows, where) {
  if (!util.compareSchemas(table.schema, schema)) {
    fail(`${where}: read back schema ${table.schema.fields.map((f) => `${f.name}:${f.type}`)}, want ${schema.fields.map((f) => `${f.name}:${f.type}`)}`);
  }
  if (table.numRows !== rows.length) fail(`${where}: read back ${table.numRows} rows, want ${rows.length}`);
  const cols = schema.fields.map((f) => table.getChild(f.name));
  for (let i = 0; i < rows.length; i++) {
    const got = json(Object.fromEntries(schema.fields.map((f, k) => [f.name, plain(cols[k].get(i), f.type)])));
    const want = json(rows[i]);
    if (got !== want) fail(`${where}: row ${i} reads back as ${got}, want ${want}`);
  }
}

const DICT_DATA = new Set(["RLE_DICTIONARY", "PLAIN_DICTIONARY"]);
const WASM_CODEC = { none: Compression.UNCOMPRESSED, snappy: Compression.SNAPPY, zstd: Compression.ZSTD };

async function checkParquet(buf, file, schema, rows, where) {
  const compression = file.compression ?? "snappy";
  const dictionary = file.dictionary ?? true;
  const rgRows = file.row_group_rows ?? 1024;
  const codec = { none: "UNCOMPRESSED", snappy: "SNAPPY", zstd: "ZSTD" }[compression];
  const f = parquetFooter(buf);
  if (f.numRows !== rows.length) fail(`${where}: footer has ${f.numRows} rows, want ${rows.length}`);
  const wantGroups = Math.ceil(rows.length / rgRows);
  if (f.rowGroups.length !== wantGroups) fail(`${where}: ${f.rowGroups.length} row groups, want ${wantGroups}`);
  f.rowGroups.forEach((rg, g) => {
    const want = Math.min(rgRows, rows.length - g * rgRows);
    if (rg.numRows !== want) fail(`${where}: row group ${g} has ${rg.numRows} rows, want ${want}`);
    for (const c of rg.columns) {
      const w = `${where}: row group ${g} column ${c.path}`;
      if (c.codec !== codec) fail(`${w}: codec ${c.codec}, want ${codec}`);
      const dataPages = c.pages.filter((p) => p.startsWith("DATA_PAGE"));
      if (c.pages.length === 0) fail(`${w}: no encoding_stats`);
      if (dictionary && c.type !== "BOOLEAN") {
        if (!c.dictionaryPage || !c.encodings.some((e) => DICT_DATA.has(e))) fail(`${w}: not dictionary encoded: ${c.encodings}`);
        for (const p of dataPages) if (!DICT_DATA.has(p.split(":")[1].split("x")[0])) fail(`${w}: data page ${p}`);
      } else {
        if (c.dictionaryPage || c.encodings.some((e) => DICT_DATA.has(e))) fail(`${w}: dictionary encoded: ${c.encodings}`);
      }
    }
  });
  // parquet-wasm's metadata reader must say the same.
  const md = (await ParquetFile.fromFile(new Blob([buf]))).metadata();
  if (md.numRowGroups() !== f.rowGroups.length) fail(`${where}: parquet-wasm reads ${md.numRowGroups()} row groups`);
  md.rowGroups().forEach((rg, g) => {
    if (rg.numRows() !== f.rowGroups[g].numRows) fail(`${where}: parquet-wasm reads ${rg.numRows()} rows in row group ${g}`);
    rg.columns().forEach((c, k) => {
      const mine = f.rowGroups[g].columns[k];
      const encs = c.encodings().map((e) => Encoding[e]).sort().join(",");
      if (c.columnPath().join(".") !== mine.path || c.compression() !== WASM_CODEC[compression] ||
          encs !== [...mine.encodings].sort().join(",")) {
        fail(`${where}: parquet-wasm reads column ${c.columnPath().join(".")} ${Compression[c.compression()]} ${encs}; footer: ${json(mine)}`);
      }
    });
  });
  const table = tableFromIPC(readParquet(buf).intoIPCStream());
  compareTable(table, schema, rows, where);
  return {
    rows: f.numRows, version: f.version, created_by: f.createdBy,
    row_groups: f.rowGroups.map((rg) => ({ rows: rg.numRows, columns: rg.columns.map((c) => `${c.path} ${c.type} ${c.codec} ${c.encodings.join("/")} [${c.pages.join(" ")}]`) })),
  };
}

function checkArrow(buf, file, schema, rows, where) {
  const stream = file.format === "arrow-stream";
  if (stream) {
    if (buf.readUInt32LE(0) !== 0xffffffff) fail(`${where}: does not start with the 0xFFFFFFFF continuation marker`);
  } else if (buf.subarray(0, 6).toString("latin1") !== "ARROW1" || buf.subarray(-6).toString("latin1") !== "ARROW1") {
    fail(`${where}: no ARROW1 magic at both ends`);
  }
  const reader = RecordBatchReader.from(buf);
  if (reader.isFile() === stream) fail(`${where}: apache-arrow reads it as ${reader.isFile() ? "a file" : "a stream"}`);
  const batches = [...reader];
  const per = file.batch_rows ?? Math.max(rows.length, 1);
  const want = [];
  for (let i = 0; i < rows.length; i += per) want.push(Math.min(per, rows.length - i));
  let got = batches.map((b) => b.numRows);
  // apache-arrow's reader yields one empty batch for a schema-only stream.
  if (rows.length === 0 && json(got) === "[0]") got = [];
  if (!stream && reader.numRecordBatches !== want.length) fail(`${where}: footer lists ${reader.numRecordBatches} batches, want ${want.length}`);
  if (json(got) !== json(want)) fail(`${where}: batches of ${json(got)} rows, want ${json(want)}`);
  compareTable(tableFromIPC(buf), schema, rows, where);
  return { rows: rows.length, batches: got, head: buf.subarray(0, 8).toString("hex") };
}

async function main(argv) {
  if (argv.length !== 1) fail("usage: node check.mjs SPEC.json");
  const spec = JSON.parse(fs.readFileSync(argv[0], "utf8"));
  for (const [k, file] of spec.files.entries()) {
    const where = `files[${k}] (${file.name})`;
    const fields = file.schema.map((c) => new Field(c.name, parseType(c.type), true));
    const schema = new Schema(fields);
    const rows = file.rows.map((r, i) => JSON.parse(json(objectOf(r, fields, `${where}.rows[${i}]`))));
    const buf = fs.readFileSync(path.join(spec.out, file.name));
    const summary = file.format === "parquet"
      ? await checkParquet(buf, file, schema, rows, where)
      : checkArrow(buf, file, schema, rows, where);
    console.log(json({ name: file.name, format: file.format, bytes: buf.length, ...summary }));
  }
}

// Run as a script, not when imported (for parquetFooter).
if (process.argv[1] && import.meta.url === pathToFileURL(fs.realpathSync(process.argv[1])).href) {
  main(process.argv.slice(2)).catch((e) => {
    console.error(`check.mjs: ${e instanceof CheckError ? e.message : e.stack || e}`);
    process.exit(1);
  });
}
