// The GRPO loss (losses/grpo.h, losses/grpo_normalization.h, models/grpo_graph.h): group
// advantages, each loss_type's normalization and the clipped, KL-penalized per-token loss,
// against independent formulations written out here in double precision, float64 finite
// differences, and the three compile modes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "checks.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/core/memory.h"
#include "fusetune/losses/grpo.h"
#include "fusetune/losses/grpo_normalization.h"
#include "fusetune/models/grpo_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/runtime/eager_executor.h"
#include "gradcheck.h"
#include "graph_compare.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

const GrpoLossType kTypes[] = {GrpoLossType::GRPO, GrpoLossType::BNPO, GrpoLossType::DrGRPO,
                               GrpoLossType::DAPO};

TEST(GrpoAdvantages, AreTheGroupsStandardScoresOrCenteredRewards) {
  const std::vector<double> r = {1, 0, 0, 1, 5, 5, 5, 5, 0.5, 2, -1, 3};
  for (bool scale : {true, false}) {
    const std::vector<double> a = group_advantages(r, 4, scale);
    ASSERT_EQ(a.size(), r.size());
    for (size_t g = 0; g < 3; ++g) {
      const auto first = r.begin() + long(4 * g), last = first + 4;
      const double mean = std::accumulate(first, last, 0.0) / 4;
      const double sq = std::inner_product(first, last, first, 0.0);
      const double std = std::sqrt((sq - 4 * mean * mean) / 3);  // unbiased, as torch.std
      for (size_t i = 0; i < 4; ++i) {
        const double want = scale ? (r[4 * g + i] - mean) / (std + 1e-4) : r[4 * g + i] - mean;
        EXPECT_NEAR(a[4 * g + i], want, 1e-12) << "group " << g << " scale " << scale;
      }
    }
  }
  // A group whose rewards are all equal has zero advantages (nothing to learn).
  EXPECT_EQ(group_advantages({3, 3}, 2, true), (std::vector<double>{0, 0}));
  EXPECT_TRUE(contains(error_of([] { group_advantages({1, 2}, 1, true); }), "grpo_samples"));
}

// TRL's normalizations written directly over a step of micro-batches (per-token losses l and
// masks m, [rows][T] each), the gradient-accumulation average included.
double trl_loss(GrpoLossType type, const std::vector<std::vector<std::vector<double>>>& l,
                const std::vector<std::vector<std::vector<double>>>& m, int64_t max_len) {
  double step_tokens = 0;
  for (const auto& micro : m)
    for (const auto& row : micro) step_tokens += std::accumulate(row.begin(), row.end(), 0.0);
  const double M = double(l.size());
  double total = 0;
  for (size_t k = 0; k < l.size(); ++k) {
    double sum = 0, tokens = 0, row_means = 0;
    for (size_t r = 0; r < l[k].size(); ++r) {
      double row_sum = 0, row_tokens = 0;
      for (size_t t = 0; t < l[k][r].size(); ++t) {
        row_sum += l[k][r][t] * m[k][r][t];
        row_tokens += m[k][r][t];
      }
      sum += row_sum;
      tokens += row_tokens;
      row_means += row_sum / std::max(row_tokens, 1.0);
    }
    const double rows = double(l[k].size());
    switch (type) {
      case GrpoLossType::GRPO:
        total += row_means / rows / M;
        break;
      case GrpoLossType::BNPO:
        total += sum / std::max(tokens, 1.0) / M;
        break;
      case GrpoLossType::DrGRPO:
        total += sum / (rows * double(max_len)) / M;
        break;
      case GrpoLossType::DAPO:
        total += sum / step_tokens;  // the whole step's tokens; not averaged again
        break;
    }
  }
  return total;
}

