// The loader's rank sharding (data parallelism): 2 shards x batch b see exactly the items of one
// loader x batch 2b, step by step, each item once per epoch; resuming a shard continues it.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "fusetune/data/loader.h"
#include "fusetune/util/error.h"
#include "sample_datasets.h"

namespace fusetune {
namespace {

LoaderOptions sharded(int64_t bs, int64_t shards, int64_t shard) {
  LoaderOptions o;
  o.batch_size = bs;
  o.seed = 7;
  o.num_shards = shards;
  o.shard = shard;
  o.collate.pad_mode = PadMode::kLongest;
  return o;
}

TEST(DataLoaderShards, TwoShardsOfBSeeTheItemsOfOneLoaderOf2B) {
  const SampleDataset ds =
      testing::numbered_dataset(23);  // 5 global batches of 4, 3 items left over
  DataLoader whole(ds, sharded(4, 1, 0));
  DataLoader r0(ds, sharded(2, 2, 0)), r1(ds, sharded(2, 2, 1));
  EXPECT_EQ(r0.steps_per_epoch(), 5);
  EXPECT_EQ(r1.steps_per_epoch(), 5);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen;
    for (int step = 0; step < 5; ++step) {
      const Batch w = whole.next(), a = r0.next(), b = r1.next();
      std::vector<int64_t> joined = a.items;
      joined.insert(joined.end(), b.items.begin(), b.items.end());
      EXPECT_EQ(joined, w.items) << "epoch " << epoch << " step " << step;
      for (int64_t i : joined) EXPECT_TRUE(seen.insert(i).second) << "item " << i << " twice";
    }
    EXPECT_EQ(seen.size(), 20u);
  }
  // Resuming from a saved (global) position continues the shard's sequence.
  DataLoader again(ds, sharded(2, 2, 1));
  again.set_state({1, 3});
  DataLoader ref(ds, sharded(2, 2, 1));
  ref.set_state({1, 0});
  for (int i = 0; i < 3; ++i) ref.next();
  EXPECT_EQ(again.next().items, ref.next().items);
}

TEST(DataLoaderShards, InvalidShardsAndTooFewItemsAreErrors) {
  const SampleDataset ds = testing::numbered_dataset(5);
  EXPECT_THROW(DataLoader(ds, sharded(2, 2, 2)), Error);
  LoaderOptions keep = sharded(2, 2, 0);
  keep.drop_last = false;
  EXPECT_THROW(DataLoader(ds, keep), Error);
  try {
    DataLoader(ds, sharded(3, 2, 0));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one batch of 6 (batch_size 3 x 2 ranks)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fusetune
