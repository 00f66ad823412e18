// Sequence classifiers and the reward model's loss (docs/design.md §12): the score at each
// row's last real token and TRL RewardTrainer's loss against formulas written out here in
// double precision and against float64 finite differences; the classifier's step in the three
// compile modes; Hugging Face *ForSequenceClassification checkpoints saved and loaded back
// bitwise; a causal LM turned into a classifier as transformers loads one.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "checks.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/io/hf_config.h"
#include "fusetune/losses/reward.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/fs.h"
#include "gradcheck.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

Tensor f64_tensor(const std::vector<double>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F64);
  for (size_t i = 0; i < v.size(); ++i) t.data<double>()[i] = v[i];
  return t;
}

// -log sigmoid(x), written from the definition.
double neg_log_sigmoid(double x) { return std::log(1.0 + std::exp(-x)); }

// ---- the score at the last real token -------------------------------------------------------

TEST(LastTokenScores, PickEachRowsLastRealTokenBitwiseWithGradients) {
  const int64_t rows = 3, T = 5, L = 2;
  const std::vector<int> lengths = {5, 2, 1};  // right-padded rows
  // The pooled scores, or (with_loss) a weighted sum of them to differentiate.
  auto graph = [&](bool with_loss, Value* loss) {
    Graph g(DType::F64);
    Builder b(g);
    Value scores = g.param("scores", {rows * T, L}, true);
    Value mask = g.input("mask", {rows * T}, DType::F64);
    Value pooled = build_last_token_scores(b, scores, mask, rows);  // [rows, L]
    EXPECT_EQ(g.shape(pooled), (Shape{rows, L}));
    if (!with_loss) {
      g.mark_output("pooled", pooled);
      return g;
    }
    *loss = b.sum(b.mul(pooled, g.input("w", {rows, L}, DType::F64)));
    g.mark_output("loss", *loss);
    return g;
  };
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> s(rows * T * L), m(rows * T, 0.0), w(rows * L);
  for (double& x : s) x = u(rng);
  for (double& x : w) x = u(rng);
  for (int64_t r = 0; r < rows; ++r) m[size_t(r * T + lengths[size_t(r)] - 1)] = 1.0;
  TensorMap params = {{"scores", f64_tensor(s, {rows * T, L})}};
  TensorMap in = {{"mask", f64_tensor(m, {rows * T})}, {"w", f64_tensor(w, {rows, L})}};
  const Tensor out = EagerExecutor(graph(false, nullptr)).run(in, params)[0];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < L; ++l)
      EXPECT_EQ(out.data<double>()[r * L + l], s[size_t((r * T + lengths[size_t(r)] - 1) * L + l)])
          << "row " << r << " label " << l;
  Value loss;
  Graph g = graph(true, &loss);
  EXPECT_LT(check_gradients(g, loss, params, in, 30, 1e-7), 1e-7);
}

// ---- TRL RewardTrainer's loss ---------------------------------------------------------------

// The loss TRL computes for one micro-batch holding every pair of the step, written out:
// mean over pairs of -log sigmoid(r_c - r_r - m), plus c * mean((r_c + r_r)^2).
double trl_reward_loss(const std::vector<double>& r, const std::vector<double>& margin, double c) {
  const size_t B = r.size() / 2;
  double bt = 0, center = 0;
  for (size_t i = 0; i < B; ++i) {
    bt += neg_log_sigmoid(r[i] - r[B + i] - margin[i]);
    center += (r[i] + r[B + i]) * (r[i] + r[B + i]);
  }
  return bt / double(B) + c * center / double(B);
}

TEST(RewardLossTest, MatchesTrlsFormulaInDoublePrecisionWithFiniteDifferenceGradients) {
  const int64_t B = 4;
  const std::vector<double> r = {1.5, -0.25, 3.0, 0.1, 0.5, 0.75, -2.0, 0.1};
  for (double c : {0.0, 0.01, 0.5})
    for (bool with_margin : {false, true}) {
      SCOPED_TRACE("center " + std::to_string(c) + (with_margin ? " margins" : ""));
      const std::vector<double> margin =
          with_margin ? std::vector<double>{0.5, 0.0, -1.0, 2.0} : std::vector<double>(B, 0.0);
      Graph g(DType::F64);
      Builder b(g);
      Value rewards = g.param("rewards", {2 * B}, true);
      Value m = g.input("margins", {B}, DType::F64);
      Value scale = g.input("scale", {}, DType::F64);
      RewardLoss loss;
      loss.center_rewards_coefficient = c;
      RewardLossOutputs out = build_reward_loss(b, loss, rewards, m, scale);
      g.mark_output("loss", out.loss);
      TensorMap params = {{"rewards", f64_tensor(r, {2 * B})}};
      TensorMap in = {{"margins", f64_tensor(margin, {B})},
                      {"scale", scalar_tensor(1.0 / double(B), DType::F64)}};
      EXPECT_NEAR(EagerExecutor(g).run(in, params)[0].data<double>()[0],
                  trl_reward_loss(r, margin, c), 1e-14);
      EXPECT_LT(check_gradients(g, out.loss, params, in, 12, 1e-7), 1e-7);
    }
}