TEST(GrpoTokenWeights, GiveEachLossTypeTrlsNormalization) {
  const int64_t rows = 3, T = 5, max_len = 7;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-2, 2);
  // Two micro-batches with different token counts; a row with no completion token.
  std::vector<std::vector<std::vector<double>>> l(2), m(2);
  const int lengths[2][3] = {{5, 2, 0}, {3, 4, 1}};
  for (size_t k = 0; k < 2; ++k)
    for (int64_t r = 0; r < rows; ++r) {
      l[k].emplace_back();
      m[k].emplace_back();
      for (int64_t t = 0; t < T; ++t) {
        l[k].back().push_back(u(rng));
        m[k].back().push_back(t < lengths[k][r] ? 1.0 : 0.0);
      }
    }
  for (GrpoLossType type : kTypes) {
    GrpoStepCounts counts;
    counts.micro_batches = 2;
    counts.step_tokens = 5 + 2 + 0 + 3 + 4 + 1;
    counts.max_completion_length = max_len;
    double got = 0;
    for (size_t k = 0; k < 2; ++k) {
      std::vector<float> mask;
      for (const auto& row : m[k])
        for (double v : row) mask.push_back(float(v));
      const std::vector<float> w = grpo_token_weights(type, mask, rows, T, counts);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < T; ++t)
          got += double(w[size_t(r * T + t)]) * l[k][size_t(r)][size_t(t)];
    }
    EXPECT_NEAR(got, trl_loss(type, l, m, max_len), 1e-6) << grpo_loss_type_name(type);
  }
}

// The per-token loss directly: -min(r A, clip(r) A) + beta k3.
double reference_loss(const GrpoLoss& loss, const std::vector<double>& lp,
                      const std::vector<double>& old, const std::vector<double>& ref,
                      const std::vector<double>& adv, const std::vector<double>& w) {
  double total = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double r = std::exp(lp[i] - old[i]);
    const double clipped = std::clamp(r, 1 - loss.epsilon, 1 + loss.epsilon_high);
    double l = -std::min(r * adv[i], clipped * adv[i]);
    const double log_ratio = ref[i] - lp[i];
    if (loss.beta != 0) l += loss.beta * (std::exp(log_ratio) - log_ratio - 1);
    total += w[i] * l;
  }
  return total;
}

TEST(GrpoLoss, ValueAndGradientsMatchTheFormulaAndFiniteDifferences) {
  const int64_t N = 12;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> lp(N), old(N), ref(N), adv(N), w(N);
  for (int64_t i = 0; i < N; ++i) {
    lp[size_t(i)] = -2 + u(rng);
    // Ratios from 0.5 to 1.7, so that some tokens are clipped on each side.
    old[size_t(i)] = lp[size_t(i)] - std::log(0.5 + 1.2 * double(i) / double(N - 1));
    ref[size_t(i)] = lp[size_t(i)] + 0.5 * u(rng);
    adv[size_t(i)] = i % 2 ? u(rng) + 1.1 : u(rng) - 1.1;
    w[size_t(i)] = i % 5 == 4 ? 0.0 : 0.1 + 0.05 * double(i);
  }
  for (const GrpoLoss& l :
       {GrpoLoss{GrpoLossType::GRPO, 0.2, 0.2, 0.0}, GrpoLoss{GrpoLossType::DAPO, 0.2, 0.28, 0.04},
        GrpoLoss{GrpoLossType::BNPO, 0.1, 0.3, 0.5}}) {
    // The loss alone as output 0 (check_gradients appends the gradients after it), or with
    // the ratios too.
    auto build = [&](Graph& g, bool with_ratio) {
      Builder b(g);
      GrpoLossInputs in;
      in.logps = g.param("logps", {N}, true);
      in.old_logps = g.input("old", {N}, DType::F64);
      in.ref_logps = g.input("ref", {N}, DType::F64);
      in.advantages = g.input("adv", {N}, DType::F64);
      in.weights = g.input("w", {N}, DType::F64);
      const GrpoLossOutputs out = build_grpo_loss(b, l, in);
      g.mark_output("loss", out.loss);
      if (with_ratio) g.mark_output("ratio", out.ratio);
      return out.loss;
    };
    auto tensor = [](const std::vector<double>& v) {
      Tensor t = Tensor::empty({int64_t(v.size())}, DType::F64);
      std::copy(v.begin(), v.end(), t.data<double>());
      return t;
    };
    TensorMap params{{"logps", tensor(lp)}};
    TensorMap inputs{
        {"old", tensor(old)}, {"ref", tensor(ref)}, {"adv", tensor(adv)}, {"w", tensor(w)}};
    Graph with_ratio(DType::F64);
    build(with_ratio, true);
    EagerExecutor ex(with_ratio);
    const std::vector<Tensor> got = ex.run(inputs, params);
    EXPECT_NEAR(got[0].data<double>()[0], reference_loss(l, lp, old, ref, adv, w), 1e-12);
    int clipped = 0;
    for (int64_t i = 0; i < N; ++i) {
      EXPECT_NEAR(got[1].data<double>()[i], std::exp(lp[size_t(i)] - old[size_t(i)]), 1e-12);
      clipped += l.clipped(got[1].data<double>()[i], adv[size_t(i)]);
    }
    EXPECT_GT(clipped, 0);  // the check covers clipped tokens (gradient 0 but for the KL)
    EXPECT_LT(clipped, N);
    Graph g(DType::F64);
    const Value loss_value = build(g, false);
    check_gradients(g, loss_value, params, inputs, int(N), 1e-7);
  }
}

