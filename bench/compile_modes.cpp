// The experiment fusetune exists for, side by side in one run: compile nothing, compile the
// model only, compile model + loss. Same init, same data, same seed for every mode.
//   bench_compile_modes --shape L3-micro --steps 6 [--modes false,model,true] [--threads 2]
//   bench_compile_modes --config path/config.json --batch 4 --seq 256
//   bench_compile_modes --shape stories260K --quantizer gguf_q4_0 [--repeat 3]   (QAT: each mode
//     without and with fake quantization, quant/qat.h; Int8DynActInt4WeightQATQuantizer:GROUPSIZE,
//     ...; --quantizer a,b,c: each in turn; --repeat: float and QAT runs alternate, best kept)
// Prints a table, then the same results as one JSON line. Nothing here asserts a timing.
#include <cmath>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/io/hf_config.h"
#include "fusetune/kernels/cpu/gemm_peak.h"
#include "fusetune/metrics/format.h"
#include "fusetune/models/flops.h"
#include "fusetune/quant/qat.h"
#include "fusetune/runtime/op_profile.h"
#include "fusetune/util/strings.h"
#include "step_runner.h"

using namespace fusetune;
using namespace fusetune::bench;

namespace {

// --quantizer SCHEME[:GROUPSIZE]: the same modes again with the linear layers fake-quantized,
// and the step-time overhead of each mode against its own float run. Float and QAT runs of a
// mode alternate `repeat` times and each keeps its best tokens/s (a shared machine's load
// slows single runs; the best is the least disturbed). FUSETUNE_PROFILE=1: an op profile of
// each mode's last QAT run.
void qat_overhead(const BenchShape& shape, const std::vector<std::string>& modes,
                  const std::vector<RunResult>& plain, int steps, double fpt, int64_t ce_budget,
                  const std::string& spec, int repeat) {
  const auto parts = split(spec, ':');
  Config c = Config::from_string("quantizer: {_component_: " + parts[0] +
                                     (parts.size() > 1 ? ", groupsize: " + parts[1] : "") + "}\n",
                                 "--quantizer");
  const quant::QatConfig q = quant::qat_config_from(c);
  auto model = std::make_shared<ModelConfig>(shape.config);
  for (const std::string& site : quant::check_model(q, *model))
    std::printf("note: %s stays float (rows are not whole groups)\n", site.c_str());
  Tensor on = Tensor::empty({}, DType::I32);
  on.data<int32_t>()[0] = 1;
  const TensorMap extra{{quant::kFakeQuantEnabledInput, on}};
  std::vector<RunResult> float_runs = plain, qat_runs;
  std::vector<std::string> profiles;
  for (size_t i = 0; i < modes.size(); ++i) {
    const CompileMode mode = parse_compile_mode(modes[i]);
    RunResult best;
    for (int rep = 0; rep < repeat; ++rep) {
      if (rep > 0) {
        const RunResult f = run_mode(shape, mode, steps, fpt, ce_budget);
        if (f.tokens_per_s > float_runs[i].tokens_per_s) float_runs[i] = f;
      }
      op_profile::reset();
      const RunResult r = run_mode(shape, mode, steps, fpt, ce_budget,
                                   quant::qat_llama_options(q, model, true), extra);
      if (rep == 0 || r.tokens_per_s > best.tokens_per_s) best = r;
    }
    qat_runs.push_back(best);
    if (op_profile::enabled())
      profiles.push_back("profile of compile=" + modes[i] + " with " + spec + ":\n" +
                         op_profile::report());
  }
  for (const std::string& p : profiles) std::printf("%s\n", p.c_str());
  std::printf("\nQAT (%s): tokens/s without and with fake quantization (best of %d)\n",
              spec.c_str(), repeat);
  std::printf("%-8s %12s %12s %10s %14s\n", "compile", "float", "fake-quant", "overhead",
              "loss step 1");
  nlohmann::json j;
  for (size_t i = 0; i < modes.size(); ++i) {
    const RunResult& r = qat_runs[i];
    const double overhead = float_runs[i].tokens_per_s / r.tokens_per_s - 1;
    std::printf("%-8s %12.1f %12.1f %9.1f%% %14.6f\n", r.mode.c_str(), float_runs[i].tokens_per_s,
                r.tokens_per_s, 100 * overhead, r.losses.front());
    j["qat"][r.mode] = {{"float_tokens_per_s", float_runs[i].tokens_per_s},
                        {"qat_tokens_per_s", r.tokens_per_s},
                        {"step_time_overhead", overhead},
                        {"losses", r.losses}};
  }
  j["shape"] = shape.name;
  j["quantizer"] = spec;
  j["repeat"] = repeat;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  std::string shape_name = "L3-micro", config_path, modes_arg = "false,model,true";
  int steps = 6, repeat = 1;
  int64_t batch = 4, seq = 256;
  int64_t ce_budget = PassOptions{}.ce_chunk_budget_bytes;
  std::string quantizer;
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
    else if (a == "--modes")
      modes_arg = next();
    else if (a == "--config")
      config_path = next();
    else if (a == "--batch")
      batch = std::stoll(next());
    else if (a == "--seq")
      seq = std::stoll(next());
    else if (a == "--threads")
      omp_set_num_threads(std::stoi(next()));
    else if (a == "--ce-budget-mb")
      ce_budget = std::stoll(next()) << 20;
    else if (a == "--quantizer")
      quantizer = next();
    else if (a == "--repeat")
      repeat = std::stoi(next());
    else
      throw Error("unknown argument '" + a +
                  "' (use --shape, --steps, --modes, --config, --batch, --seq, --threads, "
                  "--ce-budget-mb, --quantizer, --repeat)");
  }
  FT_CHECK(steps >= 2, "--steps must be >= 2 (the first step is not timed)");
  FT_CHECK(repeat >= 1, "--repeat must be >= 1");
  BenchShape shape = config_path.empty()
                         ? find_shape(shape_name)
                         : BenchShape{config_path, load_model_config(config_path), batch, seq};

