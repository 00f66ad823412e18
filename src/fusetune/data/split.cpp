#include "fusetune/data/split.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "fusetune/util/error.h"

namespace fusetune {

SplitSpec SplitSpec::parse(const std::string& text) {
  static const std::regex re(
      R"(^\s*(\w+)\s*(\[\s*(-?\d+)?\s*(%)?\s*:\s*(-?\d+)?\s*(%)?\s*\])?\s*$)");
  std::smatch m;
  FT_CHECK(std::regex_match(text, m, re),
           "dataset split '" + text +
               "' is not valid: expected e.g. train, train[:90%], train[90%:], train[100:200]");
  SplitSpec s;
  s.name = m[1];
  FT_CHECK(s.name == "train", "dataset split '" + text +
                                  "': local dataset files have only the "
                                  "'train' split (slice it, e.g. train[90%:], for evaluation)");
  if (!m[2].matched) return s;
  bool from_pct = m[4].matched, to_pct = m[6].matched;
  FT_CHECK(m[3].matched || !from_pct, "dataset split '" + text + "': '%' without a number");
  FT_CHECK(m[5].matched || !to_pct, "dataset split '" + text + "': '%' without a number");
  if (m[3].matched && m[5].matched)
    FT_CHECK(from_pct == to_pct,
             "dataset split '" + text + "': both bounds must be percentages or both row counts");
  s.percent = from_pct || to_pct;
  auto parse_bound = [&](const std::ssub_match& g) -> std::optional<int64_t> {
    if (!g.matched) return std::nullopt;
    int64_t v = 0;
    try {
      v = std::stoll(g.str());
    } catch (const std::exception&) {
      throw Error("dataset split '" + text + "': bound " + g.str() + " is out of range");
    }
    if (s.percent)
      FT_CHECK(v >= -100 && v <= 100,
               "dataset split '" + text + "': percentages must be within [-100, 100]");
    return v;
  };
  s.from = parse_bound(m[3]);
  s.to = parse_bound(m[5]);
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
