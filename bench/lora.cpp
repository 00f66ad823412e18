// Full fine-tuning (AdamW, or 8-bit AdamW: method full8) vs LoRA vs QLoRA (NF4 base), each in
// every compile mode, on one shape: same init, same data. LoRA/QLoRA adapt q/v/o and the MLP (rank
// 16, alpha 32), as torchtune's 1B LoRA config does. QLoRA stores every frozen big matrix as NF4:
// the layers' projections, the embedding table and the head (peft/nf4_weight.h).
//   bench_lora --shape mid --steps 5 [--methods full,full8,lora,qlora] [--modes false,model,true]
//   [--threads 2] [--ckpt] [--dtypes fp32,bf16]
// --dtypes runs every method in each training dtype (bf16: parameters, gradients and
// activations stored as bf16, AdamW moments fp32). A run whose planned peak exceeds the memory
// available (util/system_memory.h) is reported as not fitting, with the plan, and not run.
// A method with the suffix "-ib" (full-ib, lora-ib, ...) runs with optimizer_in_bwd: each
// parameter updated as soon as its gradient is computed, the gradient then freed.
// --ckpt turns on activation checkpointing for every method alike (torchtune's LoRA/QLoRA
// configs enable it by default).
// Prints a table with the ratios the targets name (LoRA/full tokens/s, QLoRA/LoRA peak and
// tokens/s, same compile mode), a memory breakdown (measured weights, gradients + optimizer
// state; predicted activations and workspace from compile/memory_estimate.h), then the same
// results as one JSON line. Nothing here asserts a timing.
#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "fusetune/compile/plan_report.h"
#include "fusetune/metrics/format.h"
#include "fusetune/peft/lora.h"
#include "fusetune/peft/parameter_count.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/strings.h"
#include "fusetune/util/system_memory.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

struct Result {
  std::string method, mode, dtype;
  bool fits = true;
  double tokens_per_s = 0, compile_s = 0;
  int64_t peak_bytes = 0, trainable = 0, weight_bytes = 0;
  int64_t params = 0;  // every parameter, the NF4 base by its logical size
  MemoryBreakdown predicted;
  std::vector<double> losses;
};

