#pragma once
// Hugging Face split slicing for local files: "train", "train[:90%]", "train[90%:]",
// "train[10:20]", "train[-5:]". Local files hold one split, "train". Percent bounds round to
// the closest row (half to even, as Python's round does), negative bounds count from the end,
// both bounds must use the same unit — the rules of datasets.ReadInstruction, so that
// "train[:90%]" and "train[90%:]" partition the rows exactly as in Python.
#include <cstdint>
#include <optional>
#include <string>

namespace fusetune {

struct SplitSpec {
  std::string name = "train";
  std::optional<int64_t> from, to;  // as written (percent or rows)
  bool percent = false;

  // Parses the syntax above; throws fusetune::Error quoting the text when it is malformed.
  static SplitSpec parse(const std::string& text);
  // [begin, end) rows of a split of num_rows rows (begin == end when empty).
  std::pair<int64_t, int64_t> resolve(int64_t num_rows) const;
};

}  // namespace fusetune
