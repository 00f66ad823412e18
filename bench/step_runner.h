#pragma once
// Shared by the step benchmarks: named model shapes, and one training run (forward + loss +
// backward + AdamW) of N steps in a given compile mode, measured the way the recipe logs it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/core/memory.h"
#include "fusetune/data/batch.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/peft/lora.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/error.h"

namespace fusetune::bench {

// A 1-D fp32 tensor holding v (a step's per-token input).
inline Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::F32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// `count` prompts of `tokens` ids below `vocab`, seeded (the RL benches' rollouts).
inline std::vector<std::vector<int32_t>> random_prompts(int64_t count, int64_t tokens,
                                                        int64_t vocab, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(count));
  for (auto& p : prompts)
    for (int64_t t = 0; t < tokens; ++t) p.push_back(int32_t(rng() % uint64_t(vocab)));
  return prompts;
}

struct BenchShape {
  std::string name;
  ModelConfig config;
  int64_t batch, seq;
};

inline ModelConfig llama_shape(int64_t vocab, int64_t dim, int64_t layers, int64_t heads,
                               int64_t kv, int64_t ffn, bool tied) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = dim;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv;
  c.head_dim = dim / heads;
  c.intermediate_size = ffn;
  c.rope_theta = 500000;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.max_position_embeddings = 8192;
  return c;
}

inline const std::vector<BenchShape>& shapes() {
  static const std::vector<BenchShape> all = {
      {"L3-micro", llama_shape(128256, 256, 4, 4, 2, 768, false), 4, 256},
      {"mid", llama_shape(32000, 512, 8, 8, 4, 1408, false), 4, 256},
      {"smollm2-135m", llama_shape(49152, 576, 30, 9, 3, 1536, true), 4, 256},
      {"tiny", llama_shape(4096, 128, 2, 4, 2, 384, false), 2, 128},
      {"stories260K", llama_shape(512, 64, 5, 8, 4, 172, true), 8, 256},
      {"llama3.2-1b", llama_shape(128256, 2048, 16, 32, 8, 8192, true), 1, 512},
      // TinyLlama 1.1B's shape (issue 31's decode comparison with llama.cpp).
      {"tinyllama-1.1b", llama_shape(32000, 2048, 22, 32, 4, 5632, false), 1, 512},
      // Llama 3.1 8B's shape, random-init (fp32: ~32 GB of weights; LoRA/QLoRA fit far better).
      {"llama3.1-8b", llama_shape(128256, 4096, 32, 32, 8, 14336, false), 1, 512},
  };
  return all;
}

inline const BenchShape& find_shape(const std::string& name) {
  std::string names;
  for (const BenchShape& s : shapes()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw Error("unknown shape '" + name + "' (known: " + names + ")");
}

// Every parameter of the shape's model (as the run header counts them).
inline int64_t shape_params(const BenchShape& s) {
  int64_t n = 0;
  for (const ParamInfo& p : graph_parameters(build_training_graph(s.config, {}).graph)) {
    int64_t e = 1;
    for (int64_t d : p.shape) e *= d;
    n += e;
  }
  return n;
}

struct RunResult {
  std::string mode;
  std::vector<double> losses;
  std::vector<double> step_s;
  double tokens_per_s = 0;  // all B*T positions per second, median of steps 2..N
  int64_t peak_bytes = 0;   // params + grads + optimizer state + activations/arena
  double compile_s = 0;
  double flops_per_step = 0;
};

inline Batch synthetic_batch(const BenchShape& s, uint64_t seed) {
  Batch b;
  b.batch_size = s.batch;
  b.seq_len = s.seq;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < s.batch * s.seq; ++i)
    b.tokens.push_back(int32_t(rng() % uint64_t(s.config.vocab_size)));
  for (int64_t r = 0; r < s.batch; ++r)
    for (int64_t t = 0; t < s.seq; ++t) {
      b.positions.push_back(int32_t(t));
      b.labels.push_back(t + 1 < s.seq ? b.tokens[size_t(r * s.seq + t + 1)] : kIgnoreIndex);
    }
  return b;
}

