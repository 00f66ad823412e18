#include "fusetune/data/dataset_factory.h"

#include "fusetune/data/datasets/chat.h"
#include "fusetune/data/datasets/common.h"
#include "fusetune/data/datasets/instruct.h"
#include "fusetune/data/datasets/pretokenized.h"
#include "fusetune/data/datasets/prompts.h"
#include "fusetune/data/datasets/text_completion.h"
#include "fusetune/data/packing.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

std::vector<std::string> dataset_kinds() {
  return {"text_completion", "pretokenized", "alpaca", "instruct", "chat", "gsm8k"};
}

std::unique_ptr<Dataset> build_dataset(const DatasetOptions& opts, const Tokenizer& tok) {
  FT_CHECK(opts.max_seq_len >= 0, "dataset max_seq_len must be >= 0 (0 = no limit), got " +
                                      std::to_string(opts.max_seq_len));
  std::unique_ptr<SampleDataset> samples;
  if (opts.kind == "text_completion") {
    samples = datasets::load_text_completion(opts, tok);
  } else if (opts.kind == "pretokenized") {
    samples = datasets::load_pretokenized(opts, tok);
  } else if (opts.kind == "alpaca" || opts.kind == "instruct") {
    samples = datasets::load_instruct(opts, tok);
  } else if (opts.kind == "chat") {
    samples = datasets::load_chat(opts, tok);
  } else if (opts.kind == "gsm8k") {
    FT_CHECK(!opts.packed,
             "dataset kind gsm8k holds prompts to generate from: they are not packed");
    return datasets::load_prompts(
        opts, tok,
        opts.prompt_template.empty() ? datasets::kDefaultReasoningPrompt : opts.prompt_template);
  } else if (opts.kind == "preference" || opts.kind == "unpaired_preference") {
    throw Error("dataset kind '" + opts.kind +
                "' holds preference data: build it with build_preference_dataset "
                "(the DPO recipe does)");
  } else {
    std::string hint = closest_match(opts.kind, dataset_kinds());
    throw Error("unknown dataset kind '" + opts.kind + "'" +
                (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; expected one of " +
                join(dataset_kinds(), ", "));
  }
  if (!opts.packed) return samples;
  return std::make_unique<PackedDataset>(*samples, opts.max_seq_len, tok.pad_id(),
                                         datasets::splits_across_pack(opts));
}

}  // namespace fusetune
