#pragma once
// Prompts for online reinforcement learning (the GRPO recipes, docs/design.md §11): kind
// gsm8k, torchtune's dev GRPO dataset (`gsm8k_dataset`). Each row's `question` column
// (column_map renames it) is put into `prompt_template` at "{question}" and tokenized; nothing
// is trained on the prompt itself (the completions sampled from it are). Every other column
// of the row is kept as text for the rewards: answer_match reads GSM8K's `answer`, an external
// scorer receives them all.
//
// `partition: "a-b/n"` (torchtune's key) keeps parts a..b of the split cut into n equal parts
// (numbered from 0), as the split slice "[100a/n %:100(b+1)/n %]"; "a/n" is one part.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune::datasets {

// The default prompt: the question, then a request for tagged reasoning and a marked answer
// (what the default rewards, format and answer_match, score).
extern const char* const kDefaultReasoningPrompt;

struct PromptRow {
  std::string text;                            // the prompt as the model sees it
  std::map<std::string, std::string> columns;  // the row's other columns, as text
};

class PromptDataset final : public Dataset {
 public:
  PromptDataset(std::vector<Sample> samples, std::vector<PromptRow> rows, DatasetReport report);
  int64_t size() const override { return int64_t(samples_.size()); }
  // tokens: the prompt; labels: all -100 (the loader's batches only carry the indices).
  const Sample& get(int64_t i) const override;
  const DatasetReport& report() const override { return report_; }
  const PromptRow& row(int64_t i) const;

 private:
  std::vector<Sample> samples_;
  std::vector<PromptRow> rows_;
  DatasetReport report_;
};

// The split with `partition` applied ("train" + "1-9/10" -> "train[10%:100%]"); an Error
// names a malformed partition or one combined with an already sliced split.
std::string split_with_partition(const std::string& split, const std::string& partition);

// Rows of opts.source: .json/.jsonl rows, or the documents of a .txt file, each a question
// (a story's beginning for a story model). `prompt_template` must contain "{question}". A
// prompt longer than opts.max_seq_len (when set) keeps its first max_seq_len tokens, as
// torchtune's tokenizers cut it (the report counts them).
std::unique_ptr<PromptDataset> load_prompts(const DatasetOptions& opts, const Tokenizer& tok,
                                            const std::string& prompt_template);

}  // namespace fusetune::datasets
