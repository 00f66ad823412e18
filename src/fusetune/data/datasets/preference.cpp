#include "fusetune/data/datasets/preference.h"

#include <cmath>

#include "fusetune/data/chat_format.h"
#include "fusetune/data/datasets/chat.h"
#include "fusetune/data/datasets/common.h"
#include "fusetune/data/datasets/unpaired_preference.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The prompt turns are trained only with train_on_input; the reply (last turn) always.
void mark(std::vector<Message>& messages, bool train_on_input) {
  for (Message& m : messages) m.trained = train_on_input;
  messages.back().trained = true;
}

void check_reply(const std::vector<Message>& messages, const std::string& side) {
  FT_CHECK(messages.back().role == Role::kAssistant,
           "the last turn of '" + side + "' is " + std::string(role_name(messages.back().role)) +
               ", expected the assistant's reply");
}

}  // namespace

PreferenceDataset::PreferenceDataset(std::vector<PreferencePair> pairs, DatasetReport report)
    : pairs_(std::move(pairs)), report_(std::move(report)) {}

PreferenceDataset::PreferenceDataset(std::vector<UnpairedExample> examples, DatasetReport report)
    : unpaired_(true), examples_(std::move(examples)), report_(std::move(report)) {}

const PreferencePair& PreferenceDataset::get(int64_t i) const {
  FT_CHECK(!unpaired_, "preference dataset " + report_.name +
                           " holds unpaired examples (prompt, completion, label), not pairs");
  FT_CHECK(i >= 0 && i < size(), "preference dataset " + report_.name + ": index " +
                                     std::to_string(i) + " out of range [0, " +
                                     std::to_string(size()) + ")");
  return pairs_[i];
}

const UnpairedExample& PreferenceDataset::example(int64_t i) const {
  FT_CHECK(unpaired_, "preference dataset " + report_.name + " holds pairs, not unpaired examples");
  FT_CHECK(i >= 0 && i < size(), "preference dataset " + report_.name + ": index " +
                                     std::to_string(i) + " out of range [0, " +
                                     std::to_string(size()) + ")");
  return examples_[size_t(i)];
}

Batch PreferenceDataset::collate(const std::vector<int64_t>& items,
                                 const CollateOptions& opts) const {
  if (unpaired_) {
    std::vector<const UnpairedExample*> rows;
    rows.reserve(items.size());
    for (int64_t i : items) rows.push_back(&example(i));
    return collate_unpaired(rows, opts);
  }
  std::vector<const PreferencePair*> pairs;
  pairs.reserve(items.size());
  for (int64_t i : items) pairs.push_back(&get(i));
  return collate_preference(pairs, opts);
}

