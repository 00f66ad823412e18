// 8-bit AdamW on the real stories260K model: its loss curve follows fp32 AdamW's, and its
// optimizer state, measured by the memory counters on the model's own parameters, is about a
// quarter of AdamW's and is what the memory estimate (`fusetune plan`) predicts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fusetune/compile/memory_estimate.h"
#include "fusetune/config/config.h"
#include "fusetune/core/memory.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/optim/adamw8bit.h"
#include "fusetune/recipes/recipe_setup.h"
#include "stories260k_curve.h"

namespace fs = std::filesystem;
using namespace fusetune;
using namespace fusetune::testing;

namespace {

// The suite runs 100 steps (two runs, about 15 s of CPU); FUSETUNE_ADAMW8BIT_STEPS=200
// runs the 200-step comparison (also measured with `fusetune run`, see the commit notes).
constexpr int64_t kDefaultSteps = 100;

int64_t steps_to_run() {
  if (const char* s = std::getenv("FUSETUNE_ADAMW8BIT_STEPS")) return std::atoll(s);
  return kDefaultSteps;
}

std::vector<double> train(const TempDir& tmp, const std::string& name, int64_t steps,
                          const std::string& optimizer) {
  return train_stories260k_curve(tmp, name, steps, optimizer);
}

}  // namespace

TEST(AdamW8bitStories260K, LossCurveFollowsAdamW) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  FT_REQUIRE_ASSET("datasets/tinystories_197k.txt");
  TempDir tmp;
  const int64_t steps = steps_to_run();
  const std::vector<double> fp32 = train(tmp, "fp32", steps, "  _component_: torch.optim.AdamW\n");
  const std::vector<double> q8 =
      train(tmp, "q8", steps, "  _component_: bitsandbytes.optim.AdamW8bit\n");
  ASSERT_EQ(int64_t(fp32.size()), steps);
  ASSERT_EQ(int64_t(q8.size()), steps);
  EXPECT_EQ(fp32[0], q8[0]);  // the same first batch on the same weights
  // "Within 1%" is judged on the curve, not on single batches: the trajectories separate a
  // little (the 8-bit moments round differently), and one batch's loss moves by a few percent
  // between two nearby weight vectors (measured over 200 steps: the largest single-step
  // difference was 4.5%, while fp32 AdamW with lr changed by 0.1% stays within 0.06%). Every
  // 20-step mean and the mean per-step difference must be within 1%.
  constexpr int64_t kWindow = 20;
  double worst = 0, worst_window = 0, sum_rel = 0;
  int64_t worst_step = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const double rel = std::abs(q8[size_t(i)] - fp32[size_t(i)]) / fp32[size_t(i)];
    sum_rel += rel;
    if (rel > worst) worst = rel, worst_step = i + 1;
  }
  for (int64_t w = 0; w + kWindow <= steps; w += kWindow) {
    double a = 0, b = 0;
    for (int64_t i = w; i < w + kWindow; ++i) a += fp32[size_t(i)], b += q8[size_t(i)];
    const double rel = std::abs(a - b) / a;
    worst_window = std::max(worst_window, rel);
    EXPECT_LT(rel, 0.01) << "steps " << w + 1 << ".." << w + kWindow << ": mean loss AdamW "
                         << a / kWindow << ", AdamW8bit " << b / kWindow;
  }
  EXPECT_LT(sum_rel / double(steps), 0.01);
  double mean32 = 0, mean8 = 0;
  const int64_t tail = std::min<int64_t>(kWindow, steps);
  for (int64_t i = steps - tail; i < steps; ++i) mean32 += fp32[size_t(i)], mean8 += q8[size_t(i)];
  std::printf(
      "stories260K, %lld steps: loss AdamW %.4f -> %.4f, AdamW8bit %.4f -> %.4f; mean of the "
      "last %lld steps %.4f vs %.4f; largest %lld-step-mean difference %.3f%%, mean per-step "
      "difference %.3f%%, largest per-step difference %.3f%% (step %lld)\n",
      (long long)steps, fp32.front(), fp32.back(), q8.front(), q8.back(), (long long)tail,
      mean32 / double(tail), mean8 / double(tail), (long long)kWindow, 100 * worst_window,
      100 * sum_rel / double(steps), 100 * worst, (long long)worst_step);
  for (int64_t i = 0; i < steps; i += std::max<int64_t>(1, steps / 10))
    std::printf("  step %4lld  AdamW %.4f  AdamW8bit %.4f\n", (long long)i + 1, fp32[size_t(i)],
                q8[size_t(i)]);
  // Training went somewhere: the loss came down with both.
  EXPECT_LT(mean8 / double(tail), fp32.front());
}

TEST(AdamW8bitStories260K, StateIsAQuarterAndTheEstimateAgrees) {
  FT_REQUIRE_ASSET("stories260K/model.safetensors");
  HFCheckpoint ck = load_hf_checkpoint(assets_dir() / "stories260K");
  std::vector<Tensor> values, grads;
  for (auto& [name, t] : ck.tensors) {
    values.push_back(t.clone());
    grads.push_back(Tensor::zeros(t.shape(), DType::F32));
    grads.back().data<float>()[0] = 1e-3f;
  }
  std::vector<ParamRef> refs;
  size_t i = 0;
  for (auto& [name, t] : ck.tensors) {
    refs.push_back({name, &values[i], &grads[i]});
    ++i;
  }
  auto measure = [&](Optimizer& opt) {
    const int64_t before = memory::current_bytes();
    opt.step(refs, 1e-3);
    const int64_t grown = memory::current_bytes() - before;
    EXPECT_EQ(grown, opt.state_bytes());
    return grown;
  };
  auto predicted = [&](int64_t min_8bit) {
    OptimizerStateSize s(2.0);
    s.min_8bit_numel = min_8bit;
    int64_t total = 0;
    for (const auto& [name, t] : ck.tensors) total += s.bytes(t.numel(), int64_t(t.nbytes()));
    return total;
  };
  AdamW fp32;
  AdamW8bit dflt;  // bitsandbytes' min_8bit_size 4096: k/v projections (2048) and norms fp32
  AdamW8bitOptions o;
  o.min_8bit_size = 2048;  // only the norms fp32
  AdamW8bit all(o);
  const int64_t a = measure(fp32), b = measure(dflt), c = measure(all);
  EXPECT_EQ(a, predicted(0));
  EXPECT_EQ(b, predicted(4096));
  EXPECT_EQ(c, predicted(2048));
  EXPECT_LT(double(b) / double(a), 0.33);
  EXPECT_NEAR(double(c) / double(a), 0.25, 0.01);
  std::printf(
      "stories260K optimizer state (measured = estimated): AdamW %lld B; AdamW8bit %lld B "
      "(%.3f, min_8bit_size 4096); %lld B (%.3f, min_8bit_size 2048)\n",
      (long long)a, (long long)b, double(b) / double(a), (long long)c, double(c) / double(a));

  // What `fusetune plan` uses for the config: the same rule.
  Config cfg = Config::from_string(
      "optimizer:\n  _component_: AdamW8bit\n  lr: 1e-3\n  min_8bit_size: 2048\n", "t.yaml");
  const OptimizerStateSize from_cfg = optimizer_state_ratio(cfg);
  int64_t total = 0;
  for (const auto& [name, t] : ck.tensors) total += from_cfg.bytes(t.numel(), int64_t(t.nbytes()));
  EXPECT_EQ(total, c);
}
