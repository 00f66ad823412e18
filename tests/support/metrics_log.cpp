#include "metrics_log.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "files.h"

namespace fusetune::testing {
namespace {

double number_or_nan(const nlohmann::json& v) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

}  // namespace

std::vector<nlohmann::json> metrics_lines(const std::filesystem::path& output_dir) {
  return metrics_file_lines(output_dir / "logs" / "metrics.jsonl");
}

std::vector<nlohmann::json> metrics_file_lines(const std::filesystem::path& file) {
  if (!std::filesystem::exists(file))
    throw std::runtime_error("no " + file.string() + " (did the run start?)");
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_text(file));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<double> logged_values(const std::filesystem::path& output_dir, const std::string& key) {
  std::vector<double> v;
  for (const nlohmann::json& j : metrics_lines(output_dir))
    if (j.contains(key)) v.push_back(number_or_nan(j.at(key)));
  return v;
}

std::vector<std::pair<int64_t, double>> logged_step_values(const std::filesystem::path& output_dir,
                                                           const std::string& key) {
  std::vector<std::pair<int64_t, double>> v;
  for (const nlohmann::json& j : metrics_lines(output_dir))
    if (j.contains(key)) v.push_back({j.at("step").get<int64_t>(), number_or_nan(j.at(key))});
  return v;
}

int64_t logged_peak_bytes(const std::filesystem::path& output_dir) {
  int64_t peak = 0;
  for (const nlohmann::json& j : metrics_lines(output_dir))
    if (j.contains("peak_memory_alloc_bytes") && !j["peak_memory_alloc_bytes"].is_null())
      peak = std::max(peak, j["peak_memory_alloc_bytes"].get<int64_t>());
  return peak;
}

std::vector<LoggedStep> logged_steps(const std::filesystem::path& output_dir) {
  std::vector<LoggedStep> steps;
  for (const nlohmann::json& j : metrics_lines(output_dir)) {
    if (!j.contains("loss")) continue;  // a val_loss line, not a training step
    LoggedStep s;
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.loss = j.at("loss").get<double>();
    s.lr = j.at("lr").get<double>();
    if (j.contains("grad_norm") && !j["grad_norm"].is_null())
      s.grad_norm = j["grad_norm"].get<double>();
    steps.push_back(s);
  }
  return steps;
}

double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v.at(i);
  return s / double(to - from);
}

std::vector<double> losses_of(const std::vector<LoggedStep>& steps) {
  std::vector<double> v;
  for (const auto& s : steps) v.push_back(s.loss);
  return v;
}

}  // namespace fusetune::testing
