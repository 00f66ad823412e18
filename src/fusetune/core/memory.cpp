#include "fusetune/core/memory.h"

#include <sanitizer/asan_interface.h>  // poisons cached blocks under ASan; no-op otherwise
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "fusetune/core/block_cache.h"
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

bool cache_enabled() {
  const char* v = std::getenv("FUSETUNE_MEMORY_CACHE");
  return !(v && std::string(v) == "0");
}

BlockCache& block_cache() {
  // Never destroyed: tensors may outlive static teardown.
  static BlockCache* c = new BlockCache(cache_enabled(), [](void* p, size_t bytes) {
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
    std::free(p);
  });
  return *c;
}

std::atomic<int64_t> g_lifetime_peak{0};

// How far live + kept may pass the lifetime peak: a step frees its buffers in another order than
// the next step allocates them, so a bound of exactly the peak evicts a block (say the embedding's
// gradient) for a smaller buffer the next step asks for first, just before it needs that block.
int64_t cache_bound() {
  const int64_t peak = g_lifetime_peak.load();
  return peak + peak / 8;
}

void raise_peak(std::atomic<int64_t>& peak, int64_t now) {
  int64_t prev = peak.load();
  while (now > prev && !peak.compare_exchange_weak(prev, now)) {
  }
}

}  // namespace

void* allocate(size_t bytes) { return allocate(bytes, nullptr); }

void* allocate(size_t bytes, Note* note) {
  size_t rounded = (bytes + 63) / 64 * 64;
  const bool huge = rounded >= kHugePage;
  void* p = huge ? block_cache().take(rounded, note) : nullptr;
  if (p) ASAN_UNPOISON_MEMORY_REGION(p, rounded);
  if (!p) p = huge ? allocate_huge(rounded) : rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p) {
    block_cache().clear();  // memory held for reuse is better spent on this request
    p = huge ? allocate_huge(rounded) : std::aligned_alloc(64, rounded);
  }
  if (rounded && !p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
  int64_t now = g_current.fetch_add(int64_t(bytes)) + int64_t(bytes);
  raise_peak(g_peak, now);
  raise_peak(g_lifetime_peak, now);
  if (huge) block_cache().fit(now, cache_bound());
  return p;
}

void release(void* ptr, size_t bytes) { release(ptr, bytes, nullptr); }

void release(void* ptr, size_t bytes, Note note) {
  if (!ptr) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  const int64_t live = g_current.fetch_sub(int64_t(bytes)) - int64_t(bytes);
  if (rounded >= kHugePage) {
    ASAN_POISON_MEMORY_REGION(ptr, rounded);  // kept: a use after free is still reported
    if (block_cache().keep(ptr, rounded, live, cache_bound(), std::move(note))) return;
    ASAN_UNPOISON_MEMORY_REGION(ptr, rounded);
  }
  std::free(ptr);
}

int64_t lifetime_peak_bytes() { return g_lifetime_peak.load(); }
int64_t cached_bytes() { return block_cache().bytes(); }
void release_cached() { block_cache().clear(); }

int64_t current_bytes() { return g_current.load(); }
int64_t peak_bytes() { return g_peak.load(); }
void reset_peak() { g_peak.store(g_current.load()); }

}  // namespace fusetune::memory
