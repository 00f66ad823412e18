#pragma once
// The training log: torchtune's step line on stdout and in output_dir/logs/log_<unix>.txt,
//   Step 12 | loss:1.9746 lr:3.6e-05 tokens_per_second_per_gpu:1044.78 peak_memory_alloc:0.41
// one JSON object per logged step in output_dir/logs/metrics.jsonl, a run header printed
// once, and a progress bar on stderr when (and only when) stderr is a terminal. With
// `tensorboard`, every logged metric also goes to a TensorBoard event file in the same folder.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "fusetune/metrics/progress_bar.h"
#include "fusetune/metrics/tensorboard.h"

namespace fusetune {

// An additional "name:value" field, printed with `decimals` fixed decimals (e.g. compile_s).
struct MetricField {
  std::string name;
  double value = 0;
  int decimals = 4;
};

struct StepMetrics {
  int64_t step = 0;   // global optimizer step, as torchtune counts it (1 after the first step)
  int64_t epoch = 1;  // 1-based, as the progress bar shows it
  double loss = 0;    // printed with 4 decimals
  double lr = 0;      // printed to 4 significant digits: 2e-05, 3.6e-05, 0.0024, 0.002814
  double tokens_per_second_per_gpu = 0;            // 2 decimals
  std::optional<int64_t> peak_memory_alloc_bytes;  // printed in GiB, 2 decimals, when set
  std::optional<double> grad_norm;                 // 4 decimals, when set (clip_grad_norm)
  std::vector<MetricField> extra;                  // printed last, in order
};

struct RunHeader {
  std::string recipe;
  std::string model;
  int64_t params_total = 0;
  int64_t params_trainable = 0;
  int threads = 0;
  std::string dtype;                                       // "fp32", "bf16"
  std::string compile_mode;                                // "false", "model", "true"
  std::vector<std::pair<std::string, std::string>> extra;  // more "key: value" lines
};

// The step line, without newline. Field order as torchtune: loss, lr, tokens/s, peak memory,
// grad_norm, then the extras.
std::string format_step_line(const StepMetrics& m);
// The header block: several "key: value" lines, each ending in a newline.
std::string format_run_header(const RunHeader& h);
// The metrics.jsonl object for one step (one line, no newline). Keys: step, epoch, loss, lr,
// tokens_per_second_per_gpu, peak_memory_alloc_bytes, grad_norm, time (unix seconds),
// elapsed_s, then the extras by name. Absent and non-finite values are null (JSON has no nan).
std::string format_metrics_json(const StepMetrics& m, double unix_time, double elapsed_s);

struct StepLoggerOptions {
  std::filesystem::path output_dir;  // logs go to output_dir/logs; empty: no files
  std::filesystem::path log_dir;     // where the files go instead (metric_logger.log_dir)
  bool tensorboard = false;          // also TensorBoard event files (metrics/tensorboard.h)
  std::ostream* out = nullptr;       // where step lines and the header go; null: std::cout
  bool print = true;                 // false: files only (e.g. non-zero ranks print nothing)
  int64_t total_steps = 0;           // progress bar total; 0 when unknown
  int progress_fd = 2;               // the bar's terminal (stderr)
  ProgressBar::Mode progress = ProgressBar::Mode::Auto;
};

class StepLogger {
 public:
  // Creates output_dir/logs and opens both files for appending; throws fusetune::Error with
  // the path and the system's reason when that fails (output_dir not writable, say).
  explicit StepLogger(StepLoggerOptions options);
  ~StepLogger();
  StepLogger(const StepLogger&) = delete;
  StepLogger& operator=(const StepLogger&) = delete;

  void header(const RunHeader& h);  // stdout and the log file
  // The step line (stdout, log file) and the JSONL object. A failed file write (disk full)
  // throws fusetune::Error naming the file, once; later writes to that file are skipped.
  void log(const StepMetrics& m);
  // Values logged outside the step line (val_loss): "Step N | name:value ..." on stdout and
  // in the log file, {"step": N, name: value, ...} in metrics.jsonl, and TensorBoard scalars.
  void log_values(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Any other line (a warning, "saved checkpoint to ..."): stdout and the log file, with the
  // progress bar moved out of the way.
  void message(const std::string& line);
  // Progress bar update for every optimizer step: "<epoch>|<step>|Loss: <loss>".
  void progress(int64_t epoch, int64_t step, double loss);
  void close();  // ends the progress bar line and closes the files; idempotent

  const std::filesystem::path& log_path() const { return log_path_; }          // empty: none
  const std::filesystem::path& metrics_path() const { return metrics_path_; }  // empty: none
  bool progress_enabled() const { return bar_.enabled(); }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const;
  };
  using File = std::unique_ptr<std::FILE, FileCloser>;
  void emit(const std::string& text);  // text ends in '\n'
  void append(File& f, const std::filesystem::path& path, const std::string& text);

  StepLoggerOptions options_;
  std::ostream* out_;
  std::filesystem::path log_path_, metrics_path_;
  File log_file_, metrics_file_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  ProgressBar bar_;
  double start_s_;
};

}  // namespace fusetune
