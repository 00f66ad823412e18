#!/usr/bin/env node
// Encodes strings with an independent tokenizer.json implementation, so fusetune's C++
// tokenizer can be checked against it (tests/conformance) and timed against it (bench).
//
//   node encode.js --tokenizer T.json --corpus C.jsonl --out expected.json [--impl hf|lenml]
//        [--add-special-tokens]
//     C.jsonl: one JSON string (or {"text": ...}) per line. Writes
//     {"impl": ..., "results": [{"text": s, "ids": [...], "decoded": decode(ids),
//     "decoded_skip": decode(ids, skip_special_tokens)}, ...]}.
//   node encode.js --tokenizer T.json --bench TEXT.txt [--impl hf|lenml] [--repeat N]
//     Encodes every line of TEXT.txt (no special tokens), prints one JSON line:
//     {"impl", "bytes", "tokens", "best_pass_seconds", "mb_per_s" (best pass), "cpu_seconds",
//     "mb_per_cpu_s" (all passes, whole-process CPU time)}.
//
// impl "hf" is the official Hugging Face Rust library (npm "tokenizers", Node bindings), the
// default; "lenml" is @lenml/tokenizers (a JavaScript port of transformers.js' tokenizers).
"use strict";
const fs = require("fs");
const path = require("path");

function parseArgs(argv) {
  const a = { impl: "hf", repeat: 1, addSpecial: false };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`missing value after ${k}`);
      return argv[++i];
    };
    if (k === "--tokenizer") a.tokenizer = next();
    else if (k === "--corpus") a.corpus = next();
    else if (k === "--out") a.out = next();
    else if (k === "--impl") a.impl = next();
    else if (k === "--bench") a.bench = next();
    else if (k === "--repeat") a.repeat = parseInt(next(), 10);
    else if (k === "--add-special-tokens") a.addSpecial = true;
    else throw new Error(`unknown argument ${k}`);
  }
  if (!a.tokenizer) throw new Error("--tokenizer is required");
  if (!a.corpus && !a.bench) throw new Error("one of --corpus or --bench is required");
  return a;
}

// Returns {encode(text, addSpecial) -> Promise<number[]>, decode(ids, skip) -> Promise<string>,
// encodeMany(texts) -> Promise<number of tokens>}.
function load(impl, tokenizerPath) {
  if (impl === "hf") {
    // One thread, like the C++ side: the comparison is per core.
    process.env.TOKENIZERS_PARALLELISM = "false";
    process.env.RAYON_NUM_THREADS = "1";
    const { Tokenizer } = require("tokenizers");
    const tok = Tokenizer.fromFile(tokenizerPath);
    return {
      encode: async (text, addSpecial) =>
        Array.from((await tok.encode(text, null, { addSpecialTokens: addSpecial })).getIds()),
      decode: async (ids, skip) => tok.decode(ids, skip),
      encodeMany: async (texts) => {
        const encs = await tok.encodeBatch(texts, { addSpecialTokens: false });
        let n = 0;
        for (const e of encs) n += e.getIds().length;
        return n;
      },
    };
  }
  if (impl === "lenml") {
    const { TokenizerLoader } = require("@lenml/tokenizers");
    const dir = path.dirname(tokenizerPath);
    const cfgPath = path.join(dir, "tokenizer_config.json");
    const tok = TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(fs.readFileSync(tokenizerPath, "utf8")),
      tokenizerConfig: fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {},
    });
    return {
      encode: async (text, addSpecial) => tok.encode(text, { add_special_tokens: addSpecial }),
      decode: async (ids, skip) => (ids.length ? tok.decode(ids, { skip_special_tokens: skip }) : ""),
      encodeMany: async (texts) => {
        let n = 0;
        for (const t of texts) n += tok.encode(t, { add_special_tokens: false }).length;
        return n;
      },
    };
  }
  throw new Error(`unknown --impl ${impl} (expected hf or lenml)`);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const tok = load(args.impl, args.tokenizer);
  if (args.bench) {
    const text = fs.readFileSync(args.bench, "utf8");
    const lines = text.split("\n").filter((l) => l.length > 0);
    const bytes = lines.reduce((n, l) => n + Buffer.byteLength(l, "utf8"), 0);
    await tok.encodeMany(lines.slice(0, 50));  // warm-up
    let tokens = 0;
    // Best pass of --repeat: on a shared machine the fastest pass is the least disturbed one.
    let best = Infinity;
    const c0 = process.cpuUsage();
    for (let r = 0; r < args.repeat; r++) {
      const t0 = process.hrtime.bigint();
      tokens = await tok.encodeMany(lines);
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    const c1 = process.cpuUsage(c0);
    const cpu_seconds = (c1.user + c1.system) / 1e6;
    console.log(
      JSON.stringify({
        impl: args.impl,
        bytes,
        tokens,
        best_pass_seconds: best,
        mb_per_s: bytes / 1e6 / best,
        cpu_seconds,
        mb_per_cpu_s: (bytes * args.repeat) / 1e6 / cpu_seconds,
      }),
    );
    return;
  }
  const texts = fs
    .readFileSync(args.corpus, "utf8")
    .split("\n")
    .filter((l) => l.trim().length > 0)
    .map((l) => {
      const v = JSON.parse(l);
      return typeof v === "string" ? v : v.text;
    });
  const results = [];
  for (const text of texts) {
    const ids = await tok.encode(text, args.addSpecial);
    results.push({
      text,
      ids,
      decoded: await tok.decode(ids, false),
      decoded_skip: await tok.decode(ids, true),
    });
  }
  const out = JSON.stringify({ impl: args.impl, add_special_tokens: args.addSpecial, results });
  if (args.out) fs.writeFileSync(args.out, out);
  else process.stdout.write(out + "\n");
}

main().catch((e) => {
  console.error(`encode.js: ${e.message}`);
  process.exit(1);
});
