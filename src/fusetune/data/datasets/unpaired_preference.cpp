#include "fusetune/data/datasets/unpaired_preference.h"

#include "fusetune/data/chat_format.h"
#include "fusetune/data/datasets/chat.h"
#include "fusetune/data/datasets/common.h"
#include "fusetune/data/sample.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

using datasets::json_kind;

// The prompt's turns: a string is one user turn.
std::vector<Message> prompt_turns(const nlohmann::json& v, const std::string& col,
                                  const std::string& style, bool train_on_input) {
  if (v.is_string()) return {{Role::kUser, v.get<std::string>(), train_on_input}};
  FT_CHECK(v.is_array(),
           "column '" + col + "' is " + json_kind(v) + ", expected a string or a list of turns");
  return datasets::parse_conversation(v, style, train_on_input);
}

// The completion's turns, all trained on: a string is the assistant's reply.
std::vector<Message> completion_turns(const nlohmann::json& v, const std::string& col,
                                      const std::string& style) {
  std::vector<Message> m;
  if (v.is_string()) {
    m = {{Role::kAssistant, v.get<std::string>(), true}};
  } else {
    FT_CHECK(v.is_array() && !v.empty(), "column '" + col + "' is " + json_kind(v) +
                                             ", expected a string or a non-empty list of turns");
    m = datasets::parse_conversation(v, style, true);
  }
  FT_CHECK(m.back().role == Role::kAssistant, "the last turn of '" + col + "' is " +
                                                  std::string(role_name(m.back().role)) +
                                                  ", expected the assistant's reply");
  for (Message& t : m) t.trained = true;
  return m;
}

}  // namespace

std::unique_ptr<PreferenceDataset> build_unpaired_preference_dataset(const DatasetOptions& opts,
                                                                     const Tokenizer& tok) {
  using namespace datasets;
  FT_CHECK(!opts.packed, "dataset.packed is not supported for unpaired preference (KTO) data");
  const std::string& style = opts.conversation_style;
  FT_CHECK(style == "auto" || style == "openai" || style == "sharegpt",
           "dataset.conversation_style is '" + style + "', expected openai, sharegpt or auto");
  check_column_map(opts, {"prompt", "completion", "label"}, "unpaired_preference");
  auto format =
      make_chat_format(resolve_chat_format(opts.template_name, opts.model_family, tok), tok);
  const std::string prompt_col = mapped(opts, "prompt"),
                    completion_col = mapped(opts, "completion"), label_col = mapped(opts, "label");
  DatasetReport rep;
  std::vector<UnpairedExample> examples;
  auto records = read_records(opts, /*allow_text=*/false);
  for_each_row(records, opts, rep, [&](const nlohmann::json& row) {
    const nlohmann::json& label = column(row, label_col);
    FT_CHECK(label.is_boolean(), "column '" + label_col + "' is " + json_kind(label) +
                                     ", expected true (a desirable completion) or false");
    std::vector<Message> m =
        prompt_turns(column(row, prompt_col), prompt_col, style, opts.train_on_input);
    for (Message& t : completion_turns(column(row, completion_col), completion_col, style))
      m.push_back(std::move(t));
    apply_system_prompt(m, opts.new_system_prompt, opts.train_on_input);
    UnpairedExample e{format->render(m), label.get<bool>()};
    rep.truncated += truncate_sample(e.sample, opts.max_seq_len);
    FT_CHECK(count_targets(e.sample) > 0,
             "the prompt fills max_seq_len (" + std::to_string(opts.max_seq_len) +
                 " tokens): no token of the completion is left to score (raise max_seq_len, or "
                 "on_bad_row: skip)");
    rep.tokens += static_cast<int64_t>(e.sample.tokens.size());
    examples.push_back(std::move(e));
  });
  rep.examples = static_cast<int64_t>(examples.size());
  check_not_empty(rep, opts);
  return std::make_unique<PreferenceDataset>(std::move(examples), std::move(rep));
}

}  // namespace fusetune
