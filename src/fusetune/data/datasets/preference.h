#pragma once
// Preference pairs for DPO (torchtune's preference_dataset). Each row gives a prompt and a
// chosen and a rejected reply, in one of three layouts (decided per row):
//   full conversations  {"chosen": [turns...], "rejected": [turns...]}   (hh-rlhf; the prompt
//                       is the turns before the last, the reply the last assistant turn)
//   shared prompt       {"conversations": [turns...], "chosen": {turn}, "rejected": {turn}}
//                       (ShareGPT-style DPO data; "messages" also accepted for the prompt)
//   strings             {"prompt": "...", "chosen": "...", "rejected": "..."}
//                       (e.g. stack_exchange_paired with column_map {prompt: question,
//                       chosen: response_j, rejected: response_k})
// Turns are openai {role, content} or sharegpt {from, value}. Both sides go through the same
// chat format; only the final reply is trained on (plus the prompt when train_on_input).
#include <memory>
#include <vector>

#include "fusetune/data/collate.h"
#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

struct PreferencePair {
  Sample chosen;
  Sample rejected;
  double margin = 0;  // the row's optional `margin` column (a reward model's loss subtracts it)
};

class PreferenceDataset {
 public:
  PreferenceDataset(std::vector<PreferencePair> pairs, DatasetReport report);
  int64_t size() const { return static_cast<int64_t>(pairs_.size()); }
  const PreferencePair& get(int64_t i) const;
  const DatasetReport& report() const { return report_; }

 private:
  std::vector<PreferencePair> pairs_;
  DatasetReport report_;
};

// Reads opts.source (kind "preference"; packing is not supported for pairs).
std::unique_ptr<PreferenceDataset> build_preference_dataset(const DatasetOptions& opts,
                                                            const Tokenizer& tok);

// 2B rows: the B chosen samples, then the B rejected ones in the same order (torchtune's
// padded_collate_dpo layout), padded to one length as collate() does.
Batch collate_preference(const std::vector<const PreferencePair*>& pairs,
                         const CollateOptions& opts);

}  // namespace fusetune
