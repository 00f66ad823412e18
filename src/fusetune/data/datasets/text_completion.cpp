#include "fusetune/data/datasets/text_completion.h"

#include "fusetune/data/datasets/common.h"
#include "fusetune/util/error.h"

namespace fusetune::datasets {

std::unique_ptr<SampleDataset> load_text_completion(const DatasetOptions& opts,
                                                    const Tokenizer& tok) {
  check_column_map(opts, {"text"}, "text_completion");
  const std::string col = opts.column.empty() ? mapped(opts, "text") : opts.column;
  auto convert = [&](const nlohmann::json& row) {
    // .txt documents arrive as bare strings; JSON rows carry the text in a column.
    std::string text = row.is_string() ? row.get<std::string>() : string_column(row, col);
    Sample s;
    if (tok.bos_id() >= 0) s.tokens.push_back(tok.bos_id());
    auto body = tok.encode(text, /*add_bos=*/false, /*add_eos=*/false);
    s.tokens.insert(s.tokens.end(), body.begin(), body.end());
    if (opts.add_eos && tok.eos_id() >= 0) s.tokens.push_back(tok.eos_id());
    s.labels = s.tokens;
    return s;
  };
  return build_samples(read_records(opts, /*allow_text=*/true), opts, truncation_for(opts),
                       convert);
}

}  // namespace fusetune::datasets
