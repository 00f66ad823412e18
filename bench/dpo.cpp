// LoRA-DPO and full DPO, each in every compile mode, on one shape: the recipe's own step
// (recipes/dpo_step.h: the reference model's forward, then the policy's joint graph) plus
// AdamW, on the same seeded preference pairs. A batch is the shape's rows as B/2 pairs, chosen
// then rejected; the first quarter of each row is prompt (-100). The reference is a frozen
// copy of the initial weights (full) or the base without adapters (LoRA, q/v/o + MLP, rank 16).
//   bench_dpo --shape L3-micro --steps 3 [--methods lora,full] [--modes false,model,true]
//   [--threads 2]
// Prints a table (tokens/s counts every position of the policy's 2B x T rows; the ratios are
// against compile: model of the same method, as the targets name them), then one JSON line.
// FUSETUNE_PROFILE=1 prints each run's time per op. Nothing here asserts a timing.
#include <iostream>

#include <nlohmann/json.hpp>

#include "fusetune/peft/lora.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/strings.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

struct Result {
  std::string method, mode;
  double tokens_per_s = 0, compile_s = 0;
  int64_t peak_bytes = 0;
  std::vector<double> losses;
};

Batch pair_batch(const BenchShape& shape, uint64_t seed) {
  Batch b = synthetic_batch(shape, seed);
  for (int64_t r = 0; r < b.batch_size; ++r)
    for (int64_t t = 0; t < b.seq_len / 4; ++t) b.labels[size_t(r * b.seq_len + t)] = kIgnoreIndex;
  b.items.clear();
  for (int64_t i = 0; i < b.batch_size / 2; ++i) b.items.push_back(i);
  return b;
}

Result run(const BenchShape& shape, const std::string& method, CompileMode mode, int steps) {
  Result r;
  r.method = method;
  r.mode = compile_mode_name(mode);
  const int64_t base = memory::current_bytes();
  {
    TrainingGraph plain = build_training_graph(shape.config, TrainingGraphOptions{});
    TensorMap params = init_parameters(graph_parameters(plain.graph), 1234, DType::F32);
    TensorMap ref;
    DpoStepOptions o;
    o.policy.model = &shape.config;
    o.policy.params = &params;
    o.policy.trainable = [](const std::string&) { return true; };
    o.policy.passes.mode = mode;
    if (method == "lora") {
      peft::LoraConfig lc;
      lc.attn_modules = {"q_proj", "v_proj", "output_proj"};
      lc.apply_to_mlp = true;
      lc.rank = 16;
      lc.alpha = 32;
      peft::init_adapters(params, shape.config, lc, 1, DType::F32);
      o.policy.trainable = peft::is_adapter_param;
      o.policy.llama = peft::lora_llama_options(lc);
      o.ref_params = &params;
      o.ref_llama = peft::base_llama_options();
    } else {
      for (const auto& [n, t] : params) ref[n] = t.clone();
      o.ref_params = &ref;
    }
    memory::reset_peak();
    std::unique_ptr<TrainingStep> step = make_dpo_step(std::move(o));
    const RecipeStepTimes t = run_recipe_step(
        *step, params, steps, shape.batch * shape.seq,
        [&](int s) { return pair_batch(shape, 99 + uint64_t(s)); }, method + " " + r.mode);
    r.peak_bytes = memory::peak_bytes() - base;
    r.losses = t.losses;
    r.compile_s = t.compile_s;
    r.tokens_per_s = t.tokens_per_s;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string shape_name = "L3-micro", methods = "lora,full", modes = "false,model,true";
  int steps = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      FT_CHECK(i + 1 < argc, "missing value after " + a);
      return argv[++i];
    };
    if (a == "--shape")
      shape_name = next();
    else if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--methods")
      methods = next();
    else if (a == "--modes")
      modes = next();
    else if (a == "--threads")
      omp_set_num_threads(std::stoi(next()));
    else
      throw Error("unknown argument '" + a +
                  "' (use --shape, --steps, --methods, --modes, --threads)");
  }
  FT_CHECK(steps >= 2, "--steps must be >= 2 (the first step is not timed)");
  const BenchShape& shape = find_shape(shape_name);
  FT_CHECK(shape.batch % 2 == 0, "the shape's batch must hold whole pairs");
  std::printf(
      "shape %s: vocab %lld, dim %lld, layers %lld, %lld pairs x 2 x %lld tokens; %d threads\n\n",
      shape.name.c_str(), (long long)shape.config.vocab_size, (long long)shape.config.hidden_size,
      (long long)shape.config.num_hidden_layers, (long long)shape.batch / 2, (long long)shape.seq,
      omp_get_max_threads());
  std::vector<Result> results;
  for (const std::string& m : split(methods, ','))
    for (const std::string& c : split(modes, ',')) {
      FT_CHECK(m == "lora" || m == "full", "--methods: unknown method '" + m + "'");
      results.push_back(run(shape, m, parse_compile_mode(c), steps));
    }
  const double MiB = 1 << 20;
  std::printf("%-6s %-7s %10s %9s %9s %10s  %s\n", "method", "compile", "tokens/s", "peak MiB",
              "compile s", "last loss", "vs model (tok/s, peak)");
  for (const Result& r : results) {
    std::string ratio;
    for (const Result& m : results)
      if (m.method == r.method && m.mode == "model") {
        char buf[64];
        std::snprintf(buf, sizeof buf, "x%.2f, x%.2f", r.tokens_per_s / m.tokens_per_s,
                      double(r.peak_bytes) / double(m.peak_bytes));
        ratio = buf;
      }
    std::printf("%-6s %-7s %10.1f %9.1f %9.3f %10.5f  %s\n", r.method.c_str(), r.mode.c_str(),
                r.tokens_per_s, double(r.peak_bytes) / MiB, r.compile_s, r.losses.back(),
                ratio.c_str());
  }
  nlohmann::json j;
  j["shape"] = shape.name;
  for (const Result& r : results)
    j["runs"].push_back({{"method", r.method},
                         {"compile", r.mode},
                         {"tokens_per_s", r.tokens_per_s},
                         {"peak_bytes", r.peak_bytes},
                         {"compile_s", r.compile_s},
                         {"losses", r.losses}});
  std::printf("%s\n", j.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_dpo: error: %s\n", e.what());
  return 1;
}