inline Tensor ids(const std::vector<int32_t>& v, int64_t B, int64_t T) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// The step graph's inputs for one batch (loss normalized by its unmasked labels).
inline TensorMap step_inputs(const Batch& b) {
  TensorMap in;
  in["tokens"] = ids(b.tokens, b.batch_size, b.seq_len);
  in["labels"] = ids(b.labels, b.batch_size, b.seq_len);
  in["positions"] = ids(b.positions, b.batch_size, b.seq_len);
  Tensor scale = Tensor::empty({}, DType::F32);
  scale.data<float>()[0] = float(1.0 / double(b.num_valid_labels()));
  in["loss_scale"] = scale;
  return in;
}

// What timed_steps measured.
struct TimedSteps {
  double compile_s = 0;
  std::vector<double> step_s, losses;
  // Tokens per second from the median step time of steps 3..N. Steps 1 and 2 warm up: the
  // first step's end allocates the optimizer state, so the buffers it freed are not all kept
  // for reuse (core/memory.h), and the second step faults them in again (measured at mid: the
  // second step 1.7x the later ones in bf16, 1.2x in fp32).
  double tokens_per_s(int64_t tokens) const {
    std::vector<double> tail(step_s.begin() + std::min<size_t>(2, step_s.size() - 1), step_s.end());
    std::sort(tail.begin(), tail.end());
    return double(tokens) / tail[tail.size() / 2];
  }
};

// Compiles `g` with `po`, then runs `steps` AdamW steps (8-bit AdamW with `adamw8bit`) on the
// seeded synthetic batches of `shape` (the same data for every mode and method), timing each
// step as the recipe logs it. `in_bwd` (optimizer_in_bwd): each parameter is updated from the
// executor's output callback as soon as its gradient is computed, which is then freed.
// `extra`: further step inputs (QAT's fake_quant_enabled).
inline TimedSteps timed_steps(const BenchShape& shape, const TrainingGraph& tg, TensorMap& params,
                              const PassOptions& po, int steps, bool adamw8bit = false,
                              bool in_bwd = false, const TensorMap& extra = {}) {
  TimedSteps t;
  std::unique_ptr<Optimizer> opt_ptr;
  if (adamw8bit)
    opt_ptr = std::make_unique<AdamW8bit>();
  else
    opt_ptr = std::make_unique<AdamW>(AdamWOptions{});
  Optimizer& opt = *opt_ptr;
  auto t0 = std::chrono::steady_clock::now();
  CompiledStep step = compile_graph(tg.graph, po);
  t.compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int s = 0; s < steps; ++s) {
    Batch b = synthetic_batch(shape, 99 + uint64_t(s));
    TensorMap in = step_inputs(b);
    for (const auto& [name, value] : extra) in[name] = value;
    auto ts = std::chrono::steady_clock::now();
    std::vector<Tensor> out;
    if (in_bwd) {
      const auto& outputs = step.executor->graph().outputs();
      const std::vector<bool> early = early_update_outputs(step.executor->graph());
      out = step.executor->run(in, params, [&](size_t k, const Tensor& g) {
        if (!early[k]) return false;
        Tensor grad = g;
        const std::string name = outputs[k].first.substr(5);
        opt.step({{name, &params[name], &grad}}, 1e-4);
        return true;
      });
      for (size_t k = 1; k < out.size(); ++k)
        if (out[k].defined() && outputs[k].first.rfind("grad:", 0) == 0) {
          const std::string name = outputs[k].first.substr(5);
          opt.step({{name, &params[name], &out[k]}}, 1e-4);
          out[k] = Tensor();
        }
    } else {
      out = step.executor->run(in, params);
      std::vector<ParamRef> refs;
      for (size_t i = 0; i < tg.trainable_params.size(); ++i)
        refs.push_back({tg.trainable_params[i], &params[tg.trainable_params[i]], &out[1 + i]});
      opt.step(refs, 1e-4);
    }
    t.step_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count());
    t.losses.push_back(out[0].data<float>()[0]);
    // The recipe frees the gradients after the update (train_loop's grads.clear()), so the next
    // step's backward finds their buffers free for reuse: the same here.
    out.clear();
  }
  return t;
}

