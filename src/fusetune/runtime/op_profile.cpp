#include "fusetune/runtime/op_profile.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace fusetune::op_profile {
namespace {

struct Entry {
  double seconds = 0, bytes = 0;
  long calls = 0;
};

std::array<Entry, size_t(Op::kCount)>& table() {
  static std::array<Entry, size_t(Op::kCount)> t;
  return t;
}

bool& flag() {
  static bool on = [] {
    const char* v = std::getenv("FUSETUNE_PROFILE");
    return v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace

bool enabled() { return flag(); }
void set_enabled(bool on) { flag() = on; }

void add(Op op, double seconds, double bytes_out) {
  Entry& e = table()[size_t(op)];
  e.seconds += seconds;
  e.bytes += bytes_out;
  ++e.calls;
}

void reset() { table() = {}; }

std::string report() {
  std::vector<std::pair<double, size_t>> order;
  double total = 0;
  for (size_t i = 0; i < table().size(); ++i) {
    total += table()[i].seconds;
    if (table()[i].calls) order.push_back({table()[i].seconds, i});
  }
  std::sort(order.rbegin(), order.rend());
  std::string out = "op                          calls    seconds   share  GB written\n";
  char line[160];
  for (auto [s, i] : order) {
    const Entry& e = table()[i];
    std::snprintf(line, sizeof line, "%-26s %7ld %10.3f %6.1f%% %10.2f\n", op_name(Op(i)), e.calls,
                  e.seconds, total > 0 ? 100 * s / total : 0.0, e.bytes / 1e9);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-26s %7s %10.3f\n", "total", "", total);
  return out + line;
}

}  // namespace fusetune::op_profile
