#pragma once
// Chat/prompt formats: how a list of messages becomes tokens and (unshifted) labels.
//
//   llama3  <|begin_of_text|>  then per message
//           <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
//   chatml  (Qwen) per message  <|im_start|>{role}\n{content}<|im_end|>\n      (no BOS)
//   llama2  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>
//           <s>[INST] {user} [/INST] {assistant} </s> ...    (Hugging Face's template; roles
//           must alternate user/assistant; <s> and </s> are the tokenizer's BOS/EOS ids)
//   mistral <s>[INST] {user} [/INST]{assistant}</s>[INST] ... (system text is put before the
//           first user message, separated by a blank line)
//   gemma   <bos> then per message <start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n
//           (roles alternate; system text goes before the first user message + a blank line)
//   plain   (alias alpaca) BOS, then the messages' contents back to back, EOS after each
//           assistant message. For records whose prompt already carries its own format
//           (Alpaca, text); chat data should use the model's own template.
//
// Masking: a trained message contributes its content and its end-of-turn token (<|eot_id|>,
// <|im_end|>, </s>) as targets; headers, role names, BOS and the newline after <|im_end|> are
// never targets, because at inference the prompt supplies them.
// Special tokens are looked up with Tokenizer::token_to_id when the format is made, so a
// tokenizer that lacks one fails at once with the token's name. Text segments are encoded one
// by one without BOS/EOS (as torchtune does), so that segment boundaries are mask boundaries.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fusetune/data/message.h"
#include "fusetune/data/sample.h"
#include "fusetune/tokenizers/tokenizer.h"

namespace fusetune {

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  virtual std::string_view name() const = 0;
  // Tokens and unshifted labels (token id when trained, kIgnoreIndex otherwise).
  virtual Sample render(const std::vector<Message>& messages) const = 0;
  // A prompt for generation: the messages, then what opens the assistant's answer (llama3 its
  // header, chatml "<|im_start|>assistant\n"; llama2/mistral end at [/INST]; plain: nothing).
  virtual Sample render_prompt(const std::vector<Message>& messages) const {
    return render(messages);
  }
  // The tokens that end an assistant turn (generation stops at them besides EOS).
  virtual std::vector<int32_t> end_of_turn_tokens() const { return {}; }
};

// The template names accepted by make_chat_format (besides "auto").
std::vector<std::string> chat_format_names();

// The template to use: `template_name` unless it is empty or "auto"; then by model family
// (llama3* -> llama3, qwen* -> chatml, llama2*/codellama -> llama2, mistral* -> mistral);
// then by the tokenizer's special tokens (<|start_header_id|> -> llama3, <|im_start|> ->
// chatml, <start_of_turn> -> gemma); else plain (e.g. the byte tokenizer).
std::string resolve_chat_format(std::string_view template_name, std::string_view model_family,
                                const Tokenizer& tok);

// Throws fusetune::Error for an unknown name (with a "did you mean") or a tokenizer that lacks
// the format's special tokens. The format keeps a reference to `tok`.
std::unique_ptr<ChatFormat> make_chat_format(std::string_view name, const Tokenizer& tok);

}  // namespace fusetune
