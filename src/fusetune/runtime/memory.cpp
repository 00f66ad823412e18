#include "fusetune/runtime/memory.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune::memory {
namespace {
std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
}  // namespace

void* allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
  int64_t now = g_current.fetch_add(int64_t(bytes)) + int64_t(bytes);
  int64_t prev = g_peak.load();
  while (now > prev && !g_peak.compare_exchange_weak(prev, now)) {
  }
  return p;
}

void release(void* ptr, size_t bytes) {
  if (!ptr) return;
  std::free(ptr);
  g_current.fetch_sub(int64_t(bytes));
}

int64_t current_bytes() { return g_current.load(); }
int64_t peak_bytes() { return g_peak.load(); }
void reset_peak() { g_peak.store(g_current.load()); }

}  // namespace fusetune::memory
