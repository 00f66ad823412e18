// Times llama.cpp's greedy decode (node-llama-cpp's prebuilt CPU build) on a GGUF file, for
// issue 31's comparison with fusetune's bf16 decode on the same weights (docs/bf16.md):
//   node decode_speed.mjs --model FILE.gguf [--prompt 24] [--tokens 64] [--threads 2] [--repeat 3]
// The prompt is token ids 1..P (BOS, then arbitrary ids); -> one JSON line per repeat:
// {"prompt_tokens_per_s": ..., "decode_tokens_per_s": ...}, decode = tokens after the first
// generated one over the time they took. KV cache as llama.cpp's default (fp16).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf("--" + name);
  return i >= 0 ? args[i + 1] : def;
};
const modelPath = opt("model");
if (!modelPath) {
  console.error("usage: node decode_speed.mjs --model FILE.gguf [--prompt P] [--tokens N] " +
                "[--threads T] [--repeat R]");
  process.exit(2);
}
const P = Number(opt("prompt", 24)), N = Number(opt("tokens", 64));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const prompt = Array.from({length: P}, (_, i) => i + 1);
for (let r = 0; r < Number(opt("repeat", 3)); ++r) {
  const context = await model.createContext({contextSize: P + N + 8, batchSize: Math.max(P, 64),
                                             threads: Number(opt("threads", 2))});
  const sequence = context.getSequence();
  const t0 = performance.now();
  let n = 0, tFirst = 0;
  for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
    void token;
    if (++n === 1) tFirst = performance.now();
    if (n >= N) break;
  }
  const t1 = performance.now();
  process.stdout.write(JSON.stringify({prompt_tokens_per_s: P / ((tFirst - t0) / 1000),
                                       decode_tokens_per_s: (n - 1) / ((t1 - tFirst) / 1000)}) +
                       "\n");
  await context.dispose();
}
await model.dispose();
await llama.dispose();
