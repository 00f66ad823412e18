// GRPO's rollout (recipes/grpo_rollout.h): completions generated with the KV cache on the
// training weights themselves, seeded, and the log-probs recorded as tokens were chosen
// against the scoring graph the training step uses (models/grpo_graph.h).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "fusetune/compile/compiler.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/grpo_rollout.h"
#include "fusetune/recipes/training_step.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

struct TinyPolicy {
  ModelConfig cfg = tiny_config(false, true);
  TensorMap params;
  TinyPolicy() {
    cfg.vocab_size = 31;
    params = init_parameters(graph_parameters(build_logits_graph(cfg, 1, 4, DType::F32)), 7,
                             DType::F32, 0.5);
  }
};

GenerationOptions sampling(uint64_t seed, double temperature = 1.0) {
  GenerationOptions o;
  o.max_new_tokens = 6;
  o.sampling = {temperature, 0, 1.0};
  o.seed = seed;
  o.stop_tokens = {2};
  return o;
}

const std::vector<std::vector<int32_t>> kPrompts = {{3, 7, 1, 20}, {11, 5}};

TEST(GrpoRollout, RecordedLogProbsAreTheScoringGraphsWithinFp32Rounding) {
  TinyPolicy m;
  for (CompileMode mode : {CompileMode::None, CompileMode::Full}) {
    // The log-probs of the distribution sampled from: logits / temperature.
    const double temperature = mode == CompileMode::Full ? 0.7 : 1.0;
    Generator gen(m.cfg, m.params, {}, mode, DType::F32);
    const GrpoRollout r =
        generate_rollout(gen, kPrompts, 3, sampling(5, temperature), {}, RolloutLogps::Record);
    ASSERT_EQ(r.completions.size(), 6u);
    const Batch b = rollout_batch(r, 0, 4);
    PassOptions po;
    po.mode = mode;
    const Graph score =
        build_token_log_probs_graph(m.cfg, b.batch_size, b.seq_len, DType::F32, {}, temperature);
    const Tensor lp = compile_graph(score, po).executor->run(batch_inputs(b), m.params)[0];
    int64_t checked = 0;
    for (size_t i = 0; i < r.completions.size(); ++i)
      for (size_t k = 0; k < r.completions[i].size(); ++k) {
        const size_t at = i * size_t(b.seq_len) + r.prompts[i].size() - 1 + k;
        // The KV-cache decode and the whole-sequence forward sum in other orders: equal up
        // to fp32 rounding, not bitwise.
        EXPECT_NEAR(lp.data<float>()[at], r.logps[i][k], 2e-5) << "row " << i << " token " << k;
        ++checked;
      }
    EXPECT_GT(checked, 12);
  }
}

TEST(GrpoRollout, IsSeededAndReadsTheTrainingWeightsInPlace) {
  TinyPolicy m;
  Generator gen(m.cfg, m.params, {}, CompileMode::Full, DType::F32);
  const GrpoRollout a = generate_rollout(gen, kPrompts, 4, sampling(9), {}, RolloutLogps::Record);
  EXPECT_EQ(generate_rollout(gen, kPrompts, 4, sampling(9)).completions, a.completions);
  // The samples of one prompt differ from each other (one sampler draws them in turn).
  EXPECT_NE(a.completions[0], a.completions[1]);
  // An update written into the parameters' storage is what the same generator samples from
  // next: it holds no copy of the weights.
  Tensor& head = m.params.at("lm_head.weight");
  for (int64_t i = 0; i < head.numel(); ++i) head.data<float>()[i] *= 3.0f;
  const GrpoRollout c = generate_rollout(gen, kPrompts, 4, sampling(9), {}, RolloutLogps::Record);
  EXPECT_NE(c.logps, a.logps);
}

