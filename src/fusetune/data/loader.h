#pragma once
// DataLoader: batches over a Dataset, epoch after epoch.
//
// Order: with shuffle, epoch e visits the items in a permutation drawn by a Fisher-Yates
// shuffle driven by std::mt19937_64 seeded with seed + e, with our own unbiased bounded draw
// (std::shuffle and std::uniform_int_distribution differ between standard libraries;
// mt19937_64's output does not), so the order is the same everywhere.
// drop_last (default true, like torchtune): an epoch has floor(n / batch_size) batches and the
// remainder is not seen that epoch (it is, in general, in another); with drop_last false the
// last batch of an epoch is smaller (Batch::batch_size says how big).
// Sharding (data parallelism): with num_shards ranks, a step's global batch is
// batch_size * num_shards consecutive items of the epoch's order, and shard r takes the r-th
// batch_size of them: each item is seen once per epoch across the ranks, in the same global
// order for the same seed whatever the number of ranks (2 ranks x batch b see the items of
// 1 rank x batch 2b). Sharded loaders need drop_last (no rank gets an empty batch).
// Resuming: state() is the position of the batch next() will return; set_state() of a saved
// state continues with exactly that batch, so a resumed run sees the same sequence as an
// uninterrupted one.
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fusetune/data/batch.h"
#include "fusetune/data/collate.h"
#include "fusetune/data/dataset.h"
#include "fusetune/data/datasets/preference.h"

namespace fusetune {

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = true;
  int64_t num_shards = 1;  // data-parallel ranks
  int64_t shard = 0;       // this rank, 0..num_shards-1
  CollateOptions collate;
};

// Uniform integer in [0, bound) from a 64-bit engine, by rejection (no modulo bias).
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound);

// Fisher-Yates permutation of 0..n-1 for a seed; identical on every platform.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed);

class DataLoader {
 public:
  struct State {
    int64_t epoch = 0;
    int64_t index = 0;  // (global) batch index within the epoch, 0..steps_per_epoch()
    bool operator==(const State&) const = default;
  };

  // Keeps a reference to `dataset`, which must outlive the loader. Throws when the dataset has
  // fewer items than one batch with drop_last.
  DataLoader(const Dataset& dataset, LoaderOptions opts);
  // Preference pairs: each batch has 2 x batch_size rows, chosen then rejected
  // (collate_preference); unpaired preference rows (KTO): batch_size rows (collate_unpaired).
  DataLoader(const PreferenceDataset& dataset, LoaderOptions opts);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t epoch() const { return state_.epoch; }
  // The batch at state(), then advances; after the last batch of an epoch, moves to the
  // next epoch (reshuffled).
  Batch next();
  State state() const { return state_; }
  void set_state(State s);
  // Item indices in the order epoch `epoch` visits them.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  const LoaderOptions& options() const { return opts_; }

 private:
  using MakeBatch = std::function<Batch(const std::vector<int64_t>& items)>;
  DataLoader(int64_t num_items, const std::string& what, LoaderOptions opts, MakeBatch make);

  int64_t num_items_;
  MakeBatch make_batch_;
  LoaderOptions opts_;
  int64_t steps_per_epoch_ = 0;
  State state_;
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace fusetune
