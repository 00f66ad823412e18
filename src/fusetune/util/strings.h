#pragma once
// Small string helpers shared by config validation, CLI and error messages.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fusetune {

// Levenshtein edit distance (insert, delete, substitute each cost 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `key` by edit distance, or "" when none is close enough
// (distance greater than max(2, key.size() / 3)).
std::string closest_match(std::string_view key, const std::vector<std::string>& candidates);

std::vector<std::string> split(std::string_view s, char sep);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool starts_with(std::string_view s, std::string_view prefix);
std::string trim(std::string_view s);

// Calls `f(line, line_no)` for each '\n'-separated line of `text` (numbered from 1, the '\n'
// removed, a '\r' kept), the last one even without a final '\n': how the line-based readers
// (JSON lines, merges.txt, tiktoken files) number the lines their errors name.
void for_each_line(std::string_view text,
                   const std::function<void(std::string_view line, size_t line_no)>& f);

// Formats a byte count as GiB with two decimals, the unit of torchtune's memory stats.
std::string format_gib(double bytes);
// "812.4 MiB" below one GiB, "1.13 GiB" from there on: for memory reports people read.
std::string format_bytes(double bytes);

}  // namespace fusetune
