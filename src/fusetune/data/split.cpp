#include "fusetune/data/split.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>

#include "fusetune/util/error.h"

namespace fusetune {

namespace {

// A tiny cursor over the split text (std::regex trips GCC 12's -Wmaybe-uninitialized at -O2).
struct Cursor {
  std::string_view s;
  size_t i = 0;
  void skip_space() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    skip_space();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool done() {
    skip_space();
    return i == s.size();
  }
};

}  // namespace

SplitSpec SplitSpec::parse(const std::string& text) {
  const std::string bad = "dataset split '" + text +
                          "' is not valid: expected e.g. train, train[:90%], train[90%:], "
                          "train[100:200]";
  Cursor c{text};
  c.skip_space();
  SplitSpec s;
  size_t name_begin = c.i;
  while (c.i < text.size() &&
         (std::isalnum(static_cast<unsigned char>(text[c.i])) || text[c.i] == '_'))
    ++c.i;
  FT_CHECK(c.i > name_begin, bad);
  s.name = text.substr(name_begin, c.i - name_begin);
  FT_CHECK(s.name == "train", "dataset split '" + text +
                                  "': local dataset files have only the 'train' split (slice it, "
                                  "e.g. train[90%:], for evaluation)");
  if (c.done()) return s;
  FT_CHECK(c.eat('['), bad);

  // One bound: optional '-', digits, optional '%'. Absent bound = nullopt.
  auto bound = [&](bool& pct) -> std::optional<int64_t> {
    c.skip_space();
    size_t b = c.i;
    if (c.i < text.size() && text[c.i] == '-') ++c.i;
    size_t digits = c.i;
    while (c.i < text.size() && std::isdigit(static_cast<unsigned char>(text[c.i]))) ++c.i;
    if (c.i == digits) {
      FT_CHECK(c.i == b, bad);  // a lone '-'
      FT_CHECK(!c.eat('%'), "dataset split '" + text + "': '%' without a number");
      return std::nullopt;
    }
    int64_t v = 0;
    try {
      v = std::stoll(text.substr(b, c.i - b));
    } catch (const std::exception&) {
      throw Error("dataset split '" + text + "': bound " + text.substr(b, c.i - b) +
                  " is out of range");
    }
    pct = c.eat('%');
    return v;
  };
  bool from_pct = false, to_pct = false;
  s.from = bound(from_pct);
  FT_CHECK(c.eat(':'), bad);
  s.to = bound(to_pct);
  FT_CHECK(c.eat(']') && c.done(), bad);
  if (s.from && s.to)
    FT_CHECK(from_pct == to_pct,
             "dataset split '" + text + "': both bounds must be percentages or both row counts");
  s.percent = from_pct || to_pct;
  for (auto b : {s.from, s.to})
    if (b && s.percent)
      FT_CHECK(*b >= -100 && *b <= 100,
               "dataset split '" + text + "': percentages must be within [-100, 100]");
  return s;
}

std::pair<int64_t, int64_t> SplitSpec::resolve(int64_t n) const {
  auto abs_bound = [&](std::optional<int64_t> b, int64_t dflt) {
    if (!b) return dflt;
    int64_t v = *b;
    // nearbyint rounds half to even under the default rounding mode, like Python's round().
    if (percent) v = static_cast<int64_t>(std::nearbyint(double(v) * double(n) / 100.0));
    if (v < 0) v = std::max<int64_t>(n + v, 0);
    return std::min(v, n);
  };
  int64_t begin = abs_bound(from, 0), end = abs_bound(to, n);
  return {begin, std::max(begin, end)};
}

}  // namespace fusetune
