#pragma once
// Number formatting for log lines, matching what the same values look like in torchtune's
// (Python) logs.
#include <cstdint>
#include <string>

namespace fusetune {

// Python's repr(float): the shortest digits that round-trip, in fixed notation when the
// decimal exponent is in [-4, 16), else scientific with a signed, at least two-digit exponent.
// 2e-05 -> "2e-05", 3.6e-05 -> "3.6e-05", 0.0001 -> "0.0001", 1.0 -> "1.0", 0 -> "0.0",
// 1e16 -> "1e+16", nan -> "nan", inf -> "inf".
std::string python_float_repr(double x);

// x rounded to `digits` significant digits, then written as python_float_repr writes it: how a
// learning rate reads in a step line (4 digits: 0.0024000000000000002 -> "0.0024",
// 1.1827948028283354e-05 -> "1.183e-05", 2e-05 -> "2e-05", 0 -> "0.0"); metrics.jsonl keeps
// the full value.
std::string python_float_repr_rounded(double x, int digits);

// Python's f"{x:.{decimals}f}" (printf "%.Nf": correctly rounded, "nan"/"inf" spelled so).
std::string format_fixed(double x, int decimals);

// 1234567 -> "1.23M": the size of a parameter count at a glance.
std::string short_count(int64_t n);

}  // namespace fusetune
