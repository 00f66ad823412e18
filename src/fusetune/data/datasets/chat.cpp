#include "fusetune/data/datasets/chat.h"

#include "fusetune/data/chat_format.h"
#include "fusetune/data/datasets/common.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::datasets {
namespace {

Role parse_role(const std::string& name, bool sharegpt, size_t turn) {
  if (name == "system") return Role::kSystem;
  if (name == "user" || name == "human") return Role::kUser;
  if (name == "assistant" || name == "gpt") return Role::kAssistant;
  if (name == "tool" || name == "ipython") return Role::kTool;
  std::vector<std::string> known =
      sharegpt ? std::vector<std::string>{"system", "human", "gpt"}
               : std::vector<std::string>{"system", "user", "assistant", "tool"};
  std::string hint = closest_match(name, known);
  throw Error("turn " + std::to_string(turn) + " has " + (sharegpt ? "from" : "role") + " '" +
              name + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; expected one of " + join(known, ", "));
}

std::string content_text(const nlohmann::json& c, size_t turn) {
  if (c.is_string()) return c.get<std::string>();
  FT_CHECK(c.is_array(), "turn " + std::to_string(turn) + " content is " + json_kind(c) +
                             ", expected a string or a list of text parts");
  std::string text;
  for (const auto& part : c) {
    FT_CHECK(part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
                 part["text"].is_string(),
             "turn " + std::to_string(turn) +
                 " content has a part that is not {\"type\": \"text\", \"text\": ...}");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::vector<Message> parse_conversation(const nlohmann::json& turns, const std::string& style,
                                        bool train_on_input) {
  FT_CHECK(turns.is_array(), "conversation is " + json_kind(turns) + ", expected a list of turns");
  FT_CHECK(!turns.empty(), "conversation is empty");
  std::vector<Message> messages;
  for (size_t i = 0; i < turns.size(); ++i) {
    const auto& t = turns[i];
    FT_CHECK(t.is_object(),
             "turn " + std::to_string(i) + " is " + json_kind(t) + ", expected an object");
    bool sharegpt = style == "sharegpt" || (style == "auto" && t.contains("from"));
    const char* role_key = sharegpt ? "from" : "role";
    const char* text_key = sharegpt ? "value" : "content";
    FT_CHECK(t.contains(role_key) && t[role_key].is_string(),
             "turn " + std::to_string(i) + " has no string '" + role_key + "'");
    FT_CHECK(t.contains(text_key), "turn " + std::to_string(i) + " has no '" + text_key + "'");
    Message m;
    m.role = parse_role(t[role_key].get<std::string>(), sharegpt, i);
    m.content = content_text(t[text_key], i);
    m.trained = m.role == Role::kAssistant || train_on_input;
    messages.push_back(std::move(m));
  }
  return messages;
}

std::unique_ptr<SampleDataset> load_chat(const DatasetOptions& opts, const Tokenizer& tok) {
  const std::string& style = opts.conversation_style;
  FT_CHECK(style == "auto" || style == "openai" || style == "sharegpt",
           "dataset.conversation_style is '" + style + "', expected openai, sharegpt or auto");
  check_column_map(opts, {"messages", "conversations"}, "chat");
  auto format =
      make_chat_format(resolve_chat_format(opts.template_name, opts.model_family, tok), tok);
  const std::string messages_col = mapped(opts, "messages"),
                    conversations_col = mapped(opts, "conversations");

  auto convert = [&](const nlohmann::json& row) {
    const nlohmann::json* turns = nullptr;
    if (!opts.column.empty()) {
      turns = &column(row, opts.column);
    } else if (style == "openai") {
      turns = &column(row, messages_col);
    } else if (style == "sharegpt") {
      turns = &column(row, conversations_col);
    } else {
      turns = optional_column(row, messages_col);
      if (!turns) turns = optional_column(row, conversations_col);
      FT_CHECK(turns, "row has neither a '" + messages_col + "' (openai) nor a '" +
                          conversations_col + "' (sharegpt) column");
    }
    std::vector<Message> messages = parse_conversation(*turns, style, opts.train_on_input);
    apply_system_prompt(messages, opts.new_system_prompt, opts.train_on_input);
    return format->render(messages);
  };
  return build_samples(read_records(opts, /*allow_text=*/false), opts, truncation_for(opts),
                       convert);
}

}  // namespace fusetune::datasets
