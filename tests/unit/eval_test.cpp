// fusetune eval's scores against a direct computation: the log-probabilities of a task's
// choices from the plain logits graph and a log-softmax written out here, acc / acc_norm by
// hand, in every compile mode; the task layouts of lm-evaluation-harness; bad task rows.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "fusetune/compile/compiler.h"
#include "fusetune/data/multiple_choice.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/evaluate.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

InferenceModel byte_model(CompileMode mode) {
  InferenceModel m;
  m.model.config = tiny_config(/*tied=*/true, /*qkv_bias=*/false, 2);
  m.model.config.vocab_size = ByteTokenizer::kVocab;
  Graph g = build_logits_graph(m.model.config, 1, 4, DType::F32);
  m.model.params = init_parameters(graph_parameters(g), 3, DType::F32, 0.6);
  m.mode = mode;
  return m;
}

// Sum over the continuation of log softmax(logits)[next token], from the full logits.
double reference_logp(const InferenceModel& m, const std::string& context,
                      const std::string& choice) {
  ByteTokenizer tok;
  const auto ctx = tok.encode(context, true, false);
  const auto all = tok.encode(context + " " + choice, true, false);
  const int64_t T = int64_t(all.size()), V = m.model.config.vocab_size;
  EagerExecutor ex(build_logits_graph(m.model.config, 1, T, DType::F32));
  Tensor tokens = Tensor::empty({1, T}, DType::I32), pos = Tensor::empty({1, T}, DType::I32);
  for (int64_t i = 0; i < T; ++i) {
    tokens.data<int32_t>()[i] = all[size_t(i)];
    pos.data<int32_t>()[i] = int32_t(i);
  }
  Tensor logits = ex.run({{"tokens", tokens}, {"positions", pos}}, m.model.params)[0];
  double sum = 0;
  for (int64_t t = int64_t(ctx.size()) - 1; t + 1 < T; ++t) {
    const float* row = logits.data<float>() + t * V;
    double mx = row[0], z = 0;
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, double(row[j]));
    for (int64_t j = 0; j < V; ++j) z += std::exp(double(row[j]) - mx);
    sum += double(row[all[size_t(t + 1)]]) - mx - std::log(z);
  }
  return sum;
}

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(MultipleChoice, ReadsTheHarnessLayouts) {
  TempDir tmp;
  write(tmp / "t.jsonl",
        R"({"context": "The sky is", "choices": ["blue", "green"], "gold": 0})"
        "\n"
        R"({"ctx_a": "A man sits.", "ctx_b": "he then  [step] waves", "activity_label": "Waving",)"
        R"( "endings": ["a hand [title] Hi.", "b"], "label": "1"})"
        "\n\n"
        R"({"question": "2 + 2?", "choices": {"text": ["3", "4"], "label": ["A", "B"]},)"
        R"( "answerKey": "B"})"
        "\n");
  auto qs = load_multiple_choice((tmp / "t.jsonl").string());
  ASSERT_EQ(qs.size(), 3u);
  EXPECT_EQ(qs[0].context, "The sky is");
  EXPECT_EQ(qs[0].gold, 0);
  // "Waving: A man sits. He then  [step] waves": the brackets go, leaving three spaces, and
  // one pass of "  " -> " " (Python's str.replace) leaves two.
  EXPECT_EQ(qs[1].context, "Waving: A man sits. He then  waves");
  EXPECT_EQ(qs[1].choices[0], "a hand. Hi.");
  EXPECT_EQ(qs[1].gold, 1);
  EXPECT_EQ(qs[2].context, "Question: 2 + 2?\nAnswer:");
  EXPECT_EQ(qs[2].gold, 1);
  EXPECT_EQ(hellaswag_preprocess("  a    b "), "a  b");
}

TEST(MultipleChoice, BadRowsNameFileAndLine) {
  TempDir tmp;
  auto expect_error = [&](const std::string& row, const std::string& part) {
    write(tmp / "bad.jsonl", R"({"context": "x", "choices": ["a", "b"], "gold": 1})"
                             "\n" +
                                 row + "\n");
    try {
      load_multiple_choice((tmp / "bad.jsonl").string());
      ADD_FAILURE() << "no error for " << row;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.jsonl line 2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"context": "x", "choices": ["a", "b"], "gold": 2})", "gold");
  expect_error(R"({"context": "x", "choices": ["a"], "gold": 0})", "at least 2");
  expect_error(
      R"({"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"})",
      "answerKey");
  expect_error(R"({"text": "no task fields"})", "context, choices, gold");
  expect_error(R"({"context": "x", "choices": ["a", "b"], "gold": 0)", "");  // bad JSON
}

TEST(EvalMultipleChoice, ScoresEqualTheDirectComputationInEveryMode) {
  TempDir tmp;
  write(
      tmp / "task.jsonl",
      R"({"context": "Once upon a time", "choices": ["there was a cat.", "xq", "zz top"], "gold": 0})"
      "\n"
      R"({"context": "The dog", "choices": ["ran", "barked loudly at the moon"], "gold": 1})"
      "\n"
      R"({"context": "Hi", "choices": ["a", "bb", "ccc", "dddd"], "gold": 3})"
      "\n");
  const auto qs = load_multiple_choice((tmp / "task.jsonl").string());
  ByteTokenizer tok;
  int64_t want = 0, want_norm = 0;
  {
    InferenceModel m = byte_model(CompileMode::None);
    for (const auto& q : qs) {
      std::vector<double> s, n;
      for (const auto& c : q.choices) {
        s.push_back(reference_logp(m, q.context, c));
        n.push_back(s.back() / double(c.size()));
      }
      want += std::max_element(s.begin(), s.end()) - s.begin() == q.gold;
      want_norm += std::max_element(n.begin(), n.end()) - n.begin() == q.gold;
    }
  }
  Config cfg = Config::from_string(
      "task_file: " + (tmp / "task.jsonl").string() + "\nbatch_size: 3\n", "test");
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    InferenceModel m = byte_model(mode);
    MultipleChoiceResult r = evaluate_multiple_choice(cfg, m, tok);
    EXPECT_EQ(r.questions, 3);
    EXPECT_EQ(r.correct, want) << compile_mode_name(mode);
    EXPECT_EQ(r.correct_norm, want_norm) << compile_mode_name(mode);
  }
  // Row by row, the scorer's sums equal the direct ones.
  InferenceModel m = byte_model(CompileMode::Full);
  SequenceScorer scorer(m);
  for (const auto& q : qs) {
    for (const auto& c : q.choices) {
      const auto ctx = tok.encode(q.context, true, false);
      const auto all = tok.encode(q.context + " " + c, true, false);
      Batch b;
      b.batch_size = 1;
      b.seq_len = int64_t(all.size());
      b.tokens = all;
      for (size_t i = 0; i < all.size(); ++i) {
        b.positions.push_back(int32_t(i));
        b.labels.push_back(i + 1 < all.size() && i + 1 >= ctx.size() ? all[i + 1] : kIgnoreIndex);
      }
      EXPECT_NEAR(scorer.logps(b)[0], reference_logp(m, q.context, c), 1e-4) << c;
    }
  }
}

}  // namespace
