// The data layer on the real datasets in ../shared/assets (skipped when absent), with the
// byte tokenizer so that decoded tokens are the exact text.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/data/dataset_factory.h"
#include "fusetune/data/datasets/preference.h"
#include "fusetune/data/loader.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "test_support.h"

namespace fusetune {
namespace {

using fusetune::testing::assets_dir;

std::string asset(const std::string& rel) { return (assets_dir() / rel).string(); }

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string decode_targets(const Tokenizer& tok, const Sample& s) {
  std::vector<int32_t> t;
  for (int32_t l : s.labels)
    if (l != kIgnoreIndex) t.push_back(l);
  return tok.decode(t, /*skip_special_tokens=*/true);
}

TEST(DataAssets, AlpacaTinyMatchesTheTextColumn) {
  FT_REQUIRE_ASSET("datasets/alpaca_tiny.json");
  ByteTokenizer tok;
  DatasetOptions o;
  o.kind = "alpaca";
  o.source = asset("datasets/alpaca_tiny.json");
  auto ds = build_dataset(o, tok);
  auto rows = load_json(o.source);
  ASSERT_EQ(ds->size(), 100);
  ASSERT_EQ(rows.size(), 100u);
  for (int64_t i = 0; i < ds->size(); ++i) {
    const Sample& s = ds->get(i);
    // The file's own "text" column is the Alpaca prompt + output, as Stanford wrote it: our
    // prompt template must reproduce it byte for byte (46 rows with input, 54 without).
    EXPECT_EQ(tok.decode(s.tokens, true), rows[i]["text"].get<std::string>()) << "row " << i;
    EXPECT_EQ(decode_targets(tok, s), rows[i]["output"].get<std::string>()) << "row " << i;
    EXPECT_EQ(s.tokens.front(), ByteTokenizer::kBos);
    EXPECT_EQ(s.tokens.back(), ByteTokenizer::kEos);
    EXPECT_EQ(s.labels.back(), ByteTokenizer::kEos);
  }
}

TEST(DataAssets, AlpacaEnDemoSplitsAndPacks) {
  FT_REQUIRE_ASSET("datasets/alpaca_en_demo.json");
  ByteTokenizer tok;
  DatasetOptions o;
  o.kind = "alpaca";
  o.source = asset("datasets/alpaca_en_demo.json");
  o.max_seq_len = 512;
  auto all = build_dataset(o, tok);
  EXPECT_EQ(all->report().rows_read, 999);
  o.split = "train[:90%]";
  auto head = build_dataset(o, tok);
  o.split = "train[90%:]";
  auto tail = build_dataset(o, tok);
  EXPECT_EQ(head->report().rows_read, 899);  // round(0.9 * 999) = 899
  EXPECT_EQ(tail->report().rows_read, 100);
  EXPECT_EQ(head->size() + tail->size(), all->size());
  for (int64_t i = 0; i < all->size(); ++i) EXPECT_LE(all->get(i).tokens.size(), 512u);

  o.split = "train";
  o.packed = true;
  auto packed = build_dataset(o, tok);
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.seed = 1;
  lo.collate.pad_id = tok.pad_id();
  DataLoader loader(*packed, lo);
  Batch b = loader.next();
  EXPECT_EQ(b.seq_len, 512);
  EXPECT_EQ(b.doc_ids.size(), b.tokens.size());
  for (size_t i = 0; i + 1 < b.tokens.size(); ++i) {
    if (b.labels[i] != kIgnoreIndex) {
      EXPECT_EQ(b.labels[i], b.tokens[i + 1]);
      EXPECT_EQ(b.doc_ids[i], b.doc_ids[i + 1]);
    }
  }
}

TEST(DataAssets, DpoEnDemoParsesAsPreferencePairs) {
  FT_REQUIRE_ASSET("datasets/dpo_en_demo.json");
  ByteTokenizer tok;
  DatasetOptions o;
  o.kind = "preference";
  o.source = asset("datasets/dpo_en_demo.json");
  auto ds = build_preference_dataset(o, tok);
  auto rows = load_json(o.source);
  ASSERT_EQ(ds->size(), 300);
  for (int64_t i = 0; i < ds->size(); ++i) {
    EXPECT_EQ(decode_targets(tok, ds->get(i).chosen),
              rows[i]["chosen"]["value"].get<std::string>());
    EXPECT_EQ(decode_targets(tok, ds->get(i).rejected),
              rows[i]["rejected"]["value"].get<std::string>());
  }
}

TEST(DataAssets, OtherPreferenceLayouts) {
  FT_REQUIRE_ASSET("datasets/hh_rlhf_tiny.json");
  FT_REQUIRE_ASSET("datasets/stack_exchange_paired_tiny.json");
  ByteTokenizer tok;
  DatasetOptions o;
  o.kind = "preference";
  o.source = asset("datasets/hh_rlhf_tiny.json");
  auto hh = build_preference_dataset(o, tok);
  ASSERT_EQ(hh->size(), 1);
  EXPECT_EQ(decode_targets(tok, hh->get(0).chosen), "Fix the hole.");
  EXPECT_EQ(decode_targets(tok, hh->get(0).rejected), "Take them off.");
  o.source = asset("datasets/stack_exchange_paired_tiny.json");
  o.column_map = {{"prompt", "question"}, {"chosen", "response_j"}, {"rejected", "response_k"}};
  auto se = build_preference_dataset(o, tok);
  EXPECT_EQ(se->size(), 25);
}

TEST(DataAssets, TinyStoriesTextCompletion) {
  FT_REQUIRE_ASSET("datasets/tinystories_197k.txt");
  FT_REQUIRE_ASSET("datasets/tinystories_sample.txt");
  ByteTokenizer tok;
  DatasetOptions o;
  o.source = asset("datasets/tinystories_197k.txt");
  auto ds = build_dataset(o, tok);
  // No <|endoftext|> markers: documents are the blank-line separated paragraphs. Counted
  // independently in Python: 1230 paragraphs, 197291 bytes + BOS/EOS.
  EXPECT_EQ(ds->size(), 1230);
  EXPECT_EQ(ds->report().tokens, 197291);
  o.packed = true;
  o.max_seq_len = 256;
  auto packed = build_dataset(o, tok);
  EXPECT_EQ(packed->size(), 771);  // ceil(197291 / 256): split across rows, nothing lost
  EXPECT_EQ(packed->report().truncated, 0);

  o.packed = false;
  o.source = asset("datasets/tinystories_sample.txt");
  auto sample = build_dataset(o, tok);
  EXPECT_EQ(sample->size(), 5);  // separated by <|endoftext|>
  EXPECT_EQ(tok.decode(sample->get(0).tokens, true).rfind("Once upon a time", 0), 0u);
}

}  // namespace
}  // namespace fusetune
