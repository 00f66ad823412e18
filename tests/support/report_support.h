#pragma once
// Synthetic training runs for the `fusetune report` tests, written by the real StepLogger so
// that the files are exactly what a training run leaves in output_dir/logs.
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>

#include "fusetune/metrics/step_logger.h"

namespace fusetune::testing {

// `steps` step lines (with peak memory when `memory`), val_loss every `val_every` steps (0:
// never), and a run header with compile mode `mode` and model description `model`.
inline void write_synthetic_run(const std::filesystem::path& dir, int steps, bool memory,
                                int val_every, const std::string& mode,
                                const std::string& model = "llama (tiny)") {
  std::ostringstream sink;
  StepLoggerOptions o;
  o.output_dir = dir;
  o.out = &sink;
  o.progress = ProgressBar::Mode::Never;
  StepLogger log(o);
  RunHeader h;
  h.recipe = "full_finetune_single_device";
  h.model = model;
  h.params_total = 1000;
  h.params_trainable = 1000;
  h.threads = 2;
  h.dtype = "fp32";
  h.compile_mode = mode;
  h.extra.push_back({"steps", std::to_string(steps)});
  log.header(h);
  for (int s = 1; s <= steps; ++s) {
    StepMetrics m;
    m.step = s;
    m.loss = 5.0 / s;
    m.lr = 1e-3 * s / steps;
    m.tokens_per_second_per_gpu = 1000 + 10 * s;
    if (memory) m.peak_memory_alloc_bytes = int64_t(s) << 20;
    m.extra.push_back({"mfu", 0.1, 3});
    log.log(m);
    if (val_every && s % val_every == 0) log.log_values(s, {{"val_loss", 6.0 / s}});
  }
}

}  // namespace fusetune::testing
