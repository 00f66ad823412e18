#pragma once
// The result rows of the benchmarks that run a recipe's step per method (LoRA, full) and
// compile mode (bench_dpo, bench_kd): one table with each row's ratios to compile: model, then
// one JSON line.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "step_runner.h"

namespace fusetune::bench {

struct MethodModeResult {
  std::string method, mode;
  double tokens_per_s = 0, compile_s = 0;
  int64_t peak_bytes = 0;
  std::vector<double> losses;
};

// `r` takes what run_recipe_step measured and the run's peak.
inline void record_step_times(MethodModeResult& r, const RecipeStepTimes& t, int64_t peak_bytes) {
  r.peak_bytes = peak_bytes;
  r.losses = t.losses;
  r.compile_s = t.compile_s;
  r.tokens_per_s = t.tokens_per_s;
}

inline void print_method_results(const std::string& shape,
                                 const std::vector<MethodModeResult>& results) {
  const double MiB = 1 << 20;
  std::printf("%-6s %-7s %10s %9s %9s %10s  %s\n", "method", "compile", "tokens/s", "peak MiB",
              "compile s", "last loss", "vs model (tok/s, peak)");
  for (const MethodModeResult& r : results) {
    std::string ratio;
    for (const MethodModeResult& m : results)
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
  j["shape"] = shape;
  for (const MethodModeResult& r : results)
    j["runs"].push_back({{"method", r.method},
                         {"compile", r.mode},
                         {"tokens_per_s", r.tokens_per_s},
                         {"peak_bytes", r.peak_bytes},
                         {"compile_s", r.compile_s},
                         {"losses", r.losses}});
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace fusetune::bench
