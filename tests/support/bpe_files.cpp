#include "bpe_files.h"

#include <fstream>
#include <string>

namespace fusetune::testing {

nlohmann::json write_vocab_and_merges(const std::filesystem::path& tokenizer_json,
                                      const std::filesystem::path& dir) {
  nlohmann::json j;
  {
    std::ifstream in(tokenizer_json);
    j = nlohmann::json::parse(in);
  }
  std::ofstream(dir / "vocab.json") << j["model"]["vocab"].dump();
  std::ofstream m(dir / "merges.txt");
  m << "#version: 0.2\n";
  for (const auto& e : j["model"]["merges"])  // "a b", or ["a", "b"] in newer files
    m << (e.is_string() ? e.get<std::string>()
                        : e[0].get<std::string>() + " " + e[1].get<std::string>())
      << "\n";
  return j;
}

}  // namespace fusetune::testing
