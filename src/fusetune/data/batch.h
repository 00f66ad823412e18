#pragma once
// One micro-batch as the model sees it, all [batch_size x seq_len] row-major.
// Labels are already shifted by the data layer (labels[i] = tokens[i+1], -100 = ignore), so
// neither the recipe nor the loss ever slices logits (docs/design.md §1).
#include <cstdint>
#include <vector>

namespace fusetune {

constexpr int32_t kIgnoreIndex = -100;

struct Batch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> tokens;  // padded with the tokenizer's pad id
  std::vector<int32_t>
      labels;  // kIgnoreIndex on padding, prompts (train_on_input: false), doc ends
  std::vector<int32_t> positions;  // RoPE positions; restart at 0 per packed document
  std::vector<int32_t> doc_ids;    // packed batches: document index per token (attention stays
                                   // inside a document); empty = plain causal attention
  std::vector<int64_t> items;      // the dataset indices the batch was made from (set by the
                                   // loader; a preference batch has one per pair)
  std::vector<int32_t> lengths;    // unpacked rows: each row's real tokens, before its padding
                                   // (a classifier scores the last one; set by collate)
  std::vector<float> margins;      // preference batches: each pair's `margin` column (0 when
                                   // absent; the reward model's loss subtracts it)
  // Preference batches: per row, 1 where its answer is desirable (chosen), 0 where not. Paired
  // batches are B chosen rows then B rejected ones (1s then 0s); unpaired ones (KTO on TRL's
  // prompt / completion / label rows) mix the kinds in any order, each row one example.
  std::vector<uint8_t> desirable;
  bool unpaired = false;
  int64_t num_valid_labels() const {
    int64_t n = 0;
    for (int32_t l : labels) n += l != kIgnoreIndex;
    return n;
  }
};

}  // namespace fusetune
