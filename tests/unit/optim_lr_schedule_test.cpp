// Expected values are Python's: torchtune's get_cosine_schedule_with_warmup lambda and
// transformers' get_linear_schedule_with_warmup lambda evaluated by CPython (repr printed).
#include <gtest/gtest.h>

#include "fusetune/optim/lr_schedule.h"
#include "fusetune/util/error.h"

using namespace fusetune;

TEST(OptimLRSchedule, CosineWithWarmupMatchesTorchtune) {
  const auto s = LRSchedule::cosine_with_warmup(2e-5, 10, 100);
  // Warmup edges: step 0 trains at lr 0, the last warmup step at 0.9, then the peak.
  EXPECT_EQ(s.multiplier(0), 0.0);
  EXPECT_EQ(s.multiplier(1), 0.1);
  EXPECT_EQ(s.multiplier(9), 0.9);
  EXPECT_EQ(s.multiplier(10), 1.0);
  EXPECT_EQ(s.multiplier(11), 0.9996954135095479);
  EXPECT_EQ(s.multiplier(55), 0.5);
  EXPECT_EQ(s.multiplier(99), 0.00030458649045211894);
  EXPECT_EQ(s.multiplier(100), 0.0);
  EXPECT_EQ(s.multiplier(120), 0.116977778440511);  // past the end the half cosine rises again
  EXPECT_EQ(s.lr_at(1), 2.0000000000000003e-06);
  EXPECT_EQ(s.lr_at(9), 1.8e-05);
  EXPECT_EQ(s.lr_at(10), 2e-05);
  EXPECT_EQ(s.lr_at(11), 1.999390827019096e-05);
  EXPECT_EQ(s.lr_at(99), 6.091729809042379e-09);

  EXPECT_EQ(LRSchedule::cosine_with_warmup(1, 10, 100, 1.0).multiplier(120), 0.5868240888334653);
  EXPECT_EQ(LRSchedule::cosine_with_warmup(1, 3, 50, 0.7).multiplier(37), 0.0004020576469108139);
}

TEST(OptimLRSchedule, NoWarmupStartsAtPeak) {
  const auto s = LRSchedule::cosine_with_warmup(3e-4, 0, 10);
  EXPECT_EQ(s.lr_at(0), 3e-4);
  EXPECT_EQ(s.multiplier(10), 0.0);
  // Degenerate: as many warmup as training steps (max(1, N - W) guards the division).
  const auto d = LRSchedule::cosine_with_warmup(1, 5, 5);
  EXPECT_EQ(d.multiplier(4), 0.8);
  EXPECT_EQ(d.multiplier(5), 1.0);
  EXPECT_EQ(d.multiplier(6), 0.0);
}

TEST(OptimLRSchedule, LinearWithWarmupMatchesTransformers) {
  const auto s = LRSchedule::linear_with_warmup(1.0, 10, 100);
  EXPECT_EQ(s.multiplier(0), 0.0);
  EXPECT_EQ(s.multiplier(1), 0.1);
  EXPECT_EQ(s.multiplier(9), 0.9);
  EXPECT_EQ(s.multiplier(10), 1.0);
  EXPECT_EQ(s.multiplier(11), 0.9888888888888889);
  EXPECT_EQ(s.multiplier(55), 0.5);
  EXPECT_EQ(s.multiplier(99), 0.011111111111111112);
  EXPECT_EQ(s.multiplier(100), 0.0);
  EXPECT_EQ(s.multiplier(120), 0.0);  // clamped at zero
}

TEST(OptimLRSchedule, ConstantSchedules) {
  const auto c = LRSchedule::constant(1e-4);
  EXPECT_EQ(c.lr_at(0), 1e-4);
  EXPECT_EQ(c.lr_at(1000000), 1e-4);
  const auto w = LRSchedule::constant_with_warmup(1e-4, 4);
  EXPECT_EQ(w.multiplier(0), 0.0);
  EXPECT_EQ(w.multiplier(2), 0.5);
  EXPECT_EQ(w.multiplier(4), 1.0);
  EXPECT_EQ(w.multiplier(400), 1.0);
}

TEST(OptimLRSchedule, RejectsBadArguments) {
  EXPECT_THROW(LRSchedule::cosine_with_warmup(1e-4, -1, 10), Error);
  EXPECT_THROW(LRSchedule::cosine_with_warmup(1e-4, 1, -10), Error);
  EXPECT_THROW(LRSchedule::constant(-1e-4), Error);
  EXPECT_THROW(LRSchedule::constant(1e-4).lr_at(-1), Error);
}

TEST(OptimLRSchedule, ParseKind) {
  EXPECT_EQ(
      parse_lr_schedule_kind("torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"),
      LRScheduleKind::CosineWithWarmup);
  EXPECT_EQ(parse_lr_schedule_kind("torchtune.modules.get_cosine_schedule_with_warmup"),
            LRScheduleKind::CosineWithWarmup);
  EXPECT_EQ(parse_lr_schedule_kind("transformers.get_linear_schedule_with_warmup"),
            LRScheduleKind::LinearWithWarmup);
  EXPECT_EQ(parse_lr_schedule_kind("constant"), LRScheduleKind::Constant);
  try {
    parse_lr_schedule_kind("get_cosine_schedule_with_warmpu");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'get_cosine_schedule_with_warmup'"),
              std::string::npos)
        << e.what();
  }
}
