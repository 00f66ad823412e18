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

#include "bench_args.h"
#include "fusetune/peft/lora.h"
#include "fusetune/recipes/dpo_step.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/strings.h"
#include "method_results.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

using Result = MethodModeResult;

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
      const peft::LoraConfig lc = bench_lora_config();
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
    record_step_times(r, t, memory::peak_bytes() - base);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       {{"shape", "L3-micro"},
                        {"steps", "3"},
                        {"methods", "lora,full"},
                        {"modes", "false,model,true"}});
  const std::string shape_name = args.str("shape"), methods = args.str("methods"),
                    modes = args.str("modes");
  const int steps = int(args.i64("steps"));
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
  print_method_results(shape.name, results);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_dpo: error: %s\n", e.what());
  return 1;
}
