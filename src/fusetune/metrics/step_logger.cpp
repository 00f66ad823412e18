#include "fusetune/metrics/step_logger.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>

#include <nlohmann/json.hpp>

#include "fusetune/metrics/format.h"
#include "fusetune/util/clock.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace fs = std::filesystem;
namespace {

nlohmann::ordered_json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

std::string format_step_line(const StepMetrics& m) {
  std::string line = "Step " + std::to_string(m.step) + " | loss:" + format_fixed(m.loss, 4) +
                     " lr:" + python_float_repr_rounded(m.lr, 4) +
                     " tokens_per_second_per_gpu:" + format_fixed(m.tokens_per_second_per_gpu, 2);
  if (m.peak_memory_alloc_bytes)
    line += " peak_memory_alloc:" + format_gib(double(*m.peak_memory_alloc_bytes));
  if (m.grad_norm) line += " grad_norm:" + format_fixed(*m.grad_norm, 4);
  for (const MetricField& f : m.extra)
    line += " " + f.name + ":" + format_fixed(f.value, f.decimals);
  return line;
}

std::string format_run_header(const RunHeader& h) {
  std::vector<std::pair<std::string, std::string>> rows;
  if (!h.recipe.empty()) rows.emplace_back("recipe", h.recipe);
  if (!h.model.empty()) rows.emplace_back("model", h.model);
  if (h.params_total > 0) {
    std::string p =
        std::to_string(h.params_total) + " (" + short_count(h.params_total) + "), trainable " +
        std::to_string(h.params_trainable) + " (" + short_count(h.params_trainable) + ", " +
        format_fixed(100.0 * double(h.params_trainable) / double(h.params_total), 2) + "%)";
    rows.emplace_back("params", p);
  }
  if (h.threads > 0) rows.emplace_back("threads", std::to_string(h.threads));
  if (!h.dtype.empty()) rows.emplace_back("dtype", h.dtype);
  if (!h.compile_mode.empty()) rows.emplace_back("compile", h.compile_mode);
  for (const auto& kv : h.extra) rows.push_back(kv);

  size_t key_width = 0;
  for (const auto& kv : rows) key_width = std::max(key_width, kv.first.size());
  const std::string rule(64, '-');
  std::string out = rule + "\n";
  for (const auto& [k, v] : rows)
    out += k + ":" + std::string(key_width - k.size() + 1, ' ') + v + "\n";
  return out + rule + "\n";
}

std::string format_metrics_json(const StepMetrics& m, double unix_time, double elapsed_s) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["epoch"] = m.epoch;
  j["loss"] = number_or_null(m.loss);
  j["lr"] = number_or_null(m.lr);
  j["tokens_per_second_per_gpu"] = number_or_null(m.tokens_per_second_per_gpu);
  j["peak_memory_alloc_bytes"] = m.peak_memory_alloc_bytes
                                     ? nlohmann::ordered_json(*m.peak_memory_alloc_bytes)
                                     : nlohmann::ordered_json(nullptr);
  j["grad_norm"] = m.grad_norm ? number_or_null(*m.grad_norm) : nlohmann::ordered_json(nullptr);
  j["time"] = unix_time;
  j["elapsed_s"] = elapsed_s;
  for (const MetricField& f : m.extra) j[f.name] = number_or_null(f.value);
  return j.dump();
}

void StepLogger::FileCloser::operator()(std::FILE* f) const {
  if (f) std::fclose(f);
}

StepLogger::StepLogger(StepLoggerOptions options)
    : options_(std::move(options)),
      out_(options_.out ? options_.out : &std::cout),
      bar_(options_.total_steps, options_.progress_fd, options_.progress),
      start_s_(steady_now_s()) {
  if (options_.output_dir.empty() && options_.log_dir.empty()) return;
  const fs::path dir = options_.log_dir.empty() ? options_.output_dir / "logs" : options_.log_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error("cannot create log directory '" + dir.string() +
                "': " + (ec ? ec.message() : std::string("a file of that name is in the way")) +
                " (check that output_dir is writable)");
  // torchtune's DiskLogger names the file after the unix time the run started.
  log_path_ = dir / ("log_" + std::to_string(int64_t(unix_now_s())) + ".txt");
  metrics_path_ = dir / "metrics.jsonl";
  for (auto [file, path] : {std::pair{&log_file_, &log_path_}, {&metrics_file_, &metrics_path_}}) {
    errno = 0;
    file->reset(std::fopen(path->c_str(), "a"));
    if (!*file)
      throw Error("cannot open log file '" + path->string() + "' for appending: " +
                  std::strerror(errno) + " (check that output_dir is writable)");
  }
  if (options_.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(dir);
}

StepLogger::~StepLogger() {
  try {
    close();
  } catch (...) {  // a destructor must not throw; close() already reported what it could
  }
}

void StepLogger::append(File& f, const fs::path& path, const std::string& text) {
  if (!f) return;
  errno = 0;
  const bool ok =
      std::fwrite(text.data(), 1, text.size(), f.get()) == text.size() && std::fflush(f.get()) == 0;
  if (!ok) {
    const std::string reason = errno ? std::strerror(errno) : "write failed";
    f.reset();  // report once, not on every later step
    throw Error("cannot write to log file '" + path.string() + "': " + reason);
  }
}

void StepLogger::emit(const std::string& text) {
  bar_.clear();
  if (options_.print) {
    *out_ << text;
    out_->flush();
  }
  append(log_file_, log_path_, text);
  bar_.redraw();
}

void StepLogger::header(const RunHeader& h) { emit(format_run_header(h)); }

void StepLogger::message(const std::string& line) { emit(line + "\n"); }

void StepLogger::log(const StepMetrics& m) {
  emit(format_step_line(m) + "\n");
  append(metrics_file_, metrics_path_,
         format_metrics_json(m, unix_now_s(), steady_now_s() - start_s_) + "\n");
  if (tensorboard_) {
    // The step line's metrics under their names (peak memory in GiB, as printed).
    std::vector<std::pair<std::string, double>> s = {
        {"loss", m.loss}, {"lr", m.lr}, {"tokens_per_second_per_gpu", m.tokens_per_second_per_gpu}};
    if (m.peak_memory_alloc_bytes)
      s.push_back({"peak_memory_alloc", double(*m.peak_memory_alloc_bytes) / double(1 << 30)});
    if (m.grad_norm) s.push_back({"grad_norm", *m.grad_norm});
    for (const MetricField& f : m.extra) s.push_back({f.name, f.value});
    tensorboard_->write(m.step, s);
  }
}

void StepLogger::log_values(int64_t step,
                            const std::vector<std::pair<std::string, double>>& values) {
  std::string line = "Step " + std::to_string(step) + " |";
  nlohmann::ordered_json j;
  j["step"] = step;
  for (const auto& [name, v] : values) {
    line += " " + name + ":" + format_fixed(v, 4);
    j[name] = number_or_null(v);
  }
  j["time"] = unix_now_s();
  j["elapsed_s"] = steady_now_s() - start_s_;
  emit(line + "\n");
  append(metrics_file_, metrics_path_, j.dump() + "\n");
  if (tensorboard_) tensorboard_->write(step, values);
}

void StepLogger::progress(int64_t epoch, int64_t step, double loss) {
  if (!bar_.enabled()) return;
  bar_.update(
      step, std::to_string(epoch) + "|" + std::to_string(step) + "|Loss: " + format_fixed(loss, 4));
}

void StepLogger::close() {
  bar_.close();
  log_file_.reset();
  metrics_file_.reset();
  tensorboard_.reset();
}

}  // namespace fusetune
