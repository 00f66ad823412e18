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

// One row of unpaired preference data (TRL's KTO format, data/datasets/unpaired_preference.h):
// a prompt and one completion, labelled desirable or not.
struct UnpairedExample {
  Sample sample;
  bool desirable = false;
};

// Pairs, or unpaired examples (KTO): one kind per dataset.
class PreferenceDataset {
 public:
  PreferenceDataset(std::vector<PreferencePair> pairs, DatasetReport report);
  PreferenceDataset(std::vector<UnpairedExample> examples, DatasetReport report);
  bool unpaired() const { return unpaired_; }
  // Pairs, or unpaired examples.
  int64_t size() const {
    return static_cast<int64_t>(unpaired_ ? examples_.size() : pairs_.size());
  }
  const PreferencePair& get(int64_t i) const;       // paired data only
  const UnpairedExample& example(int64_t i) const;  // unpaired data only
  const DatasetReport& report() const { return report_; }
  // The batch of items `items` (indices into this dataset): collate_preference of the pairs, or
  // collate_unpaired of the examples.
  Batch collate(const std::vector<int64_t>& items, const CollateOptions& opts) const;

 private:
  bool unpaired_ = false;
  std::vector<PreferencePair> pairs_;
  std::vector<UnpairedExample> examples_;
  DatasetReport report_;
};

// Reads opts.source: kind "preference" (pairs), or "unpaired_preference" (TRL's prompt /
// completion / label rows, read by build_unpaired_preference_dataset). Packing is not supported.
std::unique_ptr<PreferenceDataset> build_preference_dataset(const DatasetOptions& opts,
                                                            const Tokenizer& tok);

// 2B rows: the B chosen samples, then the B rejected ones in the same order (torchtune's
// padded_collate_dpo layout), padded to one length as collate() does.
Batch collate_preference(const std::vector<const PreferencePair*>& pairs,
                         const CollateOptions& opts);

// Unpaired rows in their order, each marked desirable or not (Batch::desirable), padded as
// collate() does.
Batch collate_unpaired(const std::vector<const UnpairedExample*>& examples,
                       const CollateOptions& opts);

}  // namespace fusetune
