#include "fusetune/data/datasets/pretokenized.h"

#include "fusetune/data/datasets/common.h"
#include "fusetune/util/error.h"

namespace fusetune::datasets {
namespace {

std::vector<int32_t> id_list(const nlohmann::json& v, const std::string& name, int64_t vocab,
                             bool allow_ignore) {
  FT_CHECK(v.is_array(), "column '" + name + "' is " + json_kind(v) + ", expected a list of ints");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& x = v[i];
    FT_CHECK(x.is_number_integer(), "column '" + name + "'[" + std::to_string(i) + "] is " +
                                        json_kind(x) + ", expected an integer token id");
    int64_t id = x.get<int64_t>();
    bool ok = (id >= 0 && id < vocab) || (allow_ignore && id == kIgnoreIndex);
    FT_CHECK(ok, "column '" + name + "'[" + std::to_string(i) + "] = " + std::to_string(id) +
                     " is not a token id of this tokenizer (vocab size " + std::to_string(vocab) +
                     (allow_ignore ? "; -100 = ignore" : "") + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

}  // namespace

std::unique_ptr<SampleDataset> load_pretokenized(const DatasetOptions& opts, const Tokenizer& tok) {
  check_column_map(opts, {"input_ids", "labels"}, "pretokenized");
  const std::string ids_col = mapped(opts, "input_ids"), labels_col = mapped(opts, "labels");
  const int64_t vocab = tok.vocab_size();
  auto convert = [&](const nlohmann::json& row) {
    Sample s;
    s.tokens = id_list(column(row, ids_col), ids_col, vocab, false);
    FT_CHECK(!s.tokens.empty(), "column '" + ids_col + "' is empty");
    if (const nlohmann::json* l = optional_column(row, labels_col)) {
      s.labels = id_list(*l, labels_col, vocab, true);
      FT_CHECK(s.labels.size() == s.tokens.size(),
               "column '" + labels_col + "' has " + std::to_string(s.labels.size()) +
                   " entries but '" + ids_col + "' has " + std::to_string(s.tokens.size()) +
                   " (labels are unshifted: one per input id)");
    } else {
      s.labels = s.tokens;
    }
    return s;
  };
  return build_samples(read_records(opts, /*allow_text=*/false), opts, truncation_for(opts),
                       convert);
}

}  // namespace fusetune::datasets
