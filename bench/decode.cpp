// Batch-1 decode with the KV cache: tokens/s of the prefill and of each decode step, eager vs
// compiled, and the memory bandwidth the decode achieves (weight bytes read per token x
// tokens/s) against the machine's measured bandwidth. Batch-1 decode reads every weight once
// per token, so bandwidth is its roofline (llama.cpp's CPU decode is the reference users know).
// Random-init weights of the named shapes; greedy decoding of a fixed synthetic prompt.
#include <cstdio>

#include "bench_args.h"
#include "fusetune/generation/generator.h"
#include "fusetune/generation/kv_cache.h"
#include "fusetune/models/decode_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/runtime/op_profile.h"
#include "memory_bandwidth.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

// Bytes one decode step reads: every weight but the embedding table (one row of it, unless
// the head is tied to it), plus the KV cache up to the mean position.
double bytes_per_token(const ModelConfig& c, const TensorMap& params, int64_t mean_len) {
  double bytes = 0;
  for (const auto& [name, t] : params) bytes += double(t.nbytes());
  if (!c.tie_word_embeddings) bytes -= double(params.at("model.embed_tokens.weight").nbytes());
  return bytes + double(KVCache::bytes_for(c, 1, mean_len, DType::F32));
}

}  // namespace

int main(int argc, char** argv) try {
  BenchArgs args(argc, argv,
                 {{"shapes", "stories260K,mid,llama3.2-1b"},
                  {"modes", "false,true"},
                  {"prompt", "32"},
                  {"tokens", "64"}});
  const int64_t prompt_len = args.i64("prompt"), new_tokens = args.i64("tokens");
  FT_CHECK(prompt_len >= 1 && new_tokens >= 2, "--prompt must be >= 1 and --tokens >= 2");
  const Bandwidth bw = measure_bandwidth();
  std::printf(
      "%d threads; measured bandwidth: read %.2f GB/s, copy %.2f GB/s "
      "(bench_memory_bandwidth); prompt %lld tokens, %lld new tokens, greedy, batch 1\n\n",
      omp_get_max_threads(), bw.read_gbs, bw.copy_gbs, (long long)prompt_len,
      (long long)new_tokens);
  std::printf("%-12s %-7s %12s %12s %9s %12s %8s %9s %9s\n", "shape", "compile", "prefill t/s",
              "decode t/s", "ms/token", "MiB/token", "GB/s", "% of read", "vs eager");
  for (const std::string& name : args.list("shapes")) {
    const BenchShape& shape = find_shape(name);
    const ModelConfig& c = shape.config;
    TensorMap params = init_parameters(graph_parameters(build_decode_graph(c, 1, 1, 2, DType::F32)),
                                       1234, DType::F32);
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(int32_t((i * 7919) % c.vocab_size));
    const double bytes = bytes_per_token(c, params, prompt_len + new_tokens / 2);
    double eager_tps = 0;
    for (const std::string& m : args.list("modes")) {
      const CompileMode mode = parse_compile_mode(m);
      Generator gen(c, params, {}, mode, DType::F32);
      GenerationOptions o;
      o.max_new_tokens = new_tokens;
      o.sampling.temperature = 0;
      gen.generate({prompt}, o);  // warm-up: compiles both graphs, touches the weights
      op_profile::reset();
      const GenerationStats s = gen.generate({prompt}, o).stats;
      if (op_profile::enabled())
        std::printf("%s", op_profile::report().c_str());  // FUSETUNE_PROFILE=1
      const double tps = double(s.decode_steps) / s.decode_seconds;
      if (mode == CompileMode::None) eager_tps = tps;
      const double gbs = bytes * tps / 1e9;
      char vs[32] = "-";
      if (eager_tps > 0 && mode != CompileMode::None)
        std::snprintf(vs, sizeof vs, "%.2fx", tps / eager_tps);
      std::printf("%-12s %-7s %12.1f %12.1f %9.2f %12.1f %8.2f %8.0f%% %9s\n", name.c_str(),
                  compile_mode_name(mode), double(s.prompt_tokens) / s.prefill_seconds, tps,
                  1e3 / tps, bytes / (1 << 20), gbs, 100 * gbs / bw.read_gbs, vs);
      std::fflush(stdout);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_decode: %s\n", e.what());
  return 1;
}