// The LoRA the benchmarks train: q/v/o and the MLP, rank 16, alpha 32.
inline peft::LoraConfig bench_lora_config() {
  peft::LoraConfig lc;
  lc.attn_modules = {"q_proj", "v_proj", "output_proj"};
  lc.apply_to_mlp = true;
  lc.rank = 16;
  lc.alpha = 32;
  return lc;
}

// What a recipe's own step measured (run_recipe_step).
struct RecipeStepTimes {
  std::vector<double> losses;
  double compile_s = 0;     // step 1's compile time
  double tokens_per_s = 0;  // `tokens` positions per median step time of steps 2..N
};

// Runs `steps` steps of a recipe's TrainingStep plus AdamW on batch_of(s), each scaled by
// 1 / the step's loss units (what the recipe's loop does for one micro-batch), timing each;
// with FUSETUNE_PROFILE=1 prints the op profile under `label`.
template <class BatchFn>
RecipeStepTimes run_recipe_step(TrainingStep& step, TensorMap& params, int steps, int64_t tokens,
                                BatchFn batch_of, const std::string& label) {
  RecipeStepTimes r;
  AdamW opt(AdamWOptions{});
  std::vector<double> step_s;
  op_profile::reset();
  for (int s = 0; s < steps; ++s) {
    const Batch b = batch_of(s);
    const auto t0 = std::chrono::steady_clock::now();
    StepOutputs out = step.run(b, 1.0 / double(step.loss_units(b)), s, 0);
    std::vector<ParamRef> refs;
    for (auto& [name, g] : out.grads) refs.push_back({name, &params[name], &g});
    opt.step(refs, 1e-4);
    step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    r.losses.push_back(out.loss);
    if (s == 0) r.compile_s = step.take_compile_seconds();
  }
  if (op_profile::enabled())
    std::printf("%s (all %d steps):\n%s\n", label.c_str(), steps, op_profile::report().c_str());
  std::vector<double> tail(step_s.begin() + 1, step_s.end());  // step 1 compiles
  std::sort(tail.begin(), tail.end());
  r.tokens_per_s = double(tokens) / tail[tail.size() / 2];
  return r;
}

// Runs `steps` optimizer steps of `shape` in `mode` from the same init and data as every other
// mode (seeded), returning per-step losses and times. `llama`: model hooks (QAT's
// fake-quantized linears) and `extra` the inputs they read.
inline RunResult run_mode(const BenchShape& shape, CompileMode mode, int steps,
                          double flops_per_token,
                          int64_t ce_budget_bytes = PassOptions{}.ce_chunk_budget_bytes,
                          const LlamaOptions& llama = {}, const TensorMap& extra = {}) {
  RunResult r;
  r.mode = compile_mode_name(mode);
  const int64_t base = memory::current_bytes();
  {
    TrainingGraphOptions o;
    o.batch_size = shape.batch;
    o.seq_len = shape.seq;
    o.llama = llama;
    TrainingGraph tg = build_training_graph(shape.config, o);
    TensorMap params = init_parameters(graph_parameters(tg.graph), 1234, DType::F32);
    memory::reset_peak();
    PassOptions po;
    po.mode = mode;
    po.ce_chunk_budget_bytes = ce_budget_bytes;
    TimedSteps t = timed_steps(shape, tg, params, po, steps, false, false, extra);
    r.peak_bytes = memory::peak_bytes() - base;
    r.compile_s = t.compile_s;
    r.losses = t.losses;
    r.step_s = t.step_s;
    r.tokens_per_s = t.tokens_per_s(shape.batch * shape.seq);
  }
  r.flops_per_step = flops_per_token * double(shape.batch * shape.seq);
  return r;
}

}  // namespace fusetune::bench
