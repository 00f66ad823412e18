// The project's own demo corpus (configs/demo/demo_corpus.txt) loads as the embedded demo
// uses it: byte tokenizer, text completion, packed.
#include <gtest/gtest.h>

#include "fusetune/data/dataset_factory.h"
#include "fusetune/data/loader.h"
#include "fusetune/tokenizers/byte_tokenizer.h"
#include "test_paths.h"

namespace fusetune {
namespace {

TEST(DataDemoCorpus, LoadsAsStoriesAndPacks) {
  ByteTokenizer tok;
  DatasetOptions o;
  o.source = std::string(::fusetune::testing::source_dir()) + "/configs/demo/demo_corpus.txt";
  auto ds = build_dataset(o, tok);
  EXPECT_EQ(ds->size(), 34);  // stories separated by <|endoftext|>
  int64_t bytes = 0;
  for (int64_t i = 0; i < ds->size(); ++i) {
    const Sample& s = ds->get(i);
    for (int32_t id : s.tokens)
      ASSERT_TRUE(id < 128 || id == ByteTokenizer::kBos || id == ByteTokenizer::kEos);
    bytes += static_cast<int64_t>(s.tokens.size()) - 2;
  }
  EXPECT_GT(bytes, 20000);  // 20-40 KB of text
  EXPECT_LT(bytes, 40000);

  o.packed = true;
  o.max_seq_len = 128;
  auto packed = build_dataset(o, tok);
  EXPECT_EQ(packed->size(), (ds->report().tokens + 127) / 128);
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.collate.pad_id = tok.pad_id();
  DataLoader loader(*packed, lo);
  Batch b = loader.next();
  EXPECT_EQ(b.batch_size, 8);
  EXPECT_EQ(b.seq_len, 128);
}

}  // namespace
}  // namespace fusetune
