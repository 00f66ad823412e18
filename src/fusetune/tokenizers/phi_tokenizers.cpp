#include "fusetune/tokenizers/phi_tokenizers.h"

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// tiktoken's cl100k split regex (torchtune's CL100K_PATTERN): digits in runs of up to three.
const char* const kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

std::vector<SpecialToken> phi3_special_tokens() {
  return {{"<|endoftext|>", 32000},    {"<|assistant|>", 32001},    {"<|placeholder1|>", 32002},
          {"<|placeholder2|>", 32003}, {"<|placeholder3|>", 32004}, {"<|placeholder4|>", 32005},
          {"<|system|>", 32006},       {"<|end|>", 32007},          {"<|placeholder5|>", 32008},
          {"<|placeholder6|>", 32009}, {"<|user|>", 32010}};
}

std::vector<SpecialToken> phi4_special_tokens() {
  std::vector<SpecialToken> t = {
      {"<|dummy_0|>", 100256},    {"<|endoftext|>", 100257},  {"<|fim_prefix|>", 100258},
      {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260}, {"<|dummy_1|>", 100261},
      {"<|dummy_2|>", 100262},    {"<|dummy_3|>", 100263},    {"<|im_start|>", 100264},
      {"<|im_end|>", 100265},     {"<|im_sep|>", 100266}};
  // <|dummy_4|> onwards fill 100267..100351, except 100276 (<|endofprompt|>).
  int dummy = 4;
  for (int32_t id = 100267; id < 100352; ++id)
    t.push_back(id == 100276 ? SpecialToken{"<|endofprompt|>", id}
                             : SpecialToken{"<|dummy_" + std::to_string(dummy++) + "|>", id});
  return t;
}

std::unique_ptr<Phi3MiniTokenizer> Phi3MiniTokenizer::from_file(
    const std::filesystem::path& model) {
  auto sp = SentencePieceTokenizer::from_file(model);
  FT_CHECK(sp->vocab_size() <= kEndOfText,
           "phi3_mini_tokenizer: '" + model.string() + "' has " + std::to_string(sp->vocab_size()) +
               " pieces; Phi-3's added tokens start at id " + std::to_string(kEndOfText) +
               " (Llama 2's tokenizer.model has 32000)");
  return std::unique_ptr<Phi3MiniTokenizer>(new Phi3MiniTokenizer(std::move(sp)));
}

std::vector<int32_t> Phi3MiniTokenizer::encode(std::string_view text, bool add_bos,
                                               bool add_eos) const {
  std::vector<int32_t> ids = sp_->encode(text, add_bos, /*add_eos=*/false);
  if (add_eos) ids.push_back(kEndOfText);
  return ids;
}

std::string Phi3MiniTokenizer::decode(const std::vector<int32_t>& ids,
                                      bool skip_special_tokens) const {
  std::string out;
  std::vector<int32_t> run;
  for (int32_t id : ids) {
    if (id < sp_->vocab_size()) {
      run.push_back(id);
      continue;
    }
    out += sp_->decode(run, skip_special_tokens);
    run.clear();
    for (const SpecialToken& t : added_)
      if (t.id == id && !skip_special_tokens) out += t.content;
  }
  return out + sp_->decode(run, skip_special_tokens);
}

int64_t Phi3MiniTokenizer::vocab_size() const { return added_.back().id + 1; }

std::optional<int32_t> Phi3MiniTokenizer::token_to_id(std::string_view token) const {
  const int32_t id = special_token_id(added_, token);
  if (id >= 0) return id;
  return sp_->token_to_id(token);
}

Qwen2Options phi4_options(Qwen2Options o) {
  o.pattern = kCl100kPattern;
  o.nfc = false;
  o.default_bos = "<|endoftext|>";
  o.default_eos = "<|im_end|>";
  o.default_pad = "<|dummy_85|>";
  o.builtin_specials = phi4_special_tokens();
  o.family_name = "Phi-4";
  return o;
}

std::unique_ptr<HfTokenizer> load_phi4_tokenizer(const std::filesystem::path& vocab_json,
                                                 const std::filesystem::path& merges_txt,
                                                 Qwen2Options options) {
  return load_qwen2_tokenizer(vocab_json, merges_txt, phi4_options(std::move(options)));
}

}  // namespace fusetune
