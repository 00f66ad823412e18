#include "fusetune/metrics/format.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace fusetune {

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits (Ryu), as "d.ddde[+-]XX"; Python's repr picks the same digits.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, std::fabs(x), std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int nd = int(digits.size());
  std::string out = x < 0 ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (nd > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + ebuf;
  }
  if (decpt <= 0) return out + "0." + std::string(size_t(-decpt), '0') + digits;
  if (decpt >= nd) return out + digits + std::string(size_t(decpt - nd), '0') + ".0";
  return out + digits.substr(0, size_t(decpt)) + "." + digits.substr(size_t(decpt));
}

std::string python_float_repr_rounded(double x, int digits) {
  if (!std::isfinite(x) || x == 0) return python_float_repr(x);
  char buf[64];  // "%.Ne" rounds correctly; the double nearest it has at most `digits` digits
  std::snprintf(buf, sizeof buf, "%.*e", digits - 1, x);
  return python_float_repr(std::strtod(buf, nullptr));
}

std::string format_fixed(double x, int decimals) {
  char buf[512];  // %.Nf of 1e308 needs ~310 characters
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

std::string short_count(int64_t n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  double v = double(n);
  int u = 0;
  while (std::fabs(v) >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? std::to_string(n) : format_fixed(v, 2) + units[u];
}

}  // namespace fusetune
