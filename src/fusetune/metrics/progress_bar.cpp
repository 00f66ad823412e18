#include "fusetune/metrics/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace fusetune {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// tqdm's bar glyphs: eighth blocks, then the full block.
const char* const kEighths[] = {" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
const char* const kFull = "█";

}  // namespace

std::string format_interval(double seconds) {
  const int64_t t = std::isfinite(seconds) && seconds > 0 ? int64_t(seconds) : 0;
  const int64_t h = t / 3600, m = (t / 60) % 60, s = t % 60;
  char buf[48];
  if (h)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)h, (long long)m, (long long)s);
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", (long long)m, (long long)s);
  return buf;
}

std::string format_progress_bar(const std::string& desc, int64_t n, int64_t total, double elapsed_s,
                                int width) {
  const double rate = elapsed_s > 0 ? double(n) / elapsed_s : 0;
  char rate_buf[48];
  if (rate <= 0)
    std::snprintf(rate_buf, sizeof rate_buf, "?it/s");
  else if (rate >= 1)
    std::snprintf(rate_buf, sizeof rate_buf, "%5.2fit/s", rate);
  else
    std::snprintf(rate_buf, sizeof rate_buf, "%5.2fs/it", 1 / rate);
  const std::string prefix = desc.empty() ? "" : desc + ": ";
  if (total <= 0)
    return prefix + std::to_string(n) + "it [" + format_interval(elapsed_s) + ", " + rate_buf + "]";

  const double frac = std::clamp(double(n) / double(total), 0.0, 1.0);
  char pct[16];
  std::snprintf(pct, sizeof pct, "%3.0f%%", double(n) / double(total) * 100);
  width = std::max(width, 1);
  const int64_t eighths = int64_t(frac * width * 8);
  const int64_t full = eighths / 8;
  std::string bar;
  for (int64_t i = 0; i < full; ++i) bar += kFull;
  if (full < width) {
    bar += kEighths[eighths % 8];
    bar += std::string(size_t(width - full - 1), ' ');
  }
  const std::string remaining = rate > 0 ? format_interval(double(total - n) / rate) : "?";
  return prefix + pct + "|" + bar + "| " + std::to_string(n) + "/" + std::to_string(total) + " [" +
         format_interval(elapsed_s) + "<" + remaining + ", " + rate_buf + "]";
}

ProgressBar::ProgressBar(int64_t total, int fd, Mode mode)
    : total_(total),
      fd_(fd),
      enabled_(mode == Mode::Always || (mode == Mode::Auto && ::isatty(fd) == 1)),
      start_s_(now_s()) {}

ProgressBar::~ProgressBar() { close(); }

void ProgressBar::write_all(const std::string& s) {
  // Cosmetic output: a failed write is dropped, never an error.
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::write(fd_, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += size_t(w);
  }
}

void ProgressBar::update(int64_t n, const std::string& desc) {
  n_ = n;
  desc_ = desc;
  updated_ = true;
  redraw();
}

void ProgressBar::redraw() {
  if (!enabled_ || !updated_) return;
  // \r to the line start, draw, then erase whatever a longer previous line left behind.
  // (Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.)
  std::string line = "\r";
  line += format_progress_bar(desc_, n_, total_, now_s() - start_s_);
  line += "\033[K";
  write_all(line);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!enabled_ || !drawn_) return;
  write_all("\r\033[K");
  drawn_ = false;
}

void ProgressBar::close() {
  if (!enabled_) return;
  if (drawn_) write_all("\n");
  drawn_ = false;
  enabled_ = false;
}

}  // namespace fusetune
