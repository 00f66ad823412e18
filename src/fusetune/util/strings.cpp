#include "fusetune/util/strings.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

namespace fusetune {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_match(std::string_view key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.emplace_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r'))
    --e;
  return std::string(s.substr(b, e - b));
}

std::string format_gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1024.0 * 1024 * 1024) return format_gib(bytes) + " GiB";
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

void for_each_line(std::string_view text,
                   const std::function<void(std::string_view line, size_t line_no)>& f) {
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    f(text.substr(pos, eol - pos), ++line_no);
    pos = eol + 1;
  }
}

}  // namespace fusetune
