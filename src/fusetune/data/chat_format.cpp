#include "fusetune/data/chat_format.h"

#include <algorithm>
#include <cctype>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

// Appends segments to a Sample, each fully trained or fully masked.
class Builder {
 public:
  explicit Builder(const Tokenizer& tok) : tok_(tok) {}
  void text(std::string_view s, bool trained) {
    if (s.empty()) return;
    for (int32_t id : tok_.encode(s, /*add_bos=*/false, /*add_eos=*/false)) this->id(id, trained);
  }
  void id(int32_t id, bool trained) {
    s_.tokens.push_back(id);
    s_.labels.push_back(trained ? id : kIgnoreIndex);
  }
  Sample take() { return std::move(s_); }

 private:
  const Tokenizer& tok_;
  Sample s_;
};

void append(Sample& s, const Sample& more) {
  s.tokens.insert(s.tokens.end(), more.tokens.begin(), more.tokens.end());
  s.labels.insert(s.labels.end(), more.labels.begin(), more.labels.end());
}

int32_t require_special(const Tokenizer& tok, std::string_view format, std::string_view token) {
  auto id = tok.token_to_id(token);
  FT_CHECK(id.has_value(), "chat template '" + std::string(format) + "' needs the special token " +
                               std::string(token) +
                               ", which the tokenizer does not have (use the model's own "
                               "tokenizer, or template: plain)");
  return *id;
}

class Llama3Format : public ChatFormat {
 public:
  explicit Llama3Format(const Tokenizer& tok)
      : tok_(tok),
        begin_(require_special(tok, "llama3", "<|begin_of_text|>")),
        start_header_(require_special(tok, "llama3", "<|start_header_id|>")),
        end_header_(require_special(tok, "llama3", "<|end_header_id|>")),
        eot_(require_special(tok, "llama3", "<|eot_id|>")) {}
  std::string_view name() const override { return "llama3"; }
  Sample render(const std::vector<Message>& messages) const override {
    Builder b(tok_);
    b.id(begin_, false);
    for (const Message& m : messages) {
      b.id(start_header_, false);
      b.text(role_name(m.role), false);
      b.id(end_header_, false);
      b.text("\n\n", false);
      b.text(trim(m.content), m.trained);
      b.id(eot_, m.trained);
    }
    return b.take();
  }
  Sample render_prompt(const std::vector<Message>& messages) const override {
    Sample s = render(messages);
    Builder b(tok_);
    b.id(start_header_, false);
    b.text("assistant", false);
    b.id(end_header_, false);
    b.text("\n\n", false);
    append(s, b.take());
    return s;
  }
  std::vector<int32_t> end_of_turn_tokens() const override {
    std::vector<int32_t> ids{eot_};
    if (auto eom = tok_.token_to_id("<|eom_id|>")) ids.push_back(*eom);
    return ids;
  }

 private:
  const Tokenizer& tok_;
  int32_t begin_, start_header_, end_header_, eot_;
};

// ChatML (Qwen): <|im_start|>{role}\n{content}<|im_end|>\n per message. Phi-4 writes the same
// turns with an <|im_sep|> token after the role and no newlines.
class ChatMLFormat : public ChatFormat {
 public:
  ChatMLFormat(const Tokenizer& tok, std::string_view name, bool im_sep)
      : tok_(tok),
        name_(name),
        start_(require_special(tok, name_.c_str(), "<|im_start|>")),
        sep_(im_sep ? require_special(tok, name_.c_str(), "<|im_sep|>") : -1),
        end_(require_special(tok, name_.c_str(), "<|im_end|>")) {}
  std::string_view name() const override { return name_; }
  Sample render(const std::vector<Message>& messages) const override {
    Builder b(tok_);
    for (const Message& m : messages) {
      header(b, m.role == Role::kTool ? "tool" : role_name(m.role));
      b.text(m.content, m.trained);
      b.id(end_, m.trained);
      if (sep_ < 0) b.text("\n", false);
    }
    return b.take();
  }
  Sample render_prompt(const std::vector<Message>& messages) const override {
    Sample s = render(messages);
    Builder b(tok_);
    header(b, "assistant");
    append(s, b.take());
    return s;
  }
  std::vector<int32_t> end_of_turn_tokens() const override { return {end_}; }

 private:
  void header(Builder& b, std::string_view role) const {
    b.id(start_, false);
    if (sep_ < 0) {
      b.text(std::string(role) + "\n", false);
    } else {
      b.text(role, false);
      b.id(sep_, false);
    }
  }
  const Tokenizer& tok_;
  std::string name_;
  int32_t start_, sep_, end_;
};

