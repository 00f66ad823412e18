#include "fusetune/metrics/report_runs.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace fs = std::filesystem;
namespace {

bool is_rule(const std::string& line) {
  const std::string t = trim(line);
  return t.size() >= 8 && t.find_first_not_of('-') == std::string::npos;
}

// The log file of the latest session: log_<unix>.txt with the largest number (a resumed run
// starts a new one, whose header says where it resumed from).
fs::path latest_log_file(const fs::path& dir) {
  fs::path best;
  long long best_t = -1;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!starts_with(n, "log_") || n.size() <= 8 || n.compare(n.size() - 4, 4, ".txt") != 0)
      continue;
    const std::string digits = n.substr(4, n.size() - 8);
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long long t = std::atoll(digits.c_str());
    if (t > best_t) best_t = t, best = e.path();
  }
  return best;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> parse_run_header(const std::string& log_text) {
  std::vector<std::pair<std::string, std::string>> rows;
  std::istringstream in(log_text);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (is_rule(line)) {
      if (inside) return rows;
      inside = true;
      continue;
    }
    if (!inside) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) continue;
    rows.emplace_back(trim(line.substr(0, colon)), trim(line.substr(colon + 1)));
  }
  return inside ? rows : std::vector<std::pair<std::string, std::string>>{};
}

RunRecord read_run(const fs::path& dir) {
  std::error_code ec;
  FT_CHECK(fs::exists(dir, ec), "run directory '" + dir.string() + "' does not exist");
  FT_CHECK(fs::is_directory(dir, ec), "'" + dir.string() +
                                          "' is not a directory (give a training run's "
                                          "output_dir, or its logs/ directory)");
  RunRecord run;
  run.dir = dir;
  fs::path logs;
  if (fs::is_regular_file(dir / "logs" / "metrics.jsonl", ec))
    logs = dir / "logs";
  else if (fs::is_regular_file(dir / "metrics.jsonl", ec))
    logs = dir;
  else
    throw Error("no metrics.jsonl in run directory '" + dir.string() + "' (looked for '" +
                (dir / "logs" / "metrics.jsonl").string() + "' and '" +
                (dir / "metrics.jsonl").string() +
                "'); give a training run's output_dir, or its metric_logger.log_dir");
  run.metrics_path = logs / "metrics.jsonl";

  // The name people know the run by: the output_dir's, also when they pointed at its logs/.
  fs::path named = fs::absolute(dir, ec).lexically_normal();
  if (!named.has_filename()) named = named.parent_path();
  if (named.filename() == "logs" && logs == dir && named.has_parent_path())
    named = named.parent_path();
  run.name = named.filename().string();
  if (run.name.empty()) run.name = dir.string();

  std::istringstream in(read_file(run.metrics_path));
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (trim(line).empty()) continue;
    const std::string where = run.metrics_path.string() + ":" + std::to_string(line_no) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // syntax, or a number out of range
      throw Error(where + "not valid JSON (" + e.what() + ")");
    }
    FT_CHECK(j.is_object(), where + "expected a JSON object, got " + std::string(j.type_name()));
    auto step = j.find("step");
    FT_CHECK(step != j.end() && step->is_number_integer(),
             where + "expected an integer \"step\" in every line");
    ++run.lines;
    const double x = double(step->get<int64_t>());
    for (const auto& [key, v] : j.items()) {
      if (key == "step" || key == "epoch" || !v.is_number()) continue;
      const double y = v.get<double>();
      if (std::isfinite(y)) run.series[key].push_back({x, y});
    }
  }

  run.log_path = latest_log_file(logs);
  if (!run.log_path.empty()) run.header = parse_run_header(read_file(run.log_path));
  return run;
}

}  // namespace fusetune
