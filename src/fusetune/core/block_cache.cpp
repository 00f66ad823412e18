#include "fusetune/core/block_cache.h"

#include <iterator>

namespace fusetune::memory {

// The block to hand out: with a note wanted, the newest block that has one (its owner freed it
// last); otherwise, or when none has one, the oldest block, one without a note first (a note is
// worth keeping for a request that can use it).
std::deque<BlockCache::Block>::iterator BlockCache::pick(size_t bytes, bool want_note) {
  if (want_note)
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
      if (it->bytes == bytes && it->note) return std::prev(it.base());
  auto any = blocks_.end();
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    if (it->bytes != bytes) continue;
    if (!it->note) return it;
    if (any == blocks_.end()) any = it;
  }
  return any;
}

void* BlockCache::take(size_t bytes, Note* note) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = pick(bytes, note != nullptr);
  if (found == blocks_.end()) return nullptr;
  void* p = found->ptr;
  if (note) *note = std::move(found->note);
  blocks_.erase(found);
  kept_ -= int64_t(bytes);
  return p;
}

bool BlockCache::keep(void* p, size_t bytes, int64_t live, int64_t bound, Note note) {
  if (!enabled_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (live + kept_ + int64_t(bytes) > bound) return false;
  blocks_.push_back({p, bytes, std::move(note)});
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