// With a seed per prompt (GRPO's: the step and the prompt's dataset index), a prompt's
// completions are the same whatever other prompts share its batch (as on another rank, or in
// another micro-batch), and differ between its samples and from another seed's.
TEST(GrpoRollout, PerPromptSeedsMakeAPromptsCompletionsIndependentOfItsBatch) {
  TinyPolicy m;
  Generator gen(m.cfg, m.params, {}, CompileMode::None, DType::F32);
  const std::vector<std::vector<int32_t>> prompts = {{3, 7, 1, 20}, {11, 5, 9, 4}, {6, 6, 2, 8}};
  const GrpoRollout all = generate_rollout(gen, prompts, 3, sampling(9), {101, 202, 303});
  const GrpoRollout second = generate_rollout(gen, {prompts[1]}, 3, sampling(9), {202});
  const GrpoRollout last_two =
      generate_rollout(gen, {prompts[2], prompts[1]}, 3, sampling(9), {303, 202});
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(second.completions[s], all.completions[3 + s]) << "sample " << s;
    EXPECT_EQ(last_two.completions[3 + s], all.completions[3 + s]) << "sample " << s;
    EXPECT_EQ(last_two.completions[s], all.completions[6 + s]) << "sample " << s;
  }
  EXPECT_NE(all.completions[3], all.completions[4]);
  EXPECT_NE(generate_rollout(gen, {prompts[1]}, 3, sampling(9), {203}).completions,
            second.completions);
}

// The recipes' rollout (per-prompt seeds, rows sampled and scored in parallel) is the same,
// tokens and log-probs bitwise, on one thread and on several; without RolloutLogps::Record it
// records no log-prob.
TEST(GrpoRollout, IsBitwiseTheSameForAnyThreadCountAndSkipsLogProbsUnlessAsked) {
  TinyPolicy m;
  m.cfg.vocab_size = 16411;  // rows long enough to be split among threads
  m.params = init_parameters(graph_parameters(build_logits_graph(m.cfg, 1, 4, DType::F32)), 7,
                             DType::F32, 0.5);
  Generator gen(m.cfg, m.params, {}, CompileMode::Full, DType::F32);
  const std::vector<std::vector<int32_t>> prompts = {{3, 7, 1, 20}, {11, 5, 9, 4}, {6, 6, 2, 8}};
  GenerationOptions o = sampling(9);
  o.sampling.top_p = 0.9;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const GrpoRollout one = generate_rollout(gen, prompts, 3, o, {1, 2, 3}, RolloutLogps::Record);
  omp_set_num_threads(std::max(2, threads));
  const GrpoRollout many = generate_rollout(gen, prompts, 3, o, {1, 2, 3}, RolloutLogps::Record);
  omp_set_num_threads(threads);
  EXPECT_EQ(many.completions, one.completions);
  EXPECT_EQ(many.logps, one.logps);
  ASSERT_EQ(one.logps.size(), 9u);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(one.logps[i].size(), one.completions[i].size());
  const GrpoRollout skipped = generate_rollout(gen, prompts, 3, o, {1, 2, 3});
  EXPECT_EQ(skipped.completions, one.completions);
  EXPECT_TRUE(skipped.logps.empty());
}

TEST(GrpoRollout, BatchLabelsTheCompletionTokensOnly) {
  GrpoRollout r;
  r.prompts = {{5, 6, 7}, {8}};
  r.completions = {{9, 2}, {10, 11, 12}};
  r.stopped = {true, false};
  const Batch b = rollout_batch(r, 0, 4);
  EXPECT_EQ(b.batch_size, 2);
  EXPECT_EQ(b.seq_len, 8);  // 5 and 4 tokens, padded to a multiple of 4
  const std::vector<int32_t> tokens = {5, 6, 7, 9, 2, 0, 0, 0, 8, 10, 11, 12, 0, 0, 0, 0};
  const int32_t x = kIgnoreIndex;
  const std::vector<int32_t> labels = {x, x, 9, 2, x, x, x, x, 10, 11, 12, x, x, x, x, x};
  EXPECT_EQ(b.tokens, tokens);
  EXPECT_EQ(b.labels, labels);
  EXPECT_EQ(b.positions[9], 1);
  EXPECT_EQ(b.items, (std::vector<int64_t>{0, 1}));
  const std::vector<float> mask = completion_mask(b);
  EXPECT_EQ(mask[2], 1.0f);
  EXPECT_EQ(mask[4], 0.0f);
}

}  // namespace
