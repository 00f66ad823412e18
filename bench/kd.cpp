// Knowledge distillation, LoRA and full student, each in every compile mode, on one shape:
// the recipe's own step (recipes/kd_step.h: the frozen teacher's forward, then the student's
// joint graph with (1 - kd_ratio) CE + kd_ratio KD) plus AdamW, on the same seeded batches.
// The student is the shape (L3-micro: vocabulary 128,256, width 256, 4 layers); the teacher
// the same vocabulary at twice the width and ffn (512, 1536; 8 heads, 4 KV heads), same depth,
// untied, random-init. LoRA: q/v/o + MLP, rank 16, the head frozen; full: every student
// weight trained, the head included. Forward KL, kd_ratio 0.5.
//   bench_kd --shape L3-micro --steps 3 [--methods lora,full] [--modes false,model,true]
//   [--threads 2]
// Under `compile: true` the KD step hands both models' hidden states and heads to one fused
// kernel (kernels/cpu/fused_linear_divergence.h); under false and model both [tokens x vocab]
// logits exist. Prints a table (tokens/s counts the student's B x T positions; the ratios are
// against compile: model of the same method; peak counts both models' weights, the student's
// gradients and AdamW state and every activation), then one JSON line. Nothing here asserts
// a timing.
#include <iostream>

#include <nlohmann/json.hpp>

#include "bench_args.h"
#include "fusetune/peft/lora.h"
#include "fusetune/recipes/kd_step.h"
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

// The student's vocabulary at twice its width and ffn.
ModelConfig teacher_of(const ModelConfig& s) {
  return llama_shape(s.vocab_size, 2 * s.hidden_size, s.num_hidden_layers,
                     2 * s.num_attention_heads, 2 * s.num_key_value_heads, 2 * s.intermediate_size,
                     false);
}

Result run(const BenchShape& shape, const std::string& method, CompileMode mode, int steps) {
  Result r;
  r.method = method;
  r.mode = compile_mode_name(mode);
  const ModelConfig teacher = teacher_of(shape.config);
  const int64_t base = memory::current_bytes();
  {
    TensorMap params = init_parameters(
        graph_parameters(build_training_graph(shape.config, {}).graph), 1234, DType::F32);
    const TensorMap teacher_params = init_parameters(
        graph_parameters(build_training_graph(teacher, {}).graph), 4321, DType::F32);
    KdStepOptions o;
    o.student.model = &shape.config;
    o.student.params = &params;
    o.student.trainable = [](const std::string&) { return true; };
    o.student.passes.mode = mode;
    o.teacher = &teacher;
    o.teacher_params = &teacher_params;
    o.kd_ratio = 0.5;
    if (method == "lora") {
      peft::LoraConfig lc;
      lc.attn_modules = {"q_proj", "v_proj", "output_proj"};
      lc.apply_to_mlp = true;
      lc.rank = 16;
      lc.alpha = 32;
      peft::init_adapters(params, shape.config, lc, 1, DType::F32);
      o.student.trainable = peft::is_adapter_param;
      o.student.llama = peft::lora_llama_options(lc);
    }
    memory::reset_peak();
    std::unique_ptr<TrainingStep> step = make_kd_step(std::move(o));
    const RecipeStepTimes t = run_recipe_step(
        *step, params, steps, shape.batch * shape.seq,
        [&](int s) { return synthetic_batch(shape, 99 + uint64_t(s)); }, method + " " + r.mode);
    r.peak_bytes = memory::peak_bytes() - base;
    r.losses = t.losses;
    r.compile_s = t.compile_s;
    r.tokens_per_s = t.tokens_per_s;
  }
  return r;
}

void print_table(const std::vector<Result>& results) {
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
  const ModelConfig t = teacher_of(shape.config);
  std::printf(
      "shape %s: vocab %lld, student dim %lld ffn %lld, teacher dim %lld ffn %lld, %lld layers "
      "each, %lld x %lld tokens; %d threads\n\n",
      shape.name.c_str(), (long long)shape.config.vocab_size, (long long)shape.config.hidden_size,
      (long long)shape.config.intermediate_size, (long long)t.hidden_size,
      (long long)t.intermediate_size, (long long)shape.config.num_hidden_layers,
      (long long)shape.batch, (long long)shape.seq, omp_get_max_threads());
  std::vector<Result> results;
  for (const std::string& m : split(methods, ','))
    for (const std::string& c : split(modes, ',')) {
      FT_CHECK(m == "lora" || m == "full", "--methods: unknown method '" + m + "'");
      results.push_back(run(shape, m, parse_compile_mode(c), steps));
    }
  print_table(results);
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
  std::fprintf(stderr, "bench_kd: error: %s\n", e.what());
  return 1;
}
