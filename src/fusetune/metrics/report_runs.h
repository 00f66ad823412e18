#pragma once
// Reading a training run back for `fusetune report`: the logged metrics of
// logs/metrics.jsonl (one JSON object per line, as StepLogger writes it) and the run header,
// the "key: value" block at the top of logs/log_<unix>.txt.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fusetune {

struct MetricPoint {
  double step = 0;
  double value = 0;
};

struct RunRecord {
  std::string name;                    // the run directory's name (its parent's for a logs/)
  std::filesystem::path dir;           // as given on the command line
  std::filesystem::path metrics_path;  // the metrics.jsonl read
  std::filesystem::path log_path;      // the log file whose header was read; empty: none
  std::vector<std::pair<std::string, std::string>> header;  // in file order
  // Every numeric metric by its metrics.jsonl key, in file order (a resumed run appends, so a
  // step may appear twice); null and non-numeric values are left out. "time" and "elapsed_s"
  // are kept too; "step" and "epoch" are not.
  std::map<std::string, std::vector<MetricPoint>> series;
  int64_t lines = 0;  // JSON objects read
};

// Reads the run in `dir`: a training output_dir (files in dir/logs) or the log directory
// itself (metric_logger.log_dir). Throws fusetune::Error naming the path when there is no
// metrics.jsonl, and naming the file and line of a line that is not a JSON object with an
// integer "step". A missing log file only leaves the header empty.
RunRecord read_run(const std::filesystem::path& dir);

// The header block of a log file: the "key: value" lines between the first two rules of
// dashes (StepLogger's format_run_header); empty when the file has none.
std::vector<std::pair<std::string, std::string>> parse_run_header(const std::string& log_text);

}  // namespace fusetune
