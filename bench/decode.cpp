// Decode with the KV cache: tokens/s of the prefill and of each decode step, eager vs compiled,
// fp32, bf16 and NF4 weights (--dtypes; nf4 is QLoRA's frozen base: every projection, the
// embedding and the head quantized, fp32 compute), batch 1 and batched (--batches), and the memory
// bandwidth the decode achieves (weight bytes read per step x steps/s) against the machine's
// measured bandwidth. A decode step reads every weight once whatever the batch, so bandwidth is
// batch-1's roofline (llama.cpp's CPU decode is the reference users know) and a batch of B rows
// should give nearly B times the tokens. Random-init weights of the named shapes; greedy decoding
// of fixed synthetic prompts (one per row, each different).
#include <cstdio>

#include "bench_args.h"
#include "fusetune/generation/generator.h"
#include "fusetune/generation/kv_cache.h"
#include "fusetune/models/decode_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/peft/lora.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/runtime/op_profile.h"
#include "memory_bandwidth.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

// Bytes one decode step reads: every weight but the embedding table (one row of it, unless
// the head is tied to it), plus the KV cache of every row up to the mean position.
double bytes_per_step(const ModelConfig& c, const TensorMap& params, const peft::NF4Store* nf4,
                      int64_t batch, int64_t mean_len, DType dtype) {
  double bytes = 0;
  for (const auto& [name, t] : params) bytes += double(t.nbytes());
  if (nf4)
    for (const auto& [name, w] : *nf4) bytes += double(w.nbytes());
  const std::string table = "model.embed_tokens.weight";
  if (!c.tie_word_embeddings)
    bytes -= double(params.count(table) ? params.at(table).nbytes() : nf4->at(table).nbytes());
  return bytes + double(KVCache::bytes_for(c, batch, mean_len, dtype));
}

struct DecodeRun {
  double prefill_tps, decode_tps;  // tokens/s over every row
  double steps_per_s;              // decode steps/s (one token per row each)
};

DecodeRun run_decode(Generator& gen, const ModelConfig& c, int64_t batch, int64_t prompt_len,
                     int64_t new_tokens) {
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t i = 0; i < prompt_len; ++i)
      prompts[size_t(r)].push_back(int32_t((i * 7919 + r * 104729) % c.vocab_size));
  GenerationOptions o;
  o.max_new_tokens = new_tokens;
  o.sampling.temperature = 0;
  gen.generate(prompts, o);  // warm-up: compiles both graphs, touches the weights
  op_profile::reset();
  const GenerationStats s = gen.generate(prompts, o).stats;
  if (op_profile::enabled()) std::printf("%s", op_profile::report().c_str());  // FUSETUNE_PROFILE=1
  const double steps = double(s.decode_steps) / s.decode_seconds;
  return {double(s.prompt_tokens) / s.prefill_seconds, steps * double(batch), steps};
}

}  // namespace

int main(int argc, char** argv) try {
  BenchArgs args(argc, argv,
                 {{"shapes", "stories260K,mid,llama3.2-1b"},
                  {"modes", "false,true"},
                  {"dtypes", "fp32"},
                  {"batches", "1"},
                  {"prompt", "32"},
                  {"tokens", "64"}});
  const int64_t prompt_len = args.i64("prompt"), new_tokens = args.i64("tokens");
  FT_CHECK(prompt_len >= 1 && new_tokens >= 2, "--prompt must be >= 1 and --tokens >= 2");
  const Bandwidth bw = measure_bandwidth();
  std::printf(
      "%d threads; measured bandwidth: read %.2f GB/s, copy %.2f GB/s "
      "(bench_memory_bandwidth); prompt %lld tokens per row, %lld new tokens, greedy\n\n",
      omp_get_max_threads(), bw.read_gbs, bw.copy_gbs, (long long)prompt_len,
      (long long)new_tokens);
  std::printf("%-14s %-5s %5s %-7s %12s %12s %9s %12s %8s %9s %9s\n", "shape", "dtype", "batch",
              "compile", "prefill t/s", "decode t/s", "ms/step", "MiB/step", "GB/s", "% of read",
              "vs eager");
  for (const std::string& name : args.list("shapes")) {
    const BenchShape& shape = find_shape(name);
    const ModelConfig& c = shape.config;
    for (const std::string& dt : args.list("dtypes")) {
      const DType dtype = dt == "bf16" ? DType::BF16 : DType::F32;
      FT_CHECK(dt == "bf16" || dt == "fp32" || dt == "nf4",
               "--dtypes takes fp32, bf16 and nf4, not '" + dt + "'");
      TensorMap params =
          init_parameters(graph_parameters(build_decode_graph(c, 1, 1, 2, dtype)), 1234, dtype);
      std::shared_ptr<peft::NF4Store> nf4;
      if (dt == "nf4") nf4 = peft::quantize_base_weights(params, c);
      const LlamaOptions llama = nf4 ? peft::base_llama_options(nf4) : LlamaOptions{};
      for (const std::string& b : args.list("batches")) {
        const int64_t batch = std::stoll(b);
        const double bytes =
            bytes_per_step(c, params, nf4.get(), batch, prompt_len + new_tokens / 2, dtype);
        double eager_tps = 0;
        for (const std::string& m : args.list("modes")) {
          const CompileMode mode = parse_compile_mode(m);
          Generator gen(c, params, llama, mode, dtype);
          const DecodeRun r = run_decode(gen, c, batch, prompt_len, new_tokens);
          if (mode == CompileMode::None) eager_tps = r.decode_tps;
          const double gbs = bytes * r.steps_per_s / 1e9;
          char vs[32] = "-";
          if (eager_tps > 0 && mode != CompileMode::None)
            std::snprintf(vs, sizeof vs, "%.2fx", r.decode_tps / eager_tps);
          std::printf("%-14s %-5s %5lld %-7s %12.1f %12.1f %9.2f %12.1f %8.2f %8.0f%% %9s\n",
                      name.c_str(), dt.c_str(), (long long)batch, compile_mode_name(mode),
                      r.prefill_tps, r.decode_tps, 1e3 / r.steps_per_s, bytes / (1 << 20), gbs,
                      100 * gbs / bw.read_gbs, vs);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_decode: %s\n", e.what());
  return 1;
}
