// The allocator's cache of freed large buffers (core/block_cache.h): reuse of exactly the same
// size, and the bound live + kept <= the largest live total so far.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "fusetune/core/block_cache.h"
#include "fusetune/core/memory.h"
#include "fusetune/core/tensor.h"

using namespace fusetune;

namespace {

struct FakeBlocks {
  std::vector<void*> freed;
  memory::BlockCache cache{true, [this](void* p, size_t) { freed.push_back(p); }};
};

void* fake(uintptr_t k) { return reinterpret_cast<void*>(k << 21); }

}  // namespace

TEST(BlockCache, GivesBackOnlyABlockOfTheSameSize) {
  FakeBlocks f;
  ASSERT_TRUE(f.cache.keep(fake(1), 4 << 20, 0, 100 << 20));
  EXPECT_EQ(f.cache.take(6 << 20), nullptr);
  EXPECT_EQ(f.cache.take(2 << 20), nullptr);
  EXPECT_EQ(f.cache.take(4 << 20), fake(1));
  EXPECT_EQ(f.cache.take(4 << 20), nullptr);
  EXPECT_EQ(f.cache.bytes(), 0);
  EXPECT_TRUE(f.freed.empty());
}

// A note (what the releaser knew of the contents: an embedding gradient's rows) comes back with
// its block to a request that asks for one, the newest first; a request that does not ask takes
// a block without a note first, and a block handed out without its note loses it.
TEST(BlockCache, ANoteComesBackWithItsBlockToARequestThatWantsIt) {
  FakeBlocks f;
  const auto note_a = std::make_shared<int>(1), note_b = std::make_shared<int>(2);
  ASSERT_TRUE(f.cache.keep(fake(1), 4 << 20, 0, 100 << 20, note_a));
  ASSERT_TRUE(f.cache.keep(fake(2), 4 << 20, 0, 100 << 20));
  ASSERT_TRUE(f.cache.keep(fake(3), 4 << 20, 0, 100 << 20, note_b));
  memory::BlockCache::Note got;
  EXPECT_EQ(f.cache.take(4 << 20, &got), fake(3));
  EXPECT_EQ(got, note_b);
  EXPECT_EQ(f.cache.take(4 << 20), fake(2));  // the plain request leaves the noted block
  EXPECT_EQ(f.cache.take(4 << 20), fake(1));  // until it is the only one
  ASSERT_TRUE(f.cache.keep(fake(1), 4 << 20, 0, 100 << 20));
  got = note_a;
  EXPECT_EQ(f.cache.take(4 << 20, &got), fake(1));
  EXPECT_EQ(got, nullptr) << "a block kept without a note hands back none";
}

TEST(BlockCache, NeverHoldsMoreThanTheBoundAllowsAndFreesTheOldestFirst) {
  FakeBlocks f;
  const int64_t mib = 1 << 20, bound = 10 * mib;
  EXPECT_TRUE(f.cache.keep(fake(1), 4 * mib, 2 * mib, bound));   // 2 live + 4 kept
  EXPECT_TRUE(f.cache.keep(fake(2), 4 * mib, 2 * mib, bound));   // 2 + 8
  EXPECT_FALSE(f.cache.keep(fake(3), 2 * mib, 2 * mib, bound));  // 2 + 10 > 10
  EXPECT_EQ(f.cache.bytes(), 8 * mib);
  f.cache.fit(5 * mib, bound);  // 5 live: 5 + 4 fits after the oldest goes
  EXPECT_EQ(f.freed, std::vector<void*>{fake(1)});
  EXPECT_EQ(f.cache.bytes(), 4 * mib);
  f.cache.clear();
  EXPECT_EQ(f.freed, (std::vector<void*>{fake(1), fake(2)}));
}

TEST(BlockCache, OffKeepsNothing) {
  std::vector<void*> freed;
  memory::BlockCache cache(false, [&](void* p, size_t) { freed.push_back(p); });
  EXPECT_FALSE(cache.keep(fake(1), 4 << 20, 0, 100 << 20));
  EXPECT_EQ(cache.bytes(), 0);
}

// The process allocator: a freed gradient-sized buffer comes back for the next step's buffer of
// the same size (no page faults), live bytes are counted as before, and the kept bytes stay
// within the lifetime peak.
TEST(BlockCache, TheAllocatorReusesAFreedBufferOfTheSameSize) {
  memory::release_cached();
  const int64_t live = memory::current_bytes();
  const void* first = nullptr;
  {
    Tensor g = Tensor::empty({1 << 20, 3}, DType::F32);  // 12 MiB
    first = g.raw();
    EXPECT_EQ(memory::current_bytes() - live, int64_t(12) << 20);
  }
  EXPECT_EQ(memory::current_bytes(), live);
  EXPECT_EQ(memory::cached_bytes(), int64_t(12) << 20);
  {
    Tensor again = Tensor::empty({3, 1 << 20}, DType::F32);
    EXPECT_EQ(again.raw(), first);
    EXPECT_EQ(memory::cached_bytes(), 0);
  }
  Tensor larger = Tensor::empty({5 << 20}, DType::F32);  // 20 MiB: the 12 MiB block does not do
  EXPECT_NE(larger.raw(), first);
  EXPECT_LE(memory::current_bytes() + memory::cached_bytes(), memory::lifetime_peak_bytes());
  memory::release_cached();
}