// ---- the classifier model -------------------------------------------------------------------

ModelConfig tiny_classifier(const std::string& model_type, int64_t labels) {
  ModelConfig c = tiny_config(false, model_type == "qwen2");
  c.model_type = model_type;
  c.num_labels = labels;
  c.pad_token_id = 0;
  return c;
}

// Two pairs as 4 right-padded rows of different lengths, with their last-token mask.
TensorMap classifier_inputs(const ModelConfig& cfg, int64_t T) {
  const int64_t rows = 4;
  Batch b = random_batch(rows, T, cfg.vocab_size, 21);
  TensorMap in = fusetune::testing::batch_inputs(b, DType::F32, 0.5);
  const int lengths[rows] = {int(T), 3, int(T) - 2, 1};
  Tensor mask = Tensor::zeros({rows * T}, DType::F32);
  for (int64_t r = 0; r < rows; ++r) mask.data<float>()[r * T + lengths[r] - 1] = 1.0f;
  in["last_token_mask"] = mask;
  Tensor margins = Tensor::zeros({rows / 2}, DType::F32);
  margins.data<float>()[1] = 0.5f;
  in["margins"] = margins;
  return in;
}

TEST(Classifier, ScoreHeadReplacesTheLmHeadAndCompileModesAgree) {
  const ModelConfig cfg = tiny_classifier("llama", 1);
  const int64_t T = 8;
  TrainingGraphOptions o;
  o.batch_size = 4;
  o.seq_len = T;
  RewardLoss loss;
  loss.center_rewards_coefficient = 0.01;
  o.loss = reward_loss_builder(loss);
  TrainingGraph tg = build_training_graph(cfg, o);
  bool has_score = false, has_lm_head = false;
  for (const ParamInfo& p : graph_parameters(tg.graph)) {
    has_score |= p.name == "score.weight" && p.shape == Shape{1, cfg.hidden_size};
    has_lm_head |= p.name == "lm_head.weight";
  }
  EXPECT_TRUE(has_score);
  EXPECT_FALSE(has_lm_head);
  const TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F32, 0.3);
  const TensorMap in = classifier_inputs(cfg, T);
  std::vector<std::vector<Tensor>> outs;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    PassOptions po;
    po.mode = mode;
    outs.push_back(compile_graph(tg.graph, po).executor->run(in, params));
  }
  for (size_t m = 1; m < outs.size(); ++m)
    for (size_t k = 0; k < outs[0].size(); ++k)
      EXPECT_LT(max_rel_diff(outs[m][k], outs[0][k]), k == 0 ? 1e-5 : 1e-4)
          << "mode " << m << " output " << tg.graph.outputs()[k].first;
  // The reported rewards are the scoring graph's scores at the last real tokens.
  Graph sg = build_sequence_scores_graph(cfg, 4, T, DType::F32);
  const Tensor scores = EagerExecutor(sg).run(in, params)[0];
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(outs[0][outs[0].size() - 2].data<float>()[i], scores.data<float>()[i]);
    EXPECT_EQ(outs[0][outs[0].size() - 1].data<float>()[i], scores.data<float>()[2 + i]);
  }
}

TEST(Classifier, CrossEntropyOnAClassifierIsAClearError) {
  TrainingGraphOptions o;
  EXPECT_TRUE(contains(error_of([&] { build_training_graph(tiny_classifier("llama", 1), o); }),
                       "reward_model_finetune_single_device"));
}