Result run(const BenchShape& shape, const std::string& method, CompileMode mode, int steps,
           bool ckpt, DType dtype) {
  Result r;
  r.method = method;
  r.mode = compile_mode_name(mode);
  r.dtype = dtype == DType::BF16 ? "bf16" : "fp32";
  peft::LoraConfig lc = bench_lora_config();
  const bool in_bwd = method.size() > 3 && method.substr(method.size() - 3) == "-ib";
  const std::string base_method = in_bwd ? method.substr(0, method.size() - 3) : method;
  lc.quantize_base = base_method == "qlora";
  const int64_t base = memory::current_bytes();
  {
    TrainingGraphOptions o;
    o.batch_size = shape.batch;
    o.seq_len = shape.seq;
    o.dtype = dtype;
    const bool full = base_method == "full" || base_method == "full8";
    // The plan first: a run that would not fit is reported, not run. Planned on the graph
    // the run builds (the NF4 base quantized from a zero model: only its layout matters).
    OptimizerStateSize state(2.0 * 4.0 / double(dtype_size(dtype)));  // fp32 AdamW moments
    if (base_method == "full8") state.min_8bit_numel = AdamW8bitOptions{}.min_8bit_size;
    PassOptions po;
    po.mode = mode;
    po.activation_checkpointing = ckpt;
    {
      TrainingGraphOptions po_graph = o;
      std::shared_ptr<peft::NF4Store> layout;
      if (!full) {
        if (lc.quantize_base) layout = peft::nf4_store_layout(shape.config);
        po_graph.trainable = peft::is_adapter_param;
        po_graph.llama = peft::lora_llama_options(lc, layout);
      }
      r.predicted =
          plan_mode(build_training_graph(shape.config, po_graph).graph, po, state, in_bwd).memory;
      const auto available = available_memory();
      if (available && r.predicted.total() > available->bytes) {
        r.fits = false;
        return r;
      }
    }
    TrainingGraph plain = build_training_graph(shape.config, TrainingGraphOptions{});
    TensorMap params = init_parameters(graph_parameters(plain.graph), 1234, DType::F32);
    std::shared_ptr<peft::NF4Store> store;
    if (!full) {
      if (lc.quantize_base) store = peft::quantize_base_weights(params, shape.config);
      peft::init_adapters(params, shape.config, lc, 1, DType::F32, store.get());
      o.trainable = peft::is_adapter_param;
      o.llama = peft::lora_llama_options(lc, store);
    }
    if (dtype != DType::F32)
      for (auto& [n, t] : params) t = t.to(dtype);
    for (const auto& [n, t] : params) r.weight_bytes += int64_t(t.nbytes());
    if (store)
      for (const auto& [n, w] : *store) r.weight_bytes += w.nbytes();
    TrainingGraph tg = build_training_graph(shape.config, o);
    for (const auto& n : tg.trainable_params) r.trainable += params.at(n).numel();
    r.params = peft::count_parameters(params, {}, store.get()).total;
    memory::reset_peak();
    TimedSteps t = timed_steps(shape, tg, params, po, steps, base_method == "full8", in_bwd);
    r.peak_bytes = memory::peak_bytes() - base;
    r.compile_s = t.compile_s;
    r.losses = t.losses;
    r.tokens_per_s = t.tokens_per_s(shape.batch * shape.seq);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string shape_name = "mid", methods = "full,full8,lora,qlora", modes = "false,model,true",
              dtypes = "fp32";
  int steps = 5;
  bool ckpt = false;
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
    else if (a == "--ckpt")
      ckpt = true;
    else if (a == "--dtypes")
      dtypes = next();
    else
      throw Error("unknown argument '" + a +
                  "' (use --shape, --steps, --methods, --modes, --threads, --ckpt, --dtypes)");
  }
  FT_CHECK(steps >= 2, "--steps must be >= 2 (the first step is not timed)");
  const BenchShape& shape = find_shape(shape_name);
  std::printf(
      "shape %s: vocab %lld, dim %lld, layers %lld, ffn %lld, batch %lld x %lld, %s; %d threads; "
      "activation checkpointing %s\n\n",
      shape.name.c_str(), (long long)shape.config.vocab_size, (long long)shape.config.hidden_size,
      (long long)shape.config.num_hidden_layers, (long long)shape.config.intermediate_size,
      (long long)shape.batch, (long long)shape.seq,
      shape.config.tie_word_embeddings ? "tied" : "untied", omp_get_max_threads(),
      ckpt ? "on" : "off");
  std::vector<Result> results;
  for (const std::string& d : split(dtypes, ','))
    FT_CHECK(d == "fp32" || d == "bf16", "--dtypes: unknown dtype '" + d + "' (fp32, bf16)");
  for (const std::string& m : split(methods, ','))
    for (const std::string& c : split(modes, ','))
      for (const std::string& d : split(dtypes, ',')) {
        const std::string b =
            m.size() > 3 && m.substr(m.size() - 3) == "-ib" ? m.substr(0, m.size() - 3) : m;
        FT_CHECK(b == "full" || b == "full8" || b == "lora" || b == "qlora",
                 "--methods: unknown method '" + m + "'");
        op_profile::reset();
        results.push_back(run(shape, m, parse_compile_mode(c), steps, ckpt,
                              d == "bf16" ? DType::BF16 : DType::F32));
        const Result& r = results.back();
        std::fprintf(stderr, "%s %s %s: %s\n", r.method.c_str(), r.mode.c_str(), r.dtype.c_str(),
                     r.fits ? "done" : "does not fit: not run");
        if (op_profile::enabled() && r.fits)  // FUSETUNE_PROFILE=1: where the steps' time went
          std::fprintf(stderr, "profile of %s %s %s (%d steps):\n%s\n", r.method.c_str(),
                       r.mode.c_str(), r.dtype.c_str(), steps, op_profile::report().c_str());
      }
  // The comparisons are within one dtype and compile mode.
  const Result* current = nullptr;
  auto find = [&](const std::string& method, const std::string& mode) -> const Result* {
    for (const Result& r : results)
      if (r.method == method && r.mode == mode && r.dtype == current->dtype && r.fits) return &r;
    return nullptr;
  };
  // The targets' ratios, each against the same compile mode: lora rows LoRA/full tokens/s,
  // qlora rows QLoRA/LoRA peak and tokens/s.
  auto ratios = [&](const Result& r) {
    current = &r;
    char buf[128] = "";
    if (!r.fits) return std::string("does not fit: not run");
    if (r.dtype == "bf16") {  // against the same run in fp32
      for (const Result& f : results)
        if (f.method == r.method && f.mode == r.mode && f.dtype == "fp32" && f.fits) {
          std::snprintf(buf, sizeof buf, "bf16/fp32: peak x%.2f, tok/s x%.2f",
                        double(r.peak_bytes) / double(f.peak_bytes),
                        r.tokens_per_s / f.tokens_per_s);
          return std::string(buf);
        }
      return std::string();
    }
    if (r.method.size() > 3 && r.method.substr(r.method.size() - 3) == "-ib") {
      if (const Result* f = find(r.method.substr(0, r.method.size() - 3), r.mode))
        std::snprintf(buf, sizeof buf, "peak x%.2f (-%.1f MiB), max loss rel diff %.1e",
                      double(r.peak_bytes) / double(f->peak_bytes),
                      double(f->peak_bytes - r.peak_bytes) / double(1 << 20), [&] {
                        double d = 0;
                        for (size_t i = 0; i < r.losses.size() && i < f->losses.size(); ++i)
                          d = std::max(
                              d, std::abs(r.losses[i] - f->losses[i]) / std::abs(f->losses[i]));
                        return d;
                      }());
    } else if (r.method == "full8") {
      if (const Result* f = find("full", r.mode))
        std::snprintf(buf, sizeof buf, "peak x%.2f, opt state x%.2f, tok/s x%.2f of full",
                      double(r.peak_bytes) / double(f->peak_bytes),
                      double(r.predicted.optimizer_state) / double(f->predicted.optimizer_state),
                      r.tokens_per_s / f->tokens_per_s);
    } else if (r.method == "lora") {
      if (const Result* f = find("full", r.mode))
        std::snprintf(buf, sizeof buf, "tok/s x%.2f of full", r.tokens_per_s / f->tokens_per_s);
    } else if (r.method == "qlora") {
      if (const Result* l = find("lora", r.mode))
        std::snprintf(buf, sizeof buf, "peak x%.2f, tok/s x%.2f of lora",
                      double(r.peak_bytes) / double(l->peak_bytes),
                      r.tokens_per_s / l->tokens_per_s);
    }
    return std::string(buf);
  };
  const double MiB = 1 << 20;
  std::printf("%-7s %-7s %-5s %8s %10s %11s %10s %9s %9s %9s %10s  %s\n", "method", "compile",
              "dtype", "params", "trainable", "weights MiB", "tokens/s", "peak MiB", "plan MiB",
              "compile s", "last loss", "ratios");
  for (const Result& r : results)
    std::printf("%-7s %-7s %-5s %8s %10lld %11.1f %10.1f %9.1f %9.1f %9.3f %10.5f  %s\n",
                r.method.c_str(), r.mode.c_str(), r.dtype.c_str(), short_count(r.params).c_str(),
                (long long)r.trainable, double(r.weight_bytes) / MiB, r.tokens_per_s,
                double(r.peak_bytes) / MiB, double(r.predicted.total()) / MiB, r.compile_s,
                r.losses.empty() ? 0.0 : r.losses.back(), ratios(r).c_str());
  // Where the peak goes: weights and trainable state are exact; activations (arena + eager
  // buffers at the peak) and workspace are the memory estimate's, which `fusetune plan` prints.
  std::printf(
      "\nmemory breakdown, MiB (weights, grads, optimizer state: exact; activations, "
      "workspace: predicted)\n");
  std::printf("%-7s %-7s %-5s %9s %7s %9s %11s %9s %10s %9s\n", "method", "compile", "dtype",
              "weights", "grads", "opt state", "activations", "workspace", "predicted", "measured");
  for (const Result& r : results) {
    const MemoryBreakdown& m = r.predicted;
    std::printf("%-7s %-7s %-5s %9.1f %7.1f %9.1f %11.1f %9.1f %10.1f %9.1f\n", r.method.c_str(),
                r.mode.c_str(), r.dtype.c_str(), double(r.weight_bytes) / MiB,
                double(m.gradients) / MiB, double(m.optimizer_state) / MiB,
                double(m.activations) / MiB, double(m.workspace) / MiB, double(m.total()) / MiB,
                double(r.peak_bytes) / MiB);
  }
  nlohmann::json j;
  j["shape"] = shape.name;
  j["activation_checkpointing"] = ckpt;
  for (const Result& r : results)
    j["runs"].push_back({{"method", r.method},
                         {"compile", r.mode},
                         {"dtype", r.dtype},
                         {"fits", r.fits},
                         {"tokens_per_s", r.tokens_per_s},
                         {"peak_bytes", r.peak_bytes},
                         {"weight_bytes", r.weight_bytes},
                         {"params", r.params},
                         {"trainable", r.trainable},
                         {"compile_s", r.compile_s},
                         {"predicted_peak_bytes", r.predicted.total()},
                         {"predicted_activation_bytes", r.predicted.activations},
                         {"losses", r.losses}});
  std::printf("%s\n", j.dump().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_lora: error: %s\n", e.what());
  return 1;
}