std::unique_ptr<PreferenceDataset> build_preference_dataset(const DatasetOptions& opts,
                                                            const Tokenizer& tok) {
  using namespace datasets;
  if (opts.kind == "unpaired_preference") return build_unpaired_preference_dataset(opts, tok);
  FT_CHECK(!opts.packed, "dataset.packed is not supported for preference (DPO) data");
  const std::string& style = opts.conversation_style;
  FT_CHECK(style == "auto" || style == "openai" || style == "sharegpt",
           "dataset.conversation_style is '" + style + "', expected openai, sharegpt or auto");
  check_column_map(opts, {"chosen", "rejected", "prompt", "conversations", "messages", "margin"},
                   "preference");
  auto format =
      make_chat_format(resolve_chat_format(opts.template_name, opts.model_family, tok), tok);
  const std::string chosen_col = mapped(opts, "chosen"), rejected_col = mapped(opts, "rejected"),
                    prompt_col = mapped(opts, "prompt"), conv_col = mapped(opts, "conversations"),
                    msg_col = mapped(opts, "messages"), margin_col = mapped(opts, "margin");

  auto side = [&](const nlohmann::json& row, const std::string& col) -> std::vector<Message> {
    const nlohmann::json& v = column(row, col);
    std::vector<Message> m;
    if (v.is_array()) {  // a whole conversation
      m = parse_conversation(v, style, opts.train_on_input);
    } else {
      const nlohmann::json* prompt = optional_column(row, conv_col);
      if (!prompt) prompt = optional_column(row, msg_col);
      if (prompt) {
        m = parse_conversation(*prompt, style, opts.train_on_input);
        FT_CHECK(v.is_object(), "column '" + col + "' is " + json_kind(v) +
                                    ", expected one turn object (the prompt is in a list)");
        auto reply = parse_conversation(nlohmann::json::array({v}), style, true);
        m.push_back(reply[0]);
      } else {
        FT_CHECK(v.is_string(), "column '" + col + "' is " + json_kind(v) +
                                    ", expected a string, a turn or a list of turns");
        m = {{Role::kUser, string_column(row, prompt_col), false},
             {Role::kAssistant, v.get<std::string>(), true}};
      }
    }
    check_reply(m, col);
    mark(m, opts.train_on_input);
    apply_system_prompt(m, opts.new_system_prompt, opts.train_on_input);
    return m;
  };

  DatasetReport rep;
  std::vector<PreferencePair> pairs;
  auto records = read_records(opts, /*allow_text=*/false);
  for_each_row(records, opts, rep, [&](const nlohmann::json& row) {
    PreferencePair p{format->render(side(row, chosen_col)),
                     format->render(side(row, rejected_col))};
    // A pair is bad (dataset.on_bad_row) when it carries no preference, or when truncation
    // leaves one side without a reply token to score.
    FT_CHECK(p.chosen.tokens != p.rejected.tokens || p.chosen.labels != p.rejected.labels,
             "the chosen and rejected answers are identical: the pair expresses no preference");
    if (const nlohmann::json* m = optional_column(row, margin_col)) {
      FT_CHECK(m->is_number() && std::isfinite(m->get<double>()),
               "column '" + margin_col + "' is " + json_kind(*m) + ", expected a finite number");
      p.margin = m->get<double>();
    }
    bool cut = truncate_sample(p.chosen, opts.max_seq_len);
    cut = truncate_sample(p.rejected, opts.max_seq_len) || cut;
    rep.truncated += cut;
    for (const auto& [s, name] :
         {std::pair{&p.chosen, "chosen"}, std::pair{&p.rejected, "rejected"}})
      FT_CHECK(count_targets(*s) > 0,
               std::string("the prompt fills max_seq_len (") + std::to_string(opts.max_seq_len) +
                   " tokens): no token of the " + name +
                   " answer is left to score (raise max_seq_len, or on_bad_row: skip)");
    rep.tokens += static_cast<int64_t>(p.chosen.tokens.size() + p.rejected.tokens.size());
    pairs.push_back(std::move(p));
  });
  rep.examples = static_cast<int64_t>(pairs.size());
  check_not_empty(rep, opts);
  return std::make_unique<PreferenceDataset>(std::move(pairs), std::move(rep));
}

Batch collate_preference(const std::vector<const PreferencePair*>& pairs,
                         const CollateOptions& opts) {
  std::vector<const Sample*> rows;
  rows.reserve(pairs.size() * 2);
  for (const PreferencePair* p : pairs) rows.push_back(&p->chosen);
  for (const PreferencePair* p : pairs) rows.push_back(&p->rejected);
  Batch b = fusetune::collate(rows, opts);
  for (const PreferencePair* p : pairs) b.margins.push_back(static_cast<float>(p->margin));
  b.desirable.assign(pairs.size(), 1);
  b.desirable.resize(2 * pairs.size(), 0);
  return b;
}

Batch collate_unpaired(const std::vector<const UnpairedExample*>& examples,
                       const CollateOptions& opts) {
  std::vector<const Sample*> rows;
  rows.reserve(examples.size());
  for (const UnpairedExample* e : examples) rows.push_back(&e->sample);
  Batch b = fusetune::collate(rows, opts);
  for (const UnpairedExample* e : examples) b.desirable.push_back(e->desirable ? 1 : 0);
  b.unpaired = true;
  return b;
}

}  // namespace fusetune