  const double peak = kernels::measure_peak_gemm_gflops(1024);
  const double fpt =
      training_flops_per_token(shape.config, shape.seq, [](const std::string&) { return true; });
  std::printf(
      "shape %s: vocab %lld, dim %lld, layers %lld, heads %lld/%lld kv, ffn %lld, batch %lld x "
      "%lld; %s params; %d threads\n",
      shape.name.c_str(), (long long)shape.config.vocab_size, (long long)shape.config.hidden_size,
      (long long)shape.config.num_hidden_layers, (long long)shape.config.num_attention_heads,
      (long long)shape.config.num_key_value_heads, (long long)shape.config.intermediate_size,
      (long long)shape.batch, (long long)shape.seq, short_count(shape_params(shape)).c_str(),
      omp_get_max_threads());
  std::printf("measured BLAS sgemm peak: %.1f GFLOP/s; training FLOPs per token: %.3g\n\n", peak,
              fpt);

  std::vector<RunResult> results;
  for (const std::string& m : split(modes_arg, ',')) {
    op_profile::reset();
    results.push_back(run_mode(shape, parse_compile_mode(m), steps, fpt, ce_budget));
    if (op_profile::enabled())
      std::printf("profile of compile=%s (%d steps):\n%s\n", m.c_str(), steps,
                  op_profile::report().c_str());
    std::fflush(stdout);
  }

  const double eager_tps = results.front().tokens_per_s;
  std::printf("%-8s %12s %9s %10s %10s %7s\n", "compile", "tokens/s", "vs first", "peak GiB",
              "compile s", "MFU");
  for (const RunResult& r : results)
    std::printf("%-8s %12.1f %8.2fx %10.3f %10.3f %6.1f%%\n", r.mode.c_str(), r.tokens_per_s,
                r.tokens_per_s / eager_tps, double(r.peak_bytes) / (1 << 30), r.compile_s,
                100.0 * fpt * r.tokens_per_s / (peak * 1e9));
  std::printf("\nloss per step:\n");
  double max_diff = 0;
  for (int s = 0; s < steps; ++s) {
    std::printf("  step %2d:", s + 1);
    for (const RunResult& r : results) {
      std::printf("  %s %.6f", r.mode.c_str(), r.losses[size_t(s)]);
      max_diff = std::max(max_diff, std::abs(r.losses[size_t(s)] - results[0].losses[size_t(s)]) /
                                        std::max(1e-12, std::abs(results[0].losses[size_t(s)])));
    }
    std::printf("\n");
  }
  std::printf("largest relative loss difference between modes: %.3g\n", max_diff);

  nlohmann::json j;
  j["shape"] = shape.name;
  j["blas_gflops"] = peak;
  j["max_rel_loss_diff"] = max_diff;
  for (const RunResult& r : results)
    j["modes"][r.mode] = {{"tokens_per_s", r.tokens_per_s},
                          {"peak_bytes", r.peak_bytes},
                          {"compile_s", r.compile_s},
                          {"losses", r.losses},
                          {"mfu", fpt * r.tokens_per_s / (peak * 1e9)}};
  std::printf("%s\n", j.dump().c_str());
  if (!quantizer.empty())
    for (const std::string& q : split(quantizer, ','))
      qat_overhead(shape, split(modes_arg, ','), results, steps, fpt, ce_budget, q, repeat);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_compile_modes: error: %s\n", e.what());
  return 1;
}
