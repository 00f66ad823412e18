#pragma once
// Runs the reference tokenizer.json implementation (tools/tokenizer-ref/encode.js under Node)
// on the test corpus and reads its answer. Conformance tests skip when Node, the installed
// reference (scripts/prepare_reference_tokenizer.sh) or the assets are missing.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fusetune/tokenizers/hf_tokenizer.h"
#include "test_support.h"

namespace fusetune::testing {

struct ReferenceCase {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded, decoded_skip;
};

inline std::filesystem::path reference_dir() {
  return std::filesystem::path(::fusetune::testing::source_dir()) / "tools" / "tokenizer-ref";
}

inline std::filesystem::path tokenizer_corpus() {
  return std::filesystem::path(::fusetune::testing::test_data_dir()) / "tokenizer_corpus.jsonl";
}

// "" when the reference can run, else why not.
inline std::string reference_unavailable(const std::string& impl) {
  if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
  const char* pkg = impl == "lenml" ? "@lenml/tokenizers" : "tokenizers";
  if (!std::filesystem::exists(reference_dir() / "node_modules" / pkg))
    return std::string("the reference (npm package ") + pkg +
           ") is not installed: run scripts/prepare_reference_tokenizer.sh";
  return "";
}

// Which reference: "hf" (tokenizers, the official Rust library; default) or "lenml"
// (@lenml/tokenizers, JavaScript), from $FUSETUNE_TOKENIZER_REF.
inline std::string reference_impl() {
  const char* env = std::getenv("FUSETUNE_TOKENIZER_REF");
  return env && *env ? env : "hf";
}

// Encodes the corpus with the reference; throws std::runtime_error when the script fails.
inline std::vector<ReferenceCase> run_reference(const std::filesystem::path& tokenizer_json,
                                                const std::filesystem::path& corpus,
                                                const std::filesystem::path& out_dir,
                                                bool add_special_tokens, const std::string& impl) {
  const auto out = out_dir / "expected.json";
  const auto log = out_dir / "node.log";
  std::string cmd =
      "node '" + (reference_dir() / "encode.js").string() + "' --impl " + impl + " --tokenizer '" +
      tokenizer_json.string() + "' --corpus '" + corpus.string() + "' --out '" + out.string() +
      "'" + (add_special_tokens ? " --add-special-tokens" : "") + " >'" + log.string() + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream in(log);
    std::string msg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    throw std::runtime_error("reference failed: " + cmd + "\n" + msg);
  }
  std::ifstream in(out);
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<ReferenceCase> cases;
  for (const auto& r : j.at("results"))
    cases.push_back({r.at("text").get<std::string>(), r.at("ids").get<std::vector<int32_t>>(),
                     r.at("decoded").get<std::string>(), r.at("decoded_skip").get<std::string>()});
  return cases;
}

// The corpus strings, in file order.
inline std::vector<std::string> read_corpus(const std::filesystem::path& corpus) {
  std::vector<std::string> out;
  std::ifstream in(corpus);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) {
      auto v = nlohmann::json::parse(line);
      out.push_back(v.is_string() ? v.get<std::string>() : v.at("text").get<std::string>());
    }
  return out;
}

// The real tokenizer.json files take seconds to load in a debug build: load each once per
// test binary.
inline std::shared_ptr<const HfTokenizer> shared_hf_tokenizer(const std::filesystem::path& path) {
  static std::map<std::string, std::shared_ptr<const HfTokenizer>> cache;
  auto& slot = cache[path.string()];
  if (!slot) slot = HfTokenizer::from_file(path);
  return slot;
}

// A string with its control and non-ASCII bytes escaped, for failure messages.
inline std::string printable(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', true); }

inline std::string ids_str(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

}  // namespace fusetune::testing
