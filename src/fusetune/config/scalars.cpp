#include "fusetune/config/scalars.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::optional<int64_t> parse_int(std::string_view text) {
  std::string t = trim(text);
  std::string_view s = t;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty() || s[0] == '+') return std::nullopt;
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_float(std::string_view text) {
  std::string t = lower(trim(text));
  if (t == ".inf" || t == "+.inf") return std::numeric_limits<double>::infinity();
  if (t == "-.inf") return -std::numeric_limits<double>::infinity();
  if (t == ".nan") return std::numeric_limits<double>::quiet_NaN();
  std::string_view s = t;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  if (s.empty() || s[0] == '+') return std::nullopt;
  // from_chars also takes "inf"/"nan"; YAML spells them .inf/.nan, so refuse the bare forms
  // (a typo such as `lr: nan` should not become a number).
  if (s.find_first_of("in") != std::string_view::npos) return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string t = trim(text);
  if (t == "true" || t == "True" || t == "TRUE") return true;
  if (t == "false" || t == "False" || t == "FALSE") return false;
  return std::nullopt;
}

std::optional<int64_t> parse_byte_size(std::string_view text) {
  std::string t = lower(trim(text));
  size_t unit_at = t.size();
  while (unit_at > 0 && std::isalpha(static_cast<unsigned char>(t[unit_at - 1]))) --unit_at;
  std::string unit = trim(std::string_view(t).substr(unit_at));
  std::string number = trim(std::string_view(t).substr(0, unit_at));
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else if (unit == "kib")
    scale = 1024.0;
  else if (unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return std::nullopt;
  auto n = parse_float(number);
  if (!n || !std::isfinite(*n) || *n <= 0) return std::nullopt;
  double bytes = std::floor(*n * scale);
  if (bytes < 1 || bytes > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

}  // namespace fusetune
