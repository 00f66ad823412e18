#include "fusetune/tokenizers/load_tokenizer.h"

#include "fusetune/tokenizers/byte_tokenizer.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/phi_tokenizers.h"
#include "fusetune/tokenizers/qwen2_tokenizer.h"
#include "fusetune/tokenizers/sentencepiece_tokenizer.h"
#include "fusetune/tokenizers/tiktoken_tokenizer.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fs = std::filesystem;

namespace fusetune {
namespace {

// `path` itself when it is a file, else `path / name` when that exists, else "".
fs::path resolve(const fs::path& path, const char* name) {
  if (fs::is_regular_file(path)) return path;
  if (fs::is_directory(path) && fs::is_regular_file(path / name)) return path / name;
  return {};
}

bool has_qwen_options(const TokenizerSpec& s) {
  return s.bos_token || s.eos_token || s.pad_token || s.unk_token;
}

// A tokenizer.json for a type that also reads other formats: the keys of those formats have
// no meaning with it.
std::unique_ptr<Tokenizer> hf_file(const TokenizerSpec& s, const fs::path& p) {
  FT_CHECK(s.special_tokens_path.empty(),
           "tokenizer special_tokens_path '" + s.special_tokens_path.string() + "' is set, but '" +
               p.string() +
               "' is a tokenizer.json, which holds its own added tokens; remove "
               "special_tokens_path or point path at the " +
               (s.type == "llama3" ? "tiktoken original/tokenizer.model" : "vocab.json"));
  FT_CHECK(s.merges_file.empty(), "tokenizer merges_file '" + s.merges_file.string() +
                                      "' is set, but '" + p.string() +
                                      "' is a tokenizer.json, which holds its own merges; remove "
                                      "merges_file or point path at vocab.json");
  FT_CHECK(!has_qwen_options(s),
           "tokenizer bos_token/eos_token/pad_token/unk_token apply to a vocab.json + merges.txt "
           "tokenizer; '" +
               p.string() +
               "' is a tokenizer.json, whose tokenizer_config.json "
               "names those tokens");
  return HfTokenizer::from_file(p);
}

bool is_tokenizer_json(const fs::path& p) { return p.filename() == "tokenizer.json"; }

std::unique_ptr<Tokenizer> load_llama3(const TokenizerSpec& s) {
  FT_CHECK(s.merges_file.empty(),
           "tokenizer merges_file is not a key of Llama 3's tokenizer "
           "(its tiktoken tokenizer.model holds the ranks)");
  FT_CHECK(!has_qwen_options(s),
           "tokenizer bos_token/eos_token/pad_token/unk_token are not keys "
           "of Llama 3's tokenizer (its special tokens fix them)");
  fs::path p = s.path;
  if (fs::is_directory(p)) {
    if (fs::is_regular_file(p / "tokenizer.json") && s.special_tokens_path.empty())
      return hf_file(s, p / "tokenizer.json");
    if (fs::is_regular_file(p / "original" / "tokenizer.model"))
      p = p / "original" / "tokenizer.model";
    else if (fs::is_regular_file(p / "tokenizer.model"))
      p = p / "tokenizer.model";
    else
      throw Error("tokenizer type 'llama3': directory '" + s.path.string() +
                  "' holds neither tokenizer.json nor (original/)tokenizer.model");
  }
  FT_CHECK(fs::is_regular_file(p),
           "tokenizer type 'llama3' needs Llama 3's tiktoken "
           "tokenizer.model (or its tokenizer.json); found nothing at '" +
               p.string() + "'");
  if (p.extension() == ".json") return hf_file(s, p);
  FT_CHECK(looks_like_tiktoken(p),
           "tokenizer type 'llama3': '" + p.string() +
               "' is not a tiktoken file (lines of '<base64 token> <rank>'); Llama 3's is "
               "original/tokenizer.model. A SentencePiece tokenizer.model (Llama 2, Mistral) "
               "loads with torchtune.models.llama2.llama2_tokenizer / sentencepiece");
  return load_llama3_tiktoken(p, s.special_tokens_path);
}

std::unique_ptr<Tokenizer> load_qwen(const TokenizerSpec& s) {
  const QwenVersion version = s.type == "qwen2"   ? QwenVersion::Qwen2
                              : s.type == "qwen3" ? QwenVersion::Qwen3
                                                  : QwenVersion::Qwen2_5;
  fs::path vocab = s.path, merges = s.merges_file;
  if (fs::is_directory(vocab)) {
    if (merges.empty() && fs::is_regular_file(vocab / "tokenizer.json") &&
        s.special_tokens_path.empty() && !has_qwen_options(s))
      return hf_file(s, vocab / "tokenizer.json");
    if (merges.empty() && fs::is_regular_file(vocab / "merges.txt")) merges = vocab / "merges.txt";
    vocab = vocab / "vocab.json";
  }
  FT_CHECK(fs::is_regular_file(vocab), "tokenizer type '" + s.type +
                                           "' needs vocab.json (with merges_file) or "
                                           "tokenizer.json; found nothing at '" +
                                           vocab.string() + "'");
  if (is_tokenizer_json(vocab)) return hf_file(s, vocab);
  FT_CHECK(!merges.empty(), "tokenizer type '" + s.type + "' with path '" + vocab.string() +
                                "' needs merges_file (the merges.txt beside vocab.json), as "
                                "torchtune's " +
                                s.type + "_tokenizer does");
  Qwen2Options o;
  o.version = version;
  o.special_tokens_path = s.special_tokens_path;
  o.bos_token = s.bos_token;
  o.eos_token = s.eos_token;
  o.pad_token = s.pad_token;
  o.unk_token = s.unk_token;
  return load_qwen2_tokenizer(vocab, merges, o);
}

std::unique_ptr<Tokenizer> load_model_file(const TokenizerSpec& s, const fs::path& p) {
  if (looks_like_tiktoken(p)) {
    TokenizerSpec l = s;
    l.type = "llama3";
    l.path = p;
    return load_llama3(l);
  }
  return SentencePieceTokenizer::from_file(p);
}

}  // namespace

const std::vector<std::string>& tokenizer_types() {
  static const std::vector<std::string> kTypes = {"auto",      "byte",    "hf",    "llama3",
                                                  "qwen2",     "qwen2_5", "qwen3", "sentencepiece",
                                                  "phi3_mini", "phi4"};
  return kTypes;
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerSpec& s) {
  const std::string& type = s.type;
  const fs::path& path = s.path;
  if (type == "byte") return std::make_unique<ByteTokenizer>();
  if (type == "hf") {
    fs::path p = resolve(path, "tokenizer.json");
    FT_CHECK(!p.empty(),
             "tokenizer type 'hf' needs a tokenizer.json file or a directory holding "
             "one; found neither at '" +
                 path.string() + "'");
    return hf_file(s, p);
  }
  if (type == "sentencepiece") {
    fs::path p = resolve(path, "tokenizer.model");
    FT_CHECK(!p.empty(),
             "tokenizer type 'sentencepiece' needs a tokenizer.model file or a "
             "directory holding one; found neither at '" +
                 path.string() + "'");
    FT_CHECK(!looks_like_tiktoken(p),
             "tokenizer type 'sentencepiece': '" + p.string() +
                 "' is a tiktoken file (Llama 3's original/tokenizer.model); load it with "
                 "torchtune.models.llama3.llama3_tokenizer / llama3");
    return SentencePieceTokenizer::from_file(p);
  }
  if (type == "phi3_mini") {
    fs::path p = resolve(path, "tokenizer.model");
    FT_CHECK(!p.empty(),
             "tokenizer type 'phi3_mini' needs a tokenizer.model file or a directory "
             "holding one; found neither at '" +
                 path.string() + "'");
    return Phi3MiniTokenizer::from_file(p);
  }
  if (type == "phi4") {
    FT_CHECK(
        !s.merges_file.empty() && fs::is_regular_file(path) && fs::is_regular_file(s.merges_file),
        "tokenizer type 'phi4' needs vocab_path (vocab.json) and merges_path (merges.txt); "
        "found '" +
            path.string() + "' and '" + s.merges_file.string() + "'");
    Qwen2Options o;
    o.special_tokens_path = s.special_tokens_path;
    o.bos_token = s.bos_token;
    o.eos_token = s.eos_token;
    o.pad_token = s.pad_token;
    return load_phi4_tokenizer(path, s.merges_file, o);
  }
  if (type == "llama3") return load_llama3(s);
  if (type == "qwen2" || type == "qwen2_5" || type == "qwen3") return load_qwen(s);
  if (type == "auto") {
    if (fs::is_directory(path)) {
      if (fs::is_regular_file(path / "tokenizer.json")) return hf_file(s, path / "tokenizer.json");
      if (fs::is_regular_file(path / "tokenizer.model"))
        return load_model_file(s, path / "tokenizer.model");
      if (fs::is_regular_file(path / "vocab.json") && fs::is_regular_file(path / "merges.txt")) {
        TokenizerSpec q = s;
        q.type = "qwen2_5";
        return load_qwen(q);
      }
      if (fs::is_regular_file(path / "original" / "tokenizer.model"))
        return load_model_file(s, path / "original" / "tokenizer.model");
      throw Error("tokenizer type 'auto': directory '" + path.string() +
                  "' holds none of tokenizer.json, tokenizer.model, vocab.json + merges.txt, "
                  "original/tokenizer.model");
    }
    FT_CHECK(fs::is_regular_file(path),
             "tokenizer type 'auto': '" + path.string() + "' is neither a file nor a directory");
    if (path.extension() == ".json") {
      if (path.filename() == "vocab.json" || !s.merges_file.empty()) {
        TokenizerSpec q = s;
        q.type = "qwen2_5";
        if (q.merges_file.empty() && fs::is_regular_file(path.parent_path() / "merges.txt"))
          q.merges_file = path.parent_path() / "merges.txt";
        return load_qwen(q);
      }
      return hf_file(s, path);
    }
    if (path.extension() == ".model") return load_model_file(s, path);
    throw Error("tokenizer type 'auto': cannot tell the kind of '" + path.string() +
                "' (expected a .json tokenizer.json or vocab.json, or a .model tiktoken or "
                "SentencePiece file); set the type");
  }
  std::string hint = closest_match(type, tokenizer_types());
  throw Error("unknown tokenizer type '" + type + "'" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; expected one of: " + join(tokenizer_types(), ", "));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type, const fs::path& path) {
  TokenizerSpec s;
  s.type = type;
  s.path = path;
  return load_tokenizer(s);
}

}  // namespace fusetune
