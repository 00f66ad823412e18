// ZeRO-3's pool of gather buffers (distributed/gather_pool.h): a dropped tensor's buffer serves the
// next take of the same byte size, stays counted while idle, and trim() frees it.
#include <gtest/gtest.h>

#include "fusetune/core/memory.h"
#include "fusetune/distributed/gather_pool.h"

using namespace fusetune;
using fusetune::dist::GatherPool;

TEST(DistGatherPool, ReusesADroppedBufferOfTheSameByteSizeAndCountsItWhileIdle) {
  const int64_t before = memory::current_bytes();
  GatherPool pool;
  const void* first = nullptr;
  {
    Tensor a = pool.take({64, 32}, DType::F32);
    first = a.raw();
    EXPECT_EQ(memory::current_bytes() - before, 64 * 32 * 4);
  }
  EXPECT_EQ(memory::current_bytes() - before, 64 * 32 * 4) << "idle, still held";
  EXPECT_EQ(pool.take_new_buffers(), 1);
  {
    // Another shape of the same bytes gets the same buffer; a second one live at once does not.
    Tensor b = pool.take({32, 64}, DType::F32);
    EXPECT_EQ(b.raw(), first);
    EXPECT_EQ(b.shape(), (Shape{32, 64}));
    Tensor c = pool.take({2048}, DType::F32);
    EXPECT_NE(c.raw(), first);
    Tensor d = pool.take({16}, DType::BF16);  // another size
    EXPECT_EQ(pool.take_new_buffers(), 2);
    EXPECT_EQ(pool.held_bytes(), 2 * 8192 + 32);
  }
  EXPECT_EQ(pool.take_new_buffers(), 0);
  pool.trim();
  EXPECT_EQ(pool.held_bytes(), 0);
  EXPECT_EQ(memory::current_bytes(), before);
  {
    // Nothing idle now: a buffer handed back while its view lives would serve `other`.
    Tensor view = pool.take({64, 32}, DType::F32).reshape({2048});
    Tensor other = pool.take({2048}, DType::F32);
    EXPECT_NE(view.raw(), other.raw()) << "a view keeps its buffer lent";
  }
  pool.trim();
  EXPECT_EQ(memory::current_bytes(), before);
}

TEST(DistGatherPool, ATensorOutlivingThePoolFreesItsBuffer) {
  const int64_t before = memory::current_bytes();
  Tensor kept;
  {
    GatherPool pool;
    kept = pool.take({1000}, DType::F32);
    Tensor idle = pool.take({10}, DType::F32);
  }
  EXPECT_EQ(memory::current_bytes() - before, 4000) << "only the lent buffer is left";
  kept = Tensor();
  EXPECT_EQ(memory::current_bytes(), before);
}