TEST(GrpoLoss, LossTypeNamesParseAndUnknownOnesAreRefused) {
  for (GrpoLossType t : kTypes) EXPECT_EQ(grpo_loss_type_from(grpo_loss_type_name(t), "k"), t);
  const std::string e = error_of([] { grpo_loss_type_from("dr-grpo", "loss.loss_type"); });
  EXPECT_TRUE(contains(e, "loss.loss_type")) << e;
  EXPECT_TRUE(contains(e, "did you mean 'dr_grpo'")) << e;
}

// A GRPO micro-batch on the tiny model: rows whose first `prompt` tokens are the prompt
// (labels -100) and whose last row ends early (padding, -100).
Batch completion_batch(int64_t rows, int64_t T, int64_t V, uint64_t seed) {
  Batch b = random_batch(rows, T, V, seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < T; ++t) {
      const bool completion = t >= 2 && t < T - 1 && !(r == rows - 1 && t >= T - 3);
      b.labels[size_t(r * T + t)] = completion ? b.tokens[size_t(r * T + t + 1)] : kIgnoreIndex;
    }
  return b;
}

TEST(GrpoStep, RolloutLogProbsAreTheTrainingGraphsAndCompileModesAgree) {
  for (bool tied : {false, true}) {
    const ModelConfig cfg = tiny_config(tied, false);
    const int64_t rows = 4, T = 8, N = rows * T;
    // Untied at temperature 0.8 (h / t feeds the fused head), tied at 1.
    const GrpoLoss loss{GrpoLossType::GRPO, 0.2, 0.2, 0.1, tied ? 1.0 : 0.8};
    TrainingGraphOptions o;
    o.batch_size = rows;
    o.seq_len = T;
    o.loss = grpo_loss_builder(loss);
    TrainingGraph tg = build_training_graph(cfg, o);
    const Graph score = build_token_log_probs_graph(cfg, rows, T, DType::F32, {}, loss.temperature);
    TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F32, 0.3);
    const Batch b = completion_batch(rows, T, cfg.vocab_size, 11);
    TensorMap in = batch_inputs(b, DType::F32, 1.0);
    auto mask = std::vector<float>(size_t(N));
    for (int64_t i = 0; i < N; ++i) mask[size_t(i)] = b.labels[size_t(i)] != kIgnoreIndex;
    const std::vector<double> adv = group_advantages({1, 0, 0.5, 0}, 4, true);
    Tensor a = Tensor::empty({N}, DType::F32), w = Tensor::empty({N}, DType::F32);
    const std::vector<float> wv = grpo_token_weights(GrpoLossType::GRPO, mask, rows, T, {});
    for (int64_t i = 0; i < N; ++i) {
      a.data<float>()[i] = float(adv[size_t(i / T)]);
      w.data<float>()[i] = wv[size_t(i)];
    }
    in["advantages"] = a;
    in["token_weights"] = w;
    std::vector<std::vector<Tensor>> outs;
    for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      // The rollout's log-probs, from the forward-only graph in the same mode, are the old
      // and (the reference being the initial weights) the reference log-probs.
      const Tensor old = compile_graph(score, po).executor->run(in, params)[0];
      in["old_logps"] = old;
      in["ref_logps"] = old;
      outs.push_back(compile_graph(tg.graph, po).executor->run(in, params));
      const auto& names = tg.graph.outputs();
      for (size_t k = 0; k < names.size(); ++k) {
        const Tensor& t = outs.back()[k];
        if (names[k].first == "report:token_logps") {
          EXPECT_EQ(max_rel_diff(t, old), 0.0) << "mode " << int(mode);
        }
        for (int64_t i = 0; i < N && names[k].first == "report:ratio"; ++i) {
          EXPECT_EQ(t.data<float>()[i], 1.0f) << i;
        }
        for (int64_t i = 0; i < N && names[k].first == "report:kl"; ++i) {
          EXPECT_EQ(t.data<float>()[i], 0.0f) << i;
        }
      }
      if (mode == CompileMode::Full) {
        Graph run = run_passes(tg.graph, po, nullptr);
        EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbs), 1);
        EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbsBackward), 1);
        // The one [tokens x vocab] tensor is the one chunk's logits, kept for the backward.
        for (const Node& n : run.nodes())
          for (size_t k = 0; k < n.outputs.size(); ++k) {
            const TensorType& t = n.outputs[k];
            EXPECT_FALSE(!is_kept_head_logits(n, k) && t.shape.size() == 2 && t.shape[0] == N &&
                         t.shape[1] == cfg.vocab_size)
                << op_name(n.op) << " materializes [tokens x vocab] under compile: true";
          }
        EXPECT_EQ(count_ops(run_passes(score, po, nullptr), Op::FusedLinearLogProbs), 1);
      }
    }
    for (size_t m = 1; m < outs.size(); ++m)
      for (size_t k = 0; k < outs[0].size(); ++k)
        EXPECT_LT(max_rel_diff(outs[m][k], outs[0][k]), k == 0 ? 1e-5 : 1e-4)
            << "mode " << m << " output " << tg.graph.outputs()[k].first;
  }
}

