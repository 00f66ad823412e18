#pragma once
// The eval recipe (`fusetune eval`): perplexity of a dataset the training recipes read, or
// accuracy on a multiple-choice task (data/multiple_choice.h), of a model with an optional
// adapter. Both are sums of label log-probabilities computed by the sequence log-prob graph
// (models/training_graph.h), which compile: true runs with the fused head + log-softmax
// kernels, so no [tokens x vocab] tensor exists.
#include <map>
#include <memory>
#include <vector>

#include "fusetune/config/config.h"
#include "fusetune/data/batch.h"
#include "fusetune/recipes/inference_setup.h"
#include "fusetune/runtime/shared_arena.h"

namespace fusetune {

int eval_recipe(const Config& cfg);

// Per row of a batch, the summed log-probabilities of its labelled tokens (labels shifted, as
// the loader makes them). One compiled graph per batch shape, sharing one arena.
class SequenceScorer {
 public:
  explicit SequenceScorer(const InferenceModel& m) : m_(m) {}
  std::vector<double> logps(const Batch& batch);

 private:
  const InferenceModel& m_;
  std::shared_ptr<SharedArena> arena_ = std::make_shared<SharedArena>();
  std::map<std::vector<int64_t>, std::unique_ptr<Executor>> graphs_;
};

struct PerplexityResult {
  int64_t samples = 0, tokens = 0;
  double nll_sum = 0;  // summed over tokens
  double mean_nll() const { return tokens ? nll_sum / double(tokens) : 0.0; }
  double perplexity() const;
};

struct MultipleChoiceResult {
  int64_t questions = 0, correct = 0, correct_norm = 0;
  double acc() const { return questions ? double(correct) / double(questions) : 0.0; }
  double acc_norm() const { return questions ? double(correct_norm) / double(questions) : 0.0; }
};

// The recipe's two tasks, for tests and benchmarks.
PerplexityResult evaluate_perplexity(const Config& cfg, const InferenceModel& m,
                                     const Tokenizer& tok);
MultipleChoiceResult evaluate_multiple_choice(const Config& cfg, const InferenceModel& m,
                                              const Tokenizer& tok);

}  // namespace fusetune
