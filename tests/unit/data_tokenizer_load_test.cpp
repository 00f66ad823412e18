#include <fstream>

#include <gtest/gtest.h>

#include "checks.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "fusetune/tokenizers/hf_tokenizer.h"
#include "fusetune/tokenizers/load_tokenizer.h"
#include "fusetune/tokenizers/sentencepiece_tokenizer.h"
#include "fusetune/util/error.h"
#include "test_support.h"

using fusetune::testing::error_of;

namespace fusetune {
namespace {

const char* kTinyJson =
    R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";

TEST(DataTokenizerLoad, ByteNeedsNoFile) {
  auto tok = load_tokenizer("byte", "");
  ASSERT_NE(dynamic_cast<ByteTokenizer*>(tok.get()), nullptr);
  EXPECT_EQ(tok->encode("A", true, false), (std::vector<int32_t>{ByteTokenizer::kBos, 'A'}));
}

TEST(DataTokenizerLoad, HfFromFileOrDirectoryAndAuto) {
  testing::TempDir dir;
  std::ofstream(dir / "tokenizer.json") << kTinyJson;
  for (const auto& [type, path] : std::vector<std::pair<std::string, std::filesystem::path>>{
           {"hf", dir.path()},
           {"hf", dir / "tokenizer.json"},
           {"auto", dir.path()},
           {"auto", dir / "tokenizer.json"}}) {
    auto tok = load_tokenizer(type, path);
    ASSERT_NE(dynamic_cast<HfTokenizer*>(tok.get()), nullptr) << type << " " << path;
    EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{2}));
  }
}

TEST(DataTokenizerLoad, UnknownTypeSuggestsClosest) {
  std::string msg = error_of([&] { load_tokenizer("hff", ""); });
  EXPECT_NE(msg.find("unknown tokenizer type 'hff'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'hf'"), std::string::npos) << msg;
  msg = error_of([&] { load_tokenizer("sentencepeice", ""); });
  EXPECT_NE(msg.find("did you mean 'sentencepiece'"), std::string::npos) << msg;
  msg = error_of([&] { load_tokenizer("wordpiece-xl-turbo", ""); });
  EXPECT_NE(msg.find("expected one of: auto, byte, hf, llama3, qwen2, qwen2_5, qwen3, sentencepiece"),
            std::string::npos)
      << msg;
}

TEST(DataTokenizerLoad, MissingFilesAreNamed) {
  testing::TempDir dir;
  EXPECT_NE(error_of([&] { load_tokenizer("hf", dir.path()); }).find("needs a tokenizer.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_tokenizer("sentencepiece", dir.path());
            }).find("needs a tokenizer.model"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_tokenizer("auto", dir.path());
            }).find("holds none of tokenizer.json, tokenizer.model"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_tokenizer("auto", dir / "nothing_here");
            }).find("neither a file nor a directory"),
            std::string::npos);
  std::ofstream(dir / "vocab.txt") << "a\nb\n";
  EXPECT_NE(
      error_of([&] { load_tokenizer("auto", dir / "vocab.txt"); }).find("cannot tell the kind"),
      std::string::npos);
}

TEST(DataTokenizerLoad, GarbageSentencePieceModelIsAnError) {
  testing::TempDir dir;
  std::ofstream(dir / "tokenizer.model") << "this is not a protobuf";
  std::string msg = error_of([&] { load_tokenizer("sentencepiece", dir.path()); });
  EXPECT_NE(msg.find("cannot load SentencePiece model"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir / "tokenizer.model").string()), std::string::npos) << msg;
  // An empty file, too.
  std::ofstream(dir / "empty.model").flush();
  EXPECT_NE(error_of([&] { load_tokenizer("auto", dir / "empty.model"); }).find("SentencePiece"),
            std::string::npos);
}

TEST(DataTokenizerLoad, GarbageTokenizerJsonIsAnError) {
  testing::TempDir dir;
  std::ofstream(dir / "tokenizer.json") << "{\"model\": ";
  std::string msg = error_of([&] { load_tokenizer("auto", dir.path()); });
  EXPECT_NE(msg.find("is not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fusetune
