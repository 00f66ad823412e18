#pragma once
// Freed large buffers kept for reuse (docs/design.md §5). A training step frees and allocates
// the same large buffers every step (the gradients handed to the optimizer, eager activations);
// a fresh one costs the kernel a page fault and the zeroing of every page on its first touch,
// every step. A kept buffer's pages stay resident, and it is handed to the next request of
// exactly its size. Bounded so that the live bytes plus the kept ones stay within a bound the
// owner sets (memory.cpp: 9/8 of the largest live total the process has had), so caching holds
// little beyond what the process already held at once. This class is the policy, testable alone.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

namespace fusetune::memory {

class BlockCache {
 public:
  using Free = std::function<void(void*, size_t)>;
  BlockCache(bool enabled, Free free_block) : enabled_(enabled), free_(std::move(free_block)) {}

  // What the releaser knew about a block's contents (an opaque note, such as the rows of a
  // gradient that may be non-zero: core/tensor.h), handed back with the block.
  using Note = std::shared_ptr<const void>;
  // A kept block of exactly `bytes`, or null. With `note`: a block that has one first, and its
  // note (null when the block has none).
  void* take(size_t bytes, Note* note = nullptr);
  // Keeps `p` when on and live + kept + bytes fits `bound`; false: the caller frees it.
  bool keep(void* p, size_t bytes, int64_t live, int64_t bound, Note note = nullptr);
  // Frees the oldest kept blocks until live + kept fits `bound`.
  void fit(int64_t live, int64_t bound);
  void clear();
  int64_t bytes() const;

 private:
  struct Block {
    void* ptr;
    size_t bytes;
    Note note;
  };
  std::deque<Block>::iterator pick(size_t bytes, bool want_note);
  void free_oldest();
  bool enabled_;
  Free free_;
  mutable std::mutex mu_;
  std::deque<Block> blocks_;  // oldest first
  int64_t kept_ = 0;
};

}  // namespace fusetune::memory
