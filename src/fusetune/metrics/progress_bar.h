#pragma once
// A tqdm-style progress bar, as torchtune shows during training:
//   1|12|Loss: 1.9746:  40%|████      | 12/30 [00:10<00:15,  1.20it/s]
// It is drawn on a file descriptor (stderr) only when that is a terminal: redrawn in place
// with \r, never written to a pipe or file, so logs stay clean.
#include <cstdint>
#include <string>

namespace fusetune {

// One rendering of the bar (no \r, no newline). total <= 0: unknown, shows "n it [...]".
// elapsed_s <= 0: rate and remaining time are shown as "?".
std::string format_progress_bar(const std::string& desc, int64_t n, int64_t total, double elapsed_s,
                                int width = 10);

// tqdm's format_interval: "MM:SS", or "H:MM:SS" from one hour on.
std::string format_interval(double seconds);

class ProgressBar {
 public:
  enum class Mode { Auto, Never, Always };  // Auto: only when isatty(fd)
  explicit ProgressBar(int64_t total, int fd = 2, Mode mode = Mode::Auto);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }
  void update(int64_t n, const std::string& desc);  // redraws the line
  void clear();   // erases the line, so other output can be printed to the terminal
  void redraw();  // draws the last state again (after clear)
  void close();   // leaves the bar on screen and moves to the next line; idempotent

 private:
  void write_all(const std::string& s);
  int64_t total_;
  int fd_;
  bool enabled_;
  bool drawn_ = false;
  bool updated_ = false;
  int64_t n_ = 0;
  std::string desc_;
  double start_s_;
};

}  // namespace fusetune