// The fused head's kept logits (one chunk: the forward hands them to the backward instead of
// the backward recomputing them) give the recomputing step's bits; they are held outside the
// arena (allocated and freed around the head, as the scratch they replace); several chunks
// keep nothing and materialize no [tokens x vocab] tensor.
TEST(GrpoStep, KeptHeadLogitsGiveTheRecomputingStepsBits) {
  const ModelConfig cfg = tiny_config(false, false);
  const int64_t rows = 4, T = 8, N = rows * T;
  TrainingGraphOptions o;
  o.batch_size = rows;
  o.seq_len = T;
  o.loss = grpo_loss_builder(GrpoLoss{GrpoLossType::GRPO, 0.2, 0.2, 0.1, 1.0});
  const TrainingGraph tg = build_training_graph(cfg, o);
  const TensorMap params = init_parameters(graph_parameters(tg.graph), 5, DType::F32, 0.3);
  const Batch b = completion_batch(rows, T, cfg.vocab_size, 12);
  TensorMap in = batch_inputs(b, DType::F32, 1.0);
  Tensor a = Tensor::empty({N}, DType::F32), w = Tensor::empty({N}, DType::F32);
  Tensor old_lp = Tensor::empty({N}, DType::F32);
  for (int64_t i = 0; i < N; ++i) {
    a.data<float>()[i] = (i / T) % 2 ? 0.6f : -0.9f;
    w.data<float>()[i] = b.labels[size_t(i)] != kIgnoreIndex ? 1.0f / float(N) : 0.0f;
    old_lp.data<float>()[i] = -3.5f - 0.05f * float(i % 7);  // ratios on both clip sides
  }
  in["advantages"] = a;
  in["token_weights"] = w;
  in["old_logps"] = old_lp;
  in["ref_logps"] = old_lp;
  auto kept_nodes = [](const Graph& g) {
    int kept = 0;
    for (const Node& n : g.nodes()) kept += n.op == Op::FusedLinearLogProbs && n.attrs.keep_logits;
    return kept;
  };
  std::vector<std::vector<Tensor>> outs;
  std::vector<int64_t> arenas, peaks;
  for (bool keep : {true, false}) {
    PassOptions po;
    po.keep_head_logits = keep;
    EXPECT_EQ(kept_nodes(run_passes(tg.graph, po, nullptr)), keep ? 1 : 0);
    CompiledStep c = compile_graph(tg.graph, po);
    arenas.push_back(c.arena_bytes);
    c.executor->run(in, params);  // the first run allocates the arena
    const int64_t base = memory::current_bytes();
    memory::reset_peak();
    outs.push_back(c.executor->run(in, params));
    peaks.push_back(memory::peak_bytes() - base);
  }
  EXPECT_EQ(arenas[0], arenas[1]) << "the kept logits are not in the arena";
  // Freed after the backward, they cost no more than the scratch block they replace (held to
  // the end of the step, they would sit beside the trunk's gradients).
  EXPECT_LE(peaks[0], peaks[1]);
  for (size_t k = 0; k < outs[0].size(); ++k) {
    EXPECT_EQ(outs[0][k].nbytes(), outs[1][k].nbytes());
    EXPECT_EQ(std::memcmp(outs[0][k].raw(), outs[1][k].raw(), outs[0][k].nbytes()), 0)
        << "output " << tg.graph.outputs()[k].first;
  }
  // Chunks of fewer rows than N: nothing kept, no [tokens x vocab] tensor.
  PassOptions small;
  small.ce_chunk_budget_bytes = (N / 2) * cfg.vocab_size * 4;
  const Graph run = run_passes(tg.graph, small, nullptr);
  EXPECT_EQ(count_ops(run, Op::FusedLinearLogProbsBackward), 1);
  EXPECT_EQ(kept_nodes(run), 0);
  for (const Node& n : run.nodes())
    for (const TensorType& t : n.outputs)
      EXPECT_FALSE(t.shape.size() == 2 && t.shape[0] == N && t.shape[1] == cfg.vocab_size)
          << op_name(n.op) << " materializes [tokens x vocab] in chunks";
}

