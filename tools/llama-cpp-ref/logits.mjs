// Evaluates token ids with a real llama.cpp (node-llama-cpp's prebuilt CPU build) and prints,
// as JSON, the log-probabilities llama.cpp gives every vocabulary token after each position:
//   node logits.mjs --model FILE.gguf [--tokens 1,403,407] [--sequences SEQS.json]
//                   [--threads N] [--text TEXT] [--texts FILE.json]
// -> {"n_vocab": V, "logprobs": [[V floats], ...], "sequences_next_logprobs": [[floats], ...],
// "text_tokens": [...], "texts_tokens": [[...], ...]}: one logprobs row per input token;
// sequences_next_logprobs, for each token-id array s of the JSON array in SEQS.json (each in a
// fresh context, the model loaded once), the log-probability of s[i + 1] after s[0..i] (what a
// perplexity sums); text_tokens is llama.cpp's tokenization of TEXT (no BOS, special tokens as
// text) with the GGUF's tokenizer, texts_tokens that of each string of the JSON array in
// FILE.json.
// The KV cache is fp32 (llama.cpp's default is fp16).
// Log-probabilities (log-softmax of the logits at temperature 1, no top-k/p filtering) are what
// node-llama-cpp exposes; they equal the logits up to a per-row constant.
import {readFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const args = process.argv.slice(2);
const opt = (name) => {
  const i = args.indexOf("--" + name);
  return i >= 0 ? args[i + 1] : undefined;
};
const modelPath = opt("model");
const tokens = (opt("tokens") || "").split(",").filter((s) => s !== "").map(Number);
if (!modelPath) {
  console.error("usage: node logits.mjs --model FILE.gguf [--tokens ID,ID,...] " +
                "[--sequences FILE.json] [--text TEXT] [--texts FILE.json] [--threads N]");
  process.exit(2);
}

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
let nVocab;
// One row of log-probabilities (every vocabulary token) after each token of `tokens`, in a
// fresh context.
const evaluate = async (tokens) => {
  const context = await model.createContext({
    contextSize: Math.max(64, tokens.length + 8),
    batchSize: Math.max(64, tokens.length),
    threads: Number(opt("threads") || 1),
    flashAttention: false,
    // llama.cpp keeps K and V in fp16 by default; fp32 so that F32 weights compute in fp32.
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
  });
  const sequence = context.getSequence();
  const sampling = {temperature: 1, topK: 0, topP: 1, minP: 0};
  const input = tokens.map((t) => [t, {generateNext: {probabilities: true, options: sampling}}]);
  const out = await sequence.controlledEvaluate(input);
  nVocab = out[0].next.probabilities.size;
  const rows = out.map((o) => {
    const row = new Array(nVocab).fill(null);
    for (const [tok, p] of o.next.probabilities) row[tok] = Math.log(p);
    return row;
  });
  await context.dispose();
  return rows;
};
const logprobs = tokens.length > 0 ? await evaluate(tokens) : undefined;
const sequences = opt("sequences");
let sequencesNext;
if (sequences !== undefined) {
  sequencesNext = [];
  for (const seq of JSON.parse(readFileSync(sequences, "utf8"))) {
    const rows = await evaluate(seq);
    sequencesNext.push(seq.slice(1).map((t, i) => rows[i][t]));
  }
}
const text = opt("text");
const textTokens = text === undefined ? undefined : Array.from(model.tokenize(text));
const texts = opt("texts");
const textsTokens = texts === undefined ? undefined
    : JSON.parse(readFileSync(texts, "utf8")).map((t) => Array.from(model.tokenize(t)));
process.stdout.write(JSON.stringify({n_vocab: nVocab, logprobs, sequences_next_logprobs:
                                     sequencesNext, text_tokens: textTokens,
                                     texts_tokens: textsTokens}) + "\n");
await model.dispose();
await llama.dispose();
