// GRPO's step broken into its parts, per shape and compile mode, on seeded random weights and
// prompts: the rollout (recipes/grpo_rollout.h: grpo_samples completions per prompt with the
// KV cache on the training weights, a seed per prompt as GrpoStep gives; generated tokens/s), the
// reference's forward-only scoring of the rollout (models/grpo_graph.h; the policy's old log-probs
// cost the same), and the train part: the joint graph of the model, the clipped GRPO loss with its
// k3 KL and the backward, plus AdamW (what GrpoStep::run does per micro-batch).
//   bench_grpo --shapes tiny,L3-micro [--prompts 2] [--samples 4] [--prompt-tokens 16]
//   [--new-tokens 32] [--steps 3] [--modes false,model,true] [--threads N]
// Prints a table (train tok/s counts every position of the rollout's rows; "vs model" is the
// train part's speed against compile: model on the same shape), then one JSON line. Nothing
// here asserts a timing.
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench_args.h"
#include "fusetune/generation/generator.h"
#include "fusetune/losses/grpo_normalization.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/recipes/grpo_rollout.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/util/mix64.h"
#include "fusetune/util/strings.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

struct Options {  // main()'s BenchArgs hold the defaults
  int64_t prompts = 0, samples = 0, prompt_tokens = 0, new_tokens = 0;
  int steps = 0;
};