TEST(GrpoStep, WholeStepGradientsMatchFiniteDifferencesInFloat64) {
  const ModelConfig cfg = tiny_config(true, false);
  const int64_t rows = 2, T = 6, N = rows * T;
  TrainingGraphOptions o;
  o.batch_size = rows;
  o.seq_len = T;
  o.dtype = DType::F64;
  o.trainable = [](const std::string& n) { return n.find("embed") != std::string::npos; };
  Graph g(DType::F64);
  Builder b(g);
  LlamaInputs li;
  li.tokens = g.input("tokens", {rows, T}, DType::I32);
  Value labels = g.input("labels", {rows, T}, DType::I32);
  li.positions = g.input("positions", {rows, T}, DType::I32);
  LossContext c;
  c.model = build_llama(b, cfg, li, o.trainable);
  c.labels = b.reshape(labels, {N});
  c.scale = g.input("loss_scale", {}, DType::F64);
  c.batch_size = rows;
  c.seq_len = T;
  const LossOutputs lo = grpo_loss_builder({GrpoLossType::DAPO, 0.2, 0.28, 0.05})(b, c);
  g.mark_output("loss", lo.loss);
  TensorMap params = init_parameters(graph_parameters(g), 3, DType::F64, 0.5);
  const Batch batch = completion_batch(rows, T, cfg.vocab_size, 5);
  TensorMap in = batch_inputs(batch, DType::F64, 1.0);
  for (const char* name : {"old_logps", "ref_logps", "advantages", "token_weights"}) {
    Tensor t = Tensor::empty({N}, DType::F64);
    for (int64_t i = 0; i < N; ++i) {
      const double x = std::sin(double(i) + double(name[0]));
      t.data<double>()[i] = name[0] == 'a' ? x : name[0] == 't' ? 0.1 : -2.0 + 0.1 * x;
    }
    in[name] = t;
  }
  check_gradients(g, lo.loss, params, in, 10, 1e-6);
}

}  // namespace
