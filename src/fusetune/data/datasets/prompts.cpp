#include "fusetune/data/datasets/prompts.h"

#include <regex>

#include "fusetune/data/datasets/common.h"
#include "fusetune/util/error.h"

namespace fusetune::datasets {

const char* const kDefaultReasoningPrompt =
    "Solve the problem below. Reason step by step inside <think></think>, then give the result "
    "inside <answer></answer>, its last line '#### ' followed by the number alone.\n"
    "Problem: {question}\nSolution: ";

PromptDataset::PromptDataset(std::vector<Sample> samples, std::vector<PromptRow> rows,
                             DatasetReport report)
    : samples_(std::move(samples)), rows_(std::move(rows)), report_(std::move(report)) {}

const Sample& PromptDataset::get(int64_t i) const {
  FT_CHECK(i >= 0 && i < size(), "prompt index " + std::to_string(i) + " out of range");
  return samples_[size_t(i)];
}

const PromptRow& PromptDataset::row(int64_t i) const {
  FT_CHECK(i >= 0 && i < size(), "prompt index " + std::to_string(i) + " out of range");
  return rows_[size_t(i)];
}

std::string split_with_partition(const std::string& split, const std::string& partition) {
  if (partition.empty()) return split;
  std::smatch m;
  static const std::regex kForm(R"(^\s*(\d+)(?:-(\d+))?/(\d+)\s*$)");
  FT_CHECK(std::regex_match(partition, m, kForm),
           "dataset.partition is '" + partition + "': expected 'a-b/n' or 'a/n' (parts a..b of n)");
  const int64_t a = std::stoll(m[1]), b = m[2].matched ? std::stoll(m[2]) : a, n = std::stoll(m[3]);
  FT_CHECK(n >= 1 && a <= b && b < n,
           "dataset.partition is '" + partition + "': the parts must satisfy 0 <= a <= b < n");
  FT_CHECK(split.find('[') == std::string::npos,
           "dataset.partition cannot be combined with a sliced split ('" + split +
               "'): give one of them");
  return split + "[" + std::to_string(100 * a / n) + "%:" + std::to_string(100 * (b + 1) / n) +
         "%]";
}

namespace {

std::string column_text(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

std::unique_ptr<PromptDataset> load_prompts(const DatasetOptions& options, const Tokenizer& tok,
                                            const std::string& prompt_template) {
  DatasetOptions opts = options;
  opts.split = split_with_partition(options.split, options.partition);
  check_column_map(opts, {"question", "answer"}, opts.kind);
  const size_t at = prompt_template.find("{question}");
  FT_CHECK(at != std::string::npos, "dataset.prompt_template must contain {question}");
  const std::string question_col = mapped(opts, "question"), answer_col = mapped(opts, "answer");
  std::vector<Record> records = read_records(opts, /*allow_text=*/true);
  DatasetReport rep;
  std::vector<Sample> samples;
  std::vector<PromptRow> rows;
  for_each_row(records, opts, rep, [&](const nlohmann::json& row) {
    PromptRow p;
    // A .txt document is the question itself.
    const std::string question =
        row.is_string() ? row.get<std::string>() : string_column(row, question_col);
    p.text = prompt_template.substr(0, at) + question + prompt_template.substr(at + 10);
    for (auto it = row.begin(); row.is_object() && it != row.end(); ++it)
      if (it.key() != question_col)
        p.columns[it.key() == answer_col ? "answer" : it.key()] = column_text(it.value());
    Sample s;
    s.tokens = tok.encode(p.text, tok.default_add_bos(), false);
    s.labels.assign(s.tokens.size(), kIgnoreIndex);
    // As torchtune's tokenizers do: a prompt longer than max_seq_len keeps its beginning.
    if (truncate_sample(s, opts.max_seq_len)) {
      ++rep.truncated;
      p.text = tok.decode(s.tokens, /*skip_special_tokens=*/true);
    }
    rep.tokens += int64_t(s.tokens.size());
    samples.push_back(std::move(s));
    rows.push_back(std::move(p));
  });
  rep.examples = int64_t(samples.size());
  check_not_empty(rep, opts);
  return std::make_unique<PromptDataset>(std::move(samples), std::move(rows), std::move(rep));
}

}  // namespace fusetune::datasets