// Gemma's chat template (transformers' Gemma 3 one; Gemma 1/2 have the same turns): BOS, then
// <start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n per message, roles
// alternating from a user; a leading system message is written ahead of the first user turn's
// content, followed by a blank line.
class GemmaFormat : public ChatFormat {
 public:
  explicit GemmaFormat(const Tokenizer& tok)
      : tok_(tok),
        start_(require_special(tok, "gemma", "<start_of_turn>")),
        end_(require_special(tok, "gemma", "<end_of_turn>")) {}
  std::string_view name() const override { return "gemma"; }
  Sample render(const std::vector<Message>& messages) const override {
    size_t first = 0;
    std::string system;
    bool system_trained = false;
    if (!messages.empty() && messages[0].role == Role::kSystem) {
      system = messages[0].content + "\n\n";
      system_trained = messages[0].trained;
      first = 1;
    }
    Builder b(tok_);
    if (tok_.bos_id() >= 0) b.id(tok_.bos_id(), false);
    for (size_t i = first; i < messages.size(); ++i) {
      const Message& m = messages[i];
      const bool want_user = (i - first) % 2 == 0;
      FT_CHECK(m.role == (want_user ? Role::kUser : Role::kAssistant),
               "chat template 'gemma': conversation roles must alternate user/assistant "
               "(optionally after one system message); message " +
                   std::to_string(i) + " is " + std::string(role_name(m.role)));
      b.id(start_, false);
      b.text(want_user ? "user\n" : "model\n", false);
      if (i == first) b.text(system, system_trained);
      b.text(trim(m.content), m.trained);
      b.id(end_, m.trained);
      b.text("\n", false);
    }
    return b.take();
  }
  Sample render_prompt(const std::vector<Message>& messages) const override {
    Sample s = render(messages);
    Builder b(tok_);
    b.id(start_, false);
    b.text("model\n", false);
    append(s, b.take());
    return s;
  }
  std::vector<int32_t> end_of_turn_tokens() const override { return {end_}; }

 private:
  const Tokenizer& tok_;
  int32_t start_, end_;
};

// Phi-3's chat template: BOS, then <|system|>, <|user|> or <|assistant|>, "\n", the content,
// <|end|> and "\n" per message.
class Phi3Format : public ChatFormat {
 public:
  explicit Phi3Format(const Tokenizer& tok)
      : tok_(tok),
        system_(require_special(tok, "phi3", "<|system|>")),
        user_(require_special(tok, "phi3", "<|user|>")),
        assistant_(require_special(tok, "phi3", "<|assistant|>")),
        end_(require_special(tok, "phi3", "<|end|>")) {}
  std::string_view name() const override { return "phi3"; }
  Sample render(const std::vector<Message>& messages) const override {
    Builder b(tok_);
    if (tok_.bos_id() >= 0) b.id(tok_.bos_id(), false);
    for (size_t i = 0; i < messages.size(); ++i) {
      const Message& m = messages[i];
      FT_CHECK(m.role != Role::kTool, "chat template 'phi3': message " + std::to_string(i) +
                                          " is a tool message, which Phi-3's template has no "
                                          "role for");
      b.id(m.role == Role::kSystem ? system_ : m.role == Role::kUser ? user_ : assistant_, false);
      b.text("\n", false);
      b.text(m.content, m.trained);
      b.id(end_, m.trained);
      b.text("\n", false);
    }
    return b.take();
  }
  Sample render_prompt(const std::vector<Message>& messages) const override {
    Sample s = render(messages);
    Builder b(tok_);
    b.id(assistant_, false);
    b.text("\n", false);
    append(s, b.take());
    return s;
  }
  std::vector<int32_t> end_of_turn_tokens() const override {
    std::vector<int32_t> ids{end_};
    if (tok_.eos_id() >= 0 && tok_.eos_id() != end_) ids.push_back(tok_.eos_id());
    return ids;
  }

 private:
  const Tokenizer& tok_;
  int32_t system_, user_, assistant_, end_;
};

