// Random init of a real-size model, one tensor at a time, the way `model.init: random`
// produces it (models/parameters.h): into bf16 / fp32, or with QLoRA's base quantized to NF4
// as it is generated (peft::NF4BaseSink). With --checkpoint DIR, loading that checkpoint the
// way load_model does (io/hf_checkpoint.h, load_hf_checkpoint_owned) instead. Prints seconds,
// GB/s of final storage, the counted peak (core/memory.h) and the process peak RSS.
// Nothing is written to disk.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>

#include "bench_args.h"
#include "fusetune/core/memory.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/models/parameters.h"
#include "fusetune/peft/nf4_weight.h"

using namespace fusetune;

namespace {

ModelConfig shape_config(const std::string& shape) {
  ModelConfig c;
  c.head_dim = 128;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.vocab_size = 128256;
  c.max_position_embeddings = 8192;
  if (shape == "llama3.1-8b") {
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
  } else if (shape == "llama3.2-1b") {
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.head_dim = 64;
    c.tie_word_embeddings = true;
  } else {
    throw Error("unknown --shape '" + shape + "' (llama3.1-8b, llama3.2-1b)");
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::BenchArgs args(
      argc, argv, {{"shape", "llama3.1-8b"}, {"as", "bf16"}, {"seed", "0"}, {"checkpoint", ""}});
  const std::string dir = args.str("checkpoint");
  const ModelConfig c = dir.empty() ? shape_config(args.str("shape")) : load_model_config(dir);
  const std::string as = args.str("as");
  FT_CHECK(as == "bf16" || as == "fp32" || as == "nf4", "--as must be bf16, fp32 or nf4");
  std::vector<ParamInfo> params;
  int64_t numel = 0;
  for (const auto& [name, shape] : expected_parameters(c)) {
    params.push_back({name, shape, false});
    numel += shape_numel(shape);
  }
  const auto t0 = std::chrono::steady_clock::now();
  peft::NF4BaseSink sink;
  const DType dtype = as == "fp32" ? DType::F32 : DType::BF16;
  TensorMap m;
  if (dir.empty()) {
    m = init_parameters(params, uint64_t(args.i64("seed")), dtype, 0.02,
                        as == "nf4" ? &sink : nullptr);
  } else {
    HFCheckpoint ck = load_hf_checkpoint_owned(dir, {}, dtype, as == "nf4" ? &sink : nullptr);
    m.insert(ck.tensors.begin(), ck.tensors.end());
  }
  int64_t bytes = 0;
  for (const auto& [name, t] : m) bytes += int64_t(t.nbytes());
  if (as == "nf4")
    for (const auto& [name, w] : *sink.finish(c)) bytes += w.nbytes();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  std::printf(
      "%s%s as %s, %d threads: %.2fB parameters -> %s in %.1f s (%.2f GB/s of final storage); "
      "counted peak %s; peak RSS %s\n",
      dir.empty() ? "random init of " : "loading ",
      dir.empty() ? args.str("shape").c_str() : dir.c_str(), as.c_str(), omp_get_max_threads(),
      numel / 1e9, format_bytes(double(bytes)).c_str(), secs, bytes / secs / 1e9,
      format_bytes(double(memory::peak_bytes())).c_str(),
      format_bytes(double(ru.ru_maxrss) * 1024).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_model_init: %s\n", e.what());
  return 1;
}
