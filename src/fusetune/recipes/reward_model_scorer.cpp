#include "fusetune/recipes/reward_model_scorer.h"

#include <memory>

#include "fusetune/config/components.h"
#include "fusetune/data/collate.h"
#include "fusetune/io/hf_checkpoint.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/recipes/reward_step.h"
#include "fusetune/recipes/training_step.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The loaded classifier and its compiled scoring graphs, shared by the scorer's copies.
struct RewardModel {
  ModelConfig config;
  TensorMap params;
  std::unique_ptr<CompiledGraphs> graphs;
  double compile_s = 0;
};

}  // namespace

CompletionScorer reward_model_scorer(const Config& section, const Tokenizer& tok,
                                     CompileMode mode) {
  const std::string dir = section.str("checkpoint_dir");
  auto m = std::make_shared<RewardModel>();
  HFCheckpoint ck = load_hf_checkpoint_owned(dir, checkpoint_file_list(section), DType::F32);
  m->config = ck.config;
  FT_CHECK(m->config.num_labels == 1,
           "config key '" + section.full_key("checkpoint_dir") + "': " + dir +
               (m->config.num_labels == 0
                    ? " is a causal LM, not a reward model (a *ForSequenceClassification)"
                    : " is a classifier of " + std::to_string(m->config.num_labels) +
                          " labels; a reward model has one score"));
  FT_CHECK(tok.vocab_size() <= m->config.vocab_size,
           "config key '" + section.full_key("checkpoint_dir") + "': the tokenizer has " +
               std::to_string(tok.vocab_size()) + " tokens but the reward model's vocab_size is " +
               std::to_string(m->config.vocab_size));
  for (auto& [name, t] : ck.tensors) m->params[name] = std::move(t);
  PassOptions passes;
  passes.mode = mode;
  const ModelConfig* config = &m->config;
  m->graphs = std::make_unique<CompiledGraphs>(
      [config](int64_t rows, int64_t T, bool) {
        return build_sequence_scores_graph(*config, rows, T, DType::F32);
      },
      passes);
  return [m, &tok](const std::vector<ScoredCompletion>& batch) {
    std::vector<Sample> samples(batch.size());
    std::vector<const Sample*> rows;
    for (size_t i = 0; i < batch.size(); ++i) {
      samples[i].tokens =
          tok.encode(batch[i].prompt + batch[i].completion, tok.default_add_bos(), false);
      FT_CHECK(!samples[i].tokens.empty(), "a reward model cannot score an empty text");
      samples[i].labels.assign(samples[i].tokens.size(), kIgnoreIndex);
      rows.push_back(&samples[i]);
    }
    CollateOptions co;
    co.pad_id = tok.pad_id();
    const Batch b = collate(rows, co);
    TensorMap in = batch_inputs(b);
    in["last_token_mask"] = last_token_mask(b);
    const Tensor scores = m->graphs->run(b, in, ParamSource(m->params), &m->compile_s).at("scores");
    std::vector<double> out;
    for (int64_t i = 0; i < scores.numel(); ++i) out.push_back(element_as_double(scores, i));
    return out;
  };
}

}  // namespace fusetune
