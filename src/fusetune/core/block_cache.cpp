#include "fusetune/core/block_cache.h"

namespace fusetune::memory {

void* BlockCache::take(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
    if (it->bytes == bytes) {
      void* p = it->ptr;
      blocks_.erase(it);
      kept_ -= int64_t(bytes);
      return p;
    }
  return nullptr;
}

bool BlockCache::keep(void* p, size_t bytes, int64_t live, int64_t bound) {
  if (!enabled_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (live + kept_ + int64_t(bytes) > bound) return false;
  blocks_.push_back({p, bytes});
  kept_ += int64_t(bytes);
  return true;
}

void BlockCache::fit(int64_t live, int64_t bound) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!blocks_.empty() && live + kept_ > bound) free_oldest();
}

void BlockCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!blocks_.empty()) free_oldest();
}

int64_t BlockCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_;
}

void BlockCache::free_oldest() {
  const Block b = blocks_.front();
  blocks_.pop_front();
  kept_ -= int64_t(b.bytes);
  free_(b.ptr, b.bytes);
}

}  // namespace fusetune::memory
