#include "fusetune/data/loader.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "fusetune/util/error.h"

namespace fusetune {

uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  // Accept draws >= 2^64 mod bound: what is left is a whole number of copies of [0, bound).
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(idx[i], idx[j]);
  }
  return idx;
}

DataLoader::DataLoader(int64_t num_items, const std::string& what, LoaderOptions opts,
                       MakeBatch make)
    : num_items_(num_items), make_batch_(std::move(make)), opts_(std::move(opts)) {
  FT_CHECK(opts_.batch_size > 0, "batch_size must be > 0, got " + std::to_string(opts_.batch_size));
  FT_CHECK(opts_.num_shards >= 1 && opts_.shard >= 0 && opts_.shard < opts_.num_shards &&
               (opts_.num_shards == 1 || opts_.drop_last),
           "data loader: shard " + std::to_string(opts_.shard) + " of " +
               std::to_string(opts_.num_shards) + " is invalid (sharding needs drop_last)");
  const int64_t global = opts_.batch_size * opts_.num_shards;
  steps_per_epoch_ = opts_.drop_last ? num_items_ / global : (num_items_ + global - 1) / global;
  FT_CHECK(steps_per_epoch_ > 0,
           "dataset " + what + " has " + std::to_string(num_items_) +
               " items, fewer than one batch of " + std::to_string(global) +
               (opts_.num_shards > 1 ? " (batch_size " + std::to_string(opts_.batch_size) + " x " +
                                           std::to_string(opts_.num_shards) + " ranks)"
                                     : std::string()) +
               " (lower batch_size)");
}

DataLoader::DataLoader(const Dataset& dataset, LoaderOptions opts)
    : DataLoader(dataset.size(), dataset.report().name + (dataset.packed() ? " (packed rows)" : ""),
                 opts, [&dataset, collate_opts = opts.collate](const std::vector<int64_t>& items) {
                   std::vector<const Sample*> rows;
                   rows.reserve(items.size());
                   for (int64_t i : items) rows.push_back(&dataset.get(i));
                   return collate(rows, collate_opts);
                 }) {}

DataLoader::DataLoader(const PreferenceDataset& dataset, LoaderOptions opts)
    : DataLoader(dataset.size(),
                 dataset.report().name +
                     (dataset.unpaired() ? " (unpaired preference rows)" : " (preference pairs)"),
                 opts, [&dataset, collate_opts = opts.collate](const std::vector<int64_t>& items) {
                   return dataset.collate(items, collate_opts);
                 }) {}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  if (opts_.shuffle) return shuffled_indices(num_items_, opts_.seed + static_cast<uint64_t>(epoch));
  std::vector<int64_t> idx(num_items_);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  return idx;
}

void DataLoader::set_state(State s) {
  FT_CHECK(s.epoch >= 0 && s.index >= 0 && s.index <= steps_per_epoch_,
           "data loader state (epoch " + std::to_string(s.epoch) + ", batch " +
               std::to_string(s.index) + ") is out of range: an epoch has " +
               std::to_string(steps_per_epoch_) +
               " batches (did the dataset or batch_size change?)");
  state_ = s;
}

Batch DataLoader::next() {
  if (state_.index >= steps_per_epoch_) state_ = {state_.epoch + 1, 0};
  if (order_epoch_ != state_.epoch) {
    order_ = epoch_order(state_.epoch);
    order_epoch_ = state_.epoch;
  }
  const int64_t begin = (state_.index * opts_.num_shards + opts_.shard) * opts_.batch_size;
  const int64_t end = std::min<int64_t>(begin + opts_.batch_size, num_items_);
  std::vector<int64_t> items(order_.begin() + begin, order_.begin() + end);
  Batch b = make_batch_(items);
  b.items = std::move(items);
  if (++state_.index == steps_per_epoch_) state_ = {state_.epoch + 1, 0};
  return b;
}

}  // namespace fusetune
