// The model, loaded from the Hugging Face files of stories260K, reproduces the reference
// values computed by llama2.c's run.c (and an independent PyTorch implementation).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "test_support.h"

using namespace fusetune;

namespace {

struct Loaded {
  HFCheckpoint ckpt;
  TensorMap params;
};

Loaded load_stories() {
  Loaded l{load_hf_checkpoint(fusetune::testing::assets_dir() / "stories260K"), {}};
  for (auto& [name, t] : l.ckpt.tensors) l.params[name] = t;
  return l;
}

Tensor run_logits(const Loaded& l, const std::vector<int32_t>& ids) {
  const int64_t T = int64_t(ids.size());
  Graph g = build_logits_graph(l.ckpt.config, 1, T, DType::F32);
  Tensor tok = Tensor::empty({1, T}, DType::I32), pos = Tensor::empty({1, T}, DType::I32);
  for (int64_t i = 0; i < T; ++i) {
    tok.data<int32_t>()[i] = ids[size_t(i)];
    pos.data<int32_t>()[i] = int32_t(i);
  }
  EagerExecutor ex(g);
  return ex.run({{"tokens", tok}, {"positions", pos}}, l.params)[0];
}

double logsumexp(const float* row, int64_t n) {
  double mx = row[0], s = 0;
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, double(row[j]));
  for (int64_t j = 0; j < n; ++j) s += std::exp(double(row[j]) - mx);
  return mx + std::log(s);
}

nlohmann::json golden() {
  std::ifstream f(fusetune::testing::assets_dir() / "stories260K" / "golden.json");
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(Stories260KGolden, Position0LogitsAndLogsumexp) {
  FT_REQUIRE_ASSET("stories260K/golden.json");
  Loaded l = load_stories();
  auto gj = golden()["bos_position0"];
  Tensor logits = run_logits(l, gj["input_ids"].get<std::vector<int32_t>>());
  const float* row = logits.data<float>();
  const int64_t V = logits.dim(1);
  auto first8 = gj["logits_first8"].get<std::vector<double>>();
  for (size_t j = 0; j < first8.size(); ++j) EXPECT_NEAR(row[j], first8[j], 1e-4) << "logit " << j;
  int64_t argmax = 0;
  for (int64_t j = 1; j < V; ++j)
    if (row[j] > row[argmax]) argmax = j;
  EXPECT_EQ(argmax, gj["argmax"].get<int64_t>());
  EXPECT_NEAR(row[argmax], gj["argmax_logit"].get<double>(), 1e-4);
  EXPECT_NEAR(logsumexp(row, V), gj["logsumexp"].get<double>(), 1e-4);
}

TEST(Stories260KGolden, TeacherForcedMeanNll) {
  FT_REQUIRE_ASSET("stories260K/golden.json");
  Loaded l = load_stories();
  // golden.json holds two sequences (32 and 374 tokens); the loop must check both. (It read
  // golden()["teacher_forced_mean_nll"] in the for statement: a reference into a temporary
  // destroyed before the loop ran, so it checked nothing.)
  const nlohmann::json g = golden();
  size_t sequences = 0;
  for (const auto& item : g.at("teacher_forced_mean_nll")) {
    ++sequences;
    auto ids = item["input_ids"].get<std::vector<int32_t>>();
    ASSERT_GE(ids.size(), 2u) << "sequence " << sequences;
    Tensor logits = run_logits(l, ids);
    const int64_t V = logits.dim(1);
    double total = 0;
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      const float* row = logits.data<float>() + int64_t(t) * V;
      total += logsumexp(row, V) - row[ids[t + 1]];
    }
    EXPECT_NEAR(total / double(ids.size() - 1), item["mean_nll"].get<double>(), 1e-4);
  }
  EXPECT_EQ(sequences, 2u);
}

TEST(Stories260KGolden, GreedyDecodingFromBos) {
  FT_REQUIRE_ASSET("stories260K/golden.json");
  Loaded l = load_stories();
  auto expected = golden()["greedy_from_bos_first40"].get<std::vector<int32_t>>();
  std::vector<int32_t> ids = {1};
  for (size_t step = 0; step < expected.size(); ++step) {
    Tensor logits = run_logits(l, ids);
    const int64_t V = logits.dim(1);
    const float* row = logits.data<float>() + (int64_t(ids.size()) - 1) * V;
    int32_t best = 0;
    for (int64_t j = 1; j < V; ++j)
      if (row[j] > row[best]) best = int32_t(j);
    ids.push_back(best);
  }
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), expected);
}