// A *ForSequenceClassification checkpoint of each family: saved, loaded (architectures,
// num_labels, pad_token_id, score.weight and no lm_head), saved again: the same bytes.
TEST(Classifier, HfCheckpointsRoundTripBitwise) {
  TempDir tmp;
  for (const char* type : {"llama", "mistral", "qwen2"}) {
    SCOPED_TRACE(type);
    const ModelConfig cfg = tiny_classifier(type, 3);
    const Graph g = build_sequence_scores_graph(cfg, 1, 4, DType::F32);
    const TensorMap params = init_parameters(graph_parameters(g), 3, DType::F32);
    const std::map<std::string, Tensor> by_name(params.begin(), params.end());
    NamedTensors named(by_name.begin(), by_name.end());
    const fs::path a = tmp / (std::string(type) + "_a"), b = tmp / (std::string(type) + "_b");
    save_hf_checkpoint(a, cfg, named);
    const nlohmann::json j = nlohmann::json::parse(read_file(a / "config.json"));
    const std::string arch = std::string(type == std::string("llama")     ? "Llama"
                                         : type == std::string("mistral") ? "Mistral"
                                                                          : "Qwen2") +
                             "ForSequenceClassification";
    EXPECT_EQ(j.at("architectures"), nlohmann::json::array({arch}));
    EXPECT_EQ(j.at("id2label").size(), 3u);
    EXPECT_EQ(j.at("pad_token_id"), 0);
    HFCheckpoint ck = load_hf_checkpoint(a);
    EXPECT_EQ(ck.config.num_labels, 3);
    EXPECT_EQ(ck.config.pad_token_id, 0);
    EXPECT_EQ(ck.tensors.count("lm_head.weight"), 0u);
    ASSERT_EQ(ck.tensors.size(), params.size());
    for (const auto& [name, t] : params) EXPECT_TRUE(same_bits(ck.tensors.at(name), t)) << name;
    // Loaded and saved, twice: the second save is the first's bytes (the first from code also
    // writes the family defaults config.json left out, bos/eos ids).
    NamedTensors loaded(ck.tensors.begin(), ck.tensors.end());
    save_hf_checkpoint(b, ck.config, loaded);
    HFCheckpoint ck2 = load_hf_checkpoint(b);
    NamedTensors again(ck2.tensors.begin(), ck2.tensors.end());
    const fs::path c = tmp / (std::string(type) + "_c");
    save_hf_checkpoint(c, ck2.config, again);
    for (const char* f : {"config.json", "model.safetensors"})
      EXPECT_EQ(read_file(b / f), read_file(c / f)) << f;
    EXPECT_EQ(read_file(a / "model.safetensors"), read_file(b / "model.safetensors"));
  }
}

// transformers' num_labels: the key, else id2label's size, else 2.
TEST(Classifier, NumLabelsFromTheKeyOrId2labelOrTransformersDefault) {
  nlohmann::json j = {{"model_type", "llama"},
                      {"vocab_size", 16},
                      {"hidden_size", 8},
                      {"intermediate_size", 16},
                      {"num_hidden_layers", 1},
                      {"num_attention_heads", 2},
                      {"architectures", {"LlamaForSequenceClassification"}}};
  EXPECT_EQ(parse_model_config(j).num_labels, 2);
  j["id2label"] = {{"0", "LABEL_0"}};
  EXPECT_EQ(parse_model_config(j).num_labels, 1);
  j["num_labels"] = 4;
  EXPECT_EQ(parse_model_config(j).num_labels, 4);
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_EQ(parse_model_config(j).num_labels, 0);
}

// A causal LM becomes a classifier as transformers loads one: lm_head dropped, score fresh,
// every other tensor as it was; the config written is the classifier's.
TEST(Classifier, ACausalLmBecomesAClassifierWithAFreshScore) {
  ModelConfig cfg = tiny_config(false, false);
  TrainingGraphOptions o;
  LoadedModel m;
  m.config = cfg;
  m.params = init_parameters(graph_parameters(build_training_graph(cfg, o).graph), 3, DType::F32);
  const Tensor embed = m.params.at("model.embed_tokens.weight");
  to_sequence_classifier(m, 1, 9, 0.02);
  EXPECT_EQ(m.config.num_labels, 1);
  EXPECT_EQ(m.params.count("lm_head.weight"), 0u);
  ASSERT_EQ(m.params.at("score.weight").shape(), (Shape{1, cfg.hidden_size}));
  EXPECT_TRUE(same_bits(m.params.at("model.embed_tokens.weight"), embed));
  const nlohmann::json j = model_config_to_json(m.config);
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"LlamaForSequenceClassification"}));
  // The parameter set is the classifier graph's.
  std::map<std::string, Shape> want;
  for (const ParamInfo& p :
       graph_parameters(build_sequence_scores_graph(m.config, 1, 2, DType::F32)))
    want[p.name] = p.shape;
  ASSERT_EQ(want.size(), m.params.size());
  for (const auto& [name, t] : m.params) EXPECT_EQ(want.at(name), t.shape()) << name;
  EXPECT_TRUE(contains(error_of([&] { to_sequence_classifier(m, 2, 9, 0.02); }), "1 labels"));
}

}  // namespace
