#pragma once
// What a training run logged to output_dir/logs/metrics.jsonl: one JSON object a line, a step
// line (with "loss") or a validation line (with "val_loss"), numbers at full double precision
// (so runs compare bitwise), null where the logger had no finite value.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fusetune::testing {

// Every line of output_dir/logs/metrics.jsonl, parsed, blank lines skipped. Throws when there
// is no such file or a line is not JSON (so the functions below never read a missing log as
// an empty one).
std::vector<nlohmann::json> metrics_lines(const std::filesystem::path& output_dir);

// The same for a metrics.jsonl elsewhere (metric_logger.log_dir).
std::vector<nlohmann::json> metrics_file_lines(const std::filesystem::path& file);

// The value of `key` on each line that has the key, in line order; null reads as NaN.
std::vector<double> logged_values(const std::filesystem::path& output_dir, const std::string& key);

// (step, value of `key`) on each line that has the key, in line order; null reads as NaN.
std::vector<std::pair<int64_t, double>> logged_step_values(const std::filesystem::path& output_dir,
                                                           const std::string& key);

// The largest peak_memory_alloc_bytes logged (0 when none is).
int64_t logged_peak_bytes(const std::filesystem::path& output_dir);

// One logged optimizer step.
struct LoggedStep {
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;  // 0 when not logged
};

// The step lines (those with "loss"; loss, lr, step and epoch must be numbers).
std::vector<LoggedStep> logged_steps(const std::filesystem::path& output_dir);

std::vector<double> losses_of(const std::vector<LoggedStep>& steps);

// The mean of logged values [from, to) (a curve's first and last steps, compared).
double mean_of(const std::vector<double>& v, size_t from, size_t to);

}  // namespace fusetune::testing
