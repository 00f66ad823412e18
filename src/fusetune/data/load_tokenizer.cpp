#include "fusetune/data/load_tokenizer.h"

#include "fusetune/data/byte_tokenizer.h"
#include "fusetune/data/hf_tokenizer.h"
#include "fusetune/data/sentencepiece_tokenizer.h"
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

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& type, const fs::path& path) {
  static const std::vector<std::string> kTypes = {"auto", "byte", "hf", "sentencepiece"};
  if (type == "byte") return std::make_unique<ByteTokenizer>();
  if (type == "hf") {
    fs::path p = resolve(path, "tokenizer.json");
    FT_CHECK(!p.empty(),
             "tokenizer type 'hf' needs a tokenizer.json file or a directory holding "
             "one; found neither at '" +
                 path.string() + "'");
    return HfTokenizer::from_file(p);
  }
  if (type == "sentencepiece") {
    fs::path p = resolve(path, "tokenizer.model");
    FT_CHECK(!p.empty(),
             "tokenizer type 'sentencepiece' needs a tokenizer.model file or a "
             "directory holding one; found neither at '" +
                 path.string() + "'");
    return SentencePieceTokenizer::from_file(p);
  }
  if (type == "auto") {
    if (fs::is_directory(path)) {
      if (fs::is_regular_file(path / "tokenizer.json"))
        return HfTokenizer::from_file(path / "tokenizer.json");
      if (fs::is_regular_file(path / "tokenizer.model"))
        return SentencePieceTokenizer::from_file(path / "tokenizer.model");
      throw Error("tokenizer type 'auto': directory '" + path.string() +
                  "' holds neither tokenizer.json nor tokenizer.model");
    }
    FT_CHECK(fs::is_regular_file(path),
             "tokenizer type 'auto': '" + path.string() + "' is neither a file nor a directory");
    if (path.extension() == ".json") return HfTokenizer::from_file(path);
    if (path.extension() == ".model") return SentencePieceTokenizer::from_file(path);
    throw Error("tokenizer type 'auto': cannot tell the kind of '" + path.string() +
                "' (expected a .json tokenizer.json or a .model SentencePiece file); set the "
                "type to 'hf' or 'sentencepiece'");
  }
  std::string hint = closest_match(type, kTypes);
  throw Error("unknown tokenizer type '" + type + "'" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; expected one of: " + join(kTypes, ", "));
}

}  // namespace fusetune
