// Knowledge distillation, LoRA and full student, each in every compile mode, on one shape:
// the recipe's own step (recipes/kd_step.h: the frozen teacher's forward, then the student's
// joint graph with (1 - kd_ratio) CE + kd_ratio KD) plus AdamW, on the same seeded batches.
// The student is the shape (L3-micro: vocabulary 128,256, width 256, 4 layers); the teacher
// the same vocabulary at twice the width and ffn (512, 1536; 8 heads, 4 KV heads), same depth,
// untied, random-init. LoRA: q/v/o + MLP, rank 16, the head frozen; lora_head: the same plus
// an adapter on lm_head (its A and B inside the fused kernel); full: every student weight
// trained, the head included; topk: full, the teacher restricted to its top-64 each step
// (teacher_logits.top_k); dora_head: lora_head with DoRA (the column scale in the kernel, the
// head's row norms a tile at a time); dropout_head: lora_head with lora_dropout 0.1 (the
// adapter's dropped-out input in the kernel). Forward KL, kd_ratio 0.5.
//   bench_kd --shape L3-micro --steps 3 [--methods lora,lora_head,full,topk,dora_head,dropout_head]
//   [--modes false,model,true]
//   [--dtype fp32|bf16] [--threads 2]
// bf16: both models' weights (and the LoRA adapters) stored in bf16, as `dtype: bf16` runs;
// the fused kernel then reads both heads as stored, a tile of rows at a time.
// Under `compile: true` the KD step hands both models' hidden states and heads to one fused
// kernel (kernels/cpu/fused_linear_divergence.h); under false and model both [tokens x vocab]
// logits exist. Prints a table (tokens/s counts the student's B x T positions; the ratios are
// against compile: model of the same method; peak counts both models' weights, the student's
// gradients and AdamW state and every activation), then one JSON line. Nothing here asserts
// a timing.
#include <iostream>

#include "bench_args.h"
#include "fusetune/peft/head_parts.h"
#include "fusetune/peft/lora.h"
#include "fusetune/recipes/kd_step.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/strings.h"
#include "method_results.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

using Result = MethodModeResult;

// The student's vocabulary at twice its width and ffn.
ModelConfig teacher_of(const ModelConfig& s) {
  return llama_shape(s.vocab_size, 2 * s.hidden_size, s.num_hidden_layers,
                     2 * s.num_attention_heads, 2 * s.num_key_value_heads, 2 * s.intermediate_size,
                     false);
}

Result run(const BenchShape& shape, const std::string& method, CompileMode mode, DType dtype,
           int steps) {
  Result r;
  r.method = method;
  r.mode = compile_mode_name(mode);
  const ModelConfig teacher = teacher_of(shape.config);
  const int64_t base = memory::current_bytes();
  {
    TensorMap params = init_parameters(
        graph_parameters(build_training_graph(shape.config, {}).graph), 1234, dtype);
    const TensorMap teacher_params =
        init_parameters(graph_parameters(build_training_graph(teacher, {}).graph), 4321, dtype);
    KdStepOptions o;
    o.student.model = &shape.config;
    o.student.params = &params;
    o.student.trainable = [](const std::string&) { return true; };
    o.student.passes.mode = mode;
    o.student.dtype = dtype;
    o.teacher = &teacher;
    o.teacher_params = &teacher_params;
    o.kd_ratio = 0.5;
    if (method == "lora" || method == "lora_head" || method == "dora_head" ||
        method == "dropout_head") {
      peft::LoraConfig lc = bench_lora_config();
      lc.apply_to_output = method != "lora";  // the head adapted: A and B in the kernel
      lc.use_dora = method == "dora_head";
      if (method == "dropout_head") {
        lc.dropout = 0.1;
        o.student.add_inputs = [](TensorMap& in, int64_t step, int64_t micro) {
          Tensor seed = Tensor::empty({}, DType::I32);
          seed.data<int32_t>()[0] = int32_t(1 + step * 16 + micro);
          in[peft::kDropoutSeedInput] = seed;
        };
      }
      peft::init_adapters(params, shape.config, lc, 1, dtype);
      o.student.trainable = peft::is_adapter_param;
      o.student.llama = peft::lora_llama_options(lc);
      o.head_parts = [lc](std::shared_ptr<KdStudentHead> parts) {
        return peft::head_parts_hook(lc, nullptr, std::move(parts));
      };
    }
    if (method == "topk") o.teacher_top_k = 64;  // full student, the teacher's top-64 each step
    memory::reset_peak();
    std::unique_ptr<TrainingStep> step = make_kd_step(std::move(o));
    const RecipeStepTimes t = run_recipe_step(
        *step, params, steps, shape.batch * shape.seq,
        [&](int s) { return synthetic_batch(shape, 99 + uint64_t(s)); }, method + " " + r.mode);
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
                        {"modes", "false,model,true"},
                        {"dtype", "fp32"}});
  const std::string shape_name = args.str("shape"), methods = args.str("methods"),
                    modes = args.str("modes");
  const int steps = int(args.i64("steps"));
  const std::string dtype_name = args.str("dtype");
  FT_CHECK(dtype_name == "fp32" || dtype_name == "bf16", "--dtype must be fp32 or bf16");
  const DType dtype = dtype_name == "bf16" ? DType::BF16 : DType::F32;
  FT_CHECK(steps >= 2, "--steps must be >= 2 (the first step is not timed)");
  const BenchShape& shape = find_shape(shape_name);
  const ModelConfig t = teacher_of(shape.config);
  std::printf(
      "shape %s: vocab %lld, student dim %lld ffn %lld, teacher dim %lld ffn %lld, %lld layers "
      "each, %lld x %lld tokens; %s; %d threads\n\n",
      shape.name.c_str(), (long long)shape.config.vocab_size, (long long)shape.config.hidden_size,
      (long long)shape.config.intermediate_size, (long long)t.hidden_size,
      (long long)t.intermediate_size, (long long)shape.config.num_hidden_layers,
      (long long)shape.batch, (long long)shape.seq, dtype_name.c_str(), omp_get_max_threads());
  std::vector<Result> results;
  for (const std::string& m : split(methods, ','))
    for (const std::string& c : split(modes, ',')) {
      FT_CHECK(m == "lora" || m == "lora_head" || m == "full" || m == "topk" || m == "dora_head" ||
                   m == "dropout_head",
               "--methods: unknown method '" + m +
                   "' (lora, lora_head, full, topk, dora_head, dropout_head)");
      results.push_back(run(shape, m, parse_compile_mode(c), dtype, steps));
    }
  print_method_results(shape.name, results);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_kd: error: %s\n", e.what());
  return 1;
}
