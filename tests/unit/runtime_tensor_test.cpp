#include <gtest/gtest.h>

#include "fusetune/core/memory.h"
#include "fusetune/core/tensor.h"
#include "fusetune/util/error.h"

using namespace fusetune;

TEST(Tensor, AllocationIsCountedAndReleased) {
  int64_t before = memory::current_bytes();
  {
    Tensor t = Tensor::zeros({4, 8}, DType::F32);
    EXPECT_EQ(memory::current_bytes() - before, 128);
    Tensor view = t.reshape({32});
    EXPECT_TRUE(view.shares_storage(t));
  }
  EXPECT_EQ(memory::current_bytes(), before);
}

TEST(Tensor, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(0.333251953125f)), 0.333251953125f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.960464477539063e-08f)), 5.960464477539063e-08f);
}

TEST(Tensor, ReshapeRejectsWrongNumel) {
  Tensor t = Tensor::zeros({2, 3}, DType::F32);
  EXPECT_THROW(t.reshape({4}), Error);
}
