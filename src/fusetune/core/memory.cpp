#include "fusetune/core/memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune::memory {
namespace {
std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

constexpr size_t kHugePage = size_t(2) << 20;

// A buffer of a huge page or more is 2 MiB aligned and asks for transparent huge pages on the
// whole huge pages it holds (Linux's default THP mode, madvise, gives them only where asked):
// its first touch then faults once per 2 MiB instead of once per 4 KiB. Producing a model's
// weights is mostly that first touch (an 8B model in bf16 is 4 million small pages; a fault
// costs microseconds, far more in a VM). The tail past the last whole huge page keeps small
// pages, so no memory is spent beyond what the buffer touches. Harmless where THP is off.
void* allocate_huge(size_t bytes) {
  void* p = nullptr;
  if (::posix_memalign(&p, kHugePage, bytes) != 0) return nullptr;
  ::madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: failing changes nothing
  return p;
}

}  // namespace

void* allocate(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded >= kHugePage ? allocate_huge(rounded)
            : rounded            ? std::aligned_alloc(64, rounded)
                                 : nullptr;
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