// Llama 2 chat and Mistral instruct: [INST] ... [/INST] around user turns.
class InstFormat : public ChatFormat {
 public:
  InstFormat(const Tokenizer& tok, bool mistral) : tok_(tok), mistral_(mistral) {
    FT_CHECK(tok.bos_id() >= 0 && tok.eos_id() >= 0,
             "chat template '" + std::string(name()) + "' needs a tokenizer with BOS and EOS");
  }
  std::string_view name() const override { return mistral_ ? "mistral" : "llama2"; }
  Sample render(const std::vector<Message>& messages) const override {
    std::string system;
    bool system_trained = false;
    size_t first = 0;
    if (!messages.empty() && messages[0].role == Role::kSystem) {
      system = messages[0].content;
      system_trained = messages[0].trained;
      first = 1;
    }
    Builder b(tok_);
    if (mistral_) b.id(tok_.bos_id(), false);
    for (size_t i = first; i < messages.size(); ++i) {
      const Message& m = messages[i];
      bool want_user = (i - first) % 2 == 0;
      FT_CHECK(m.role == (want_user ? Role::kUser : Role::kAssistant),
               "chat template '" + std::string(name()) +
                   "': conversation roles must alternate user/assistant (optionally after one "
                   "system message); message " +
                   std::to_string(i) + " is " + std::string(role_name(m.role)));
      if (want_user) {
        std::string content = m.content;
        bool trained = m.trained;
        if (i == first && !system.empty()) {
          content = mistral_ ? system + "\n\n" + content
                             : "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
          trained = trained && system_trained;
        }
        if (!mistral_) b.id(tok_.bos_id(), false);
        if (mistral_)
          b.text("[INST] " + content + " [/INST]", trained);
        else
          b.text("[INST] " + trim(content) + " [/INST]", trained);
      } else {
        b.text(mistral_ ? m.content : " " + trim(m.content) + " ", m.trained);
        b.id(tok_.eos_id(), m.trained);
      }
    }
    return b.take();
  }

 private:
  const Tokenizer& tok_;
  bool mistral_;
};

class PlainFormat : public ChatFormat {
 public:
  explicit PlainFormat(const Tokenizer& tok) : tok_(tok) {}
  std::string_view name() const override { return "plain"; }
  Sample render(const std::vector<Message>& messages) const override {
    Builder b(tok_);
    if (tok_.bos_id() >= 0) b.id(tok_.bos_id(), false);
    for (const Message& m : messages) {
      b.text(m.content, m.trained);
      if (m.role == Role::kAssistant && tok_.eos_id() >= 0) b.id(tok_.eos_id(), m.trained);
    }
    return b.take();
  }

 private:
  const Tokenizer& tok_;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::vector<std::string> chat_format_names() {
  return {"llama3", "chatml", "qwen", "llama2", "mistral",
          "gemma",  "phi3",   "phi4", "plain",  "alpaca"};
}

std::string resolve_chat_format(std::string_view template_name, std::string_view model_family,
                                const Tokenizer& tok) {
  std::string t = lower(template_name);
  if (!t.empty() && t != "auto") return t;
  std::string f = lower(model_family);
  f.erase(std::remove_if(f.begin(), f.end(), [](char c) { return c == '-' || c == '_'; }), f.end());
  if (starts_with(f, "llama3")) return "llama3";
  if (starts_with(f, "qwen")) return "chatml";
  if (starts_with(f, "llama2") || starts_with(f, "codellama")) return "llama2";
  if (starts_with(f, "mistral")) return "mistral";
  if (tok.token_to_id("<|start_header_id|>") && tok.token_to_id("<|eot_id|>")) return "llama3";
  // Phi-3 and Phi-4 are both model_type phi3: their tokenizers tell them apart.
  if (tok.token_to_id("<|im_sep|>") && tok.token_to_id("<|im_start|>")) return "phi4";
  if (tok.token_to_id("<|user|>") && tok.token_to_id("<|end|>")) return "phi3";
  if (tok.token_to_id("<|im_start|>") && tok.token_to_id("<|im_end|>")) return "chatml";
  if (tok.token_to_id("<start_of_turn>") && tok.token_to_id("<end_of_turn>")) return "gemma";
  return "plain";
}

std::unique_ptr<ChatFormat> make_chat_format(std::string_view name, const Tokenizer& tok) {
  std::string n = lower(name);
  if (n == "llama3") return std::make_unique<Llama3Format>(tok);
  if (n == "chatml" || n == "qwen") return std::make_unique<ChatMLFormat>(tok, "chatml", false);
  if (n == "llama2") return std::make_unique<InstFormat>(tok, /*mistral=*/false);
  if (n == "mistral") return std::make_unique<InstFormat>(tok, /*mistral=*/true);
  if (n == "gemma") return std::make_unique<GemmaFormat>(tok);
  if (n == "phi3") return std::make_unique<Phi3Format>(tok);
  if (n == "phi4") return std::make_unique<ChatMLFormat>(tok, "phi4", true);
  if (n == "plain" || n == "alpaca") return std::make_unique<PlainFormat>(tok);
  std::string hint = closest_match(n, chat_format_names());
  throw Error("unknown chat template '" + std::string(name) + "'" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") + "; expected one of " +
              join(chat_format_names(), ", ") + ", auto");
}

}  // namespace fusetune