struct Result {
  std::string shape, mode;
  int64_t rows = 0, seq = 0, generated = 0;
  double gen_tokens_per_s = 0, ref_s = 0, train_s = 0, train_tokens_per_s = 0;
  int64_t peak_bytes = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The rollout, timed on its second run (the first compiles the decode graphs).
GrpoRollout timed_rollout(const BenchShape& shape, const TensorMap& params, CompileMode mode,
                          const Options& o, Result& r) {
  const auto prompts = random_prompts(o.prompts, o.prompt_tokens, shape.config.vocab_size);
  Generator gen(shape.config, params, {}, mode, DType::F32);
  GenerationOptions g;
  g.max_new_tokens = o.new_tokens;
  g.sampling = {1.0, 0, 1.0};
  g.seed = 11;
  // A seed per prompt, as GrpoStep gives (each row then samples on its own, in parallel).
  std::vector<uint64_t> seeds;
  for (int64_t i = 0; i < o.prompts; ++i) seeds.push_back(mix64(uint64_t(i) + 1));
  generate_rollout(gen, prompts, o.samples, g, seeds);
  const auto t0 = std::chrono::steady_clock::now();
  GrpoRollout roll = generate_rollout(gen, prompts, o.samples, g, seeds);
  const double s = seconds_since(t0);
  for (const auto& c : roll.completions) r.generated += int64_t(c.size());
  r.gen_tokens_per_s = double(r.generated) / s;
  return roll;
}

Result run(const BenchShape& shape, CompileMode mode, const Options& o) {
  Result r;
  r.shape = shape.name;
  r.mode = compile_mode_name(mode);
  const int64_t base = memory::current_bytes();
  const GrpoLoss loss{GrpoLossType::GRPO, 0.2, 0.2, 0.04, 1.0};
  PassOptions po;
  po.mode = mode;
  TrainingGraphOptions go;
  go.loss = grpo_loss_builder(loss);
  {
    TensorMap params = init_parameters(
        graph_parameters(build_logits_graph(shape.config, 1, 4, DType::F32)), 1234, DType::F32);
    memory::reset_peak();
    const Batch b = rollout_batch(timed_rollout(shape, params, mode, o, r), 0, 8);
    r.rows = b.batch_size;
    r.seq = b.seq_len;
    const int64_t N = b.batch_size * b.seq_len;
    // The reference's scoring forward (its log-probs also stand for the old ones).
    CompiledStep score = compile_graph(
        build_token_log_probs_graph(shape.config, b.batch_size, b.seq_len, DType::F32), po);
    const TensorMap bin = batch_inputs(b);
    Tensor ref = score.executor->run(bin, params)[0];
    auto t0 = std::chrono::steady_clock::now();
    ref = score.executor->run(bin, params)[0];
    r.ref_s = seconds_since(t0);
    // The train part.
    go.batch_size = b.batch_size;
    go.seq_len = b.seq_len;
    TrainingGraph tg = build_training_graph(shape.config, go);
    CompiledStep train = compile_graph(tg.graph, po);
    TensorMap in = bin;
    in["loss_scale"] = scalar_input(1.0, DType::F32);
    in["old_logps"] = ref;
    in["ref_logps"] = ref;
    const std::vector<float> mask = completion_mask(b);
    std::vector<float> adv(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) adv[size_t(i)] = (i / b.seq_len) % 2 ? 0.7f : -0.7f;
    in["advantages"] = f32_tensor(adv);
    in["token_weights"] =
        f32_tensor(grpo_token_weights(GrpoLossType::GRPO, mask, b.batch_size, b.seq_len, {}));
    AdamW opt(AdamWOptions{});
    std::vector<double> step_s;
    for (int s = 0; s < o.steps; ++s) {
      t0 = std::chrono::steady_clock::now();
      std::vector<Tensor> out = train.executor->run(in, params);
      std::vector<ParamRef> refs;
      for (size_t i = 0; i < tg.trainable_params.size(); ++i)
        refs.push_back({tg.trainable_params[i], &params[tg.trainable_params[i]], &out[1 + i]});
      opt.step(refs, 1e-4);
      step_s.push_back(seconds_since(t0));
    }
    step_s.erase(step_s.begin());  // the first step allocates its arena
    r.train_s = median(step_s);
    r.train_tokens_per_s = double(N) / r.train_s;
    r.peak_bytes = memory::peak_bytes() - base;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  const BenchArgs args(argc, argv,
                       {{"shapes", "tiny,L3-micro"},
                        {"modes", "false,model,true"},
                        {"prompts", "2"},
                        {"samples", "4"},
                        {"prompt-tokens", "16"},
                        {"new-tokens", "32"},
                        {"steps", "3"}});
  const std::string shapes_arg = args.str("shapes"), modes = args.str("modes");
  Options o;
  o.prompts = args.i64("prompts");
  o.samples = args.i64("samples");
  o.prompt_tokens = args.i64("prompt-tokens");
  o.new_tokens = args.i64("new-tokens");
  o.steps = int(args.i64("steps"));
  FT_CHECK(o.steps >= 2, "--steps must be >= 2 (the first step is not timed)");
  std::printf("%lld prompts x %lld samples, %lld prompt + up to %lld new tokens; %d threads\n\n",
              (long long)o.prompts, (long long)o.samples, (long long)o.prompt_tokens,
              (long long)o.new_tokens, omp_get_max_threads());
  std::vector<Result> results;
  for (const std::string& s : split(shapes_arg, ','))
    for (const std::string& c : split(modes, ','))
      results.push_back(run(find_shape(s), parse_compile_mode(c), o));
  std::printf("%-9s %-7s %9s %11s %9s %9s %12s %9s  %s\n", "shape", "compile", "rows x T",
              "gen tok/s", "ref fwd s", "train s", "train tok/s", "peak MiB", "train vs model");
  for (const Result& r : results) {
    std::string ratio;
    for (const Result& m : results)
      if (m.shape == r.shape && m.mode == "model") {
        char buf[32];
        std::snprintf(buf, sizeof buf, "x%.2f", r.train_tokens_per_s / m.train_tokens_per_s);
        ratio = buf;
      }
    const std::string rows = std::to_string(r.rows) + " x " + std::to_string(r.seq);
    std::printf("%-9s %-7s %9s %11.1f %9.4f %9.4f %12.1f %9.1f  %s\n", r.shape.c_str(),
                r.mode.c_str(), rows.c_str(), r.gen_tokens_per_s, r.ref_s, r.train_s,
                r.train_tokens_per_s, double(r.peak_bytes) / double(1 << 20), ratio.c_str());
  }
  nlohmann::json j;
  for (const Result& r : results)
    j["runs"].push_back({{"shape", r.shape},
                         {"compile", r.mode},
                         {"rows", r.rows},
                         {"seq", r.seq},
                         {"generated_tokens", r.generated},
                         {"gen_tokens_per_s", r.gen_tokens_per_s},
                         {"ref_forward_s", r.ref_s},
                         {"train_s", r.train_s},
                         {"train_tokens_per_s", r.train_tokens_per_s},
                         {"peak_bytes", r.peak_bytes}});
  std::printf("%s\n", j.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_grpo: error: %s\n", e.what());
  return 1;
}
