#pragma once
// torchtune's dataset builders (`torchtune.datasets.alpaca_cleaned_dataset`, ...), one table:
// the Hugging Face Hub dataset each reads by default (torchtune's default `source`), the
// fusetune dataset kind that reads the same rows, and the columns and options the builder
// applies. fusetune does not download: a builder named without a local `source` is an Error
// naming the Hub dataset and the key to set; with a local file the builder's columns apply
// as in torchtune.
#include <string>
#include <utility>
#include <vector>

#include "fusetune/config/config.h"

namespace fusetune {

struct DatasetBuilder {
  std::string name;        // "alpaca_cleaned_dataset" (torchtune.datasets.<name>)
  std::string hub_source;  // "yahma/alpaca-cleaned"; "" for the generic builders
  std::string kind;        // fusetune's dataset component: alpaca | instruct | chat | ...
  // Expected column -> the Hub dataset's column (torchtune's default column_map).
  std::vector<std::pair<std::string, std::string>> column_map;
  // Other dataset keys the builder fixes, set when the config leaves them out.
  std::vector<std::pair<std::string, std::string>> options;
  std::string rows;  // what a row holds, for messages and the README
};

// Every builder, in the README's order.
const std::vector<DatasetBuilder>& dataset_builders();
// The builder for "torchtune.datasets.X" or "X"; nullptr when `component` is none of them.
const DatasetBuilder* find_dataset_builder(const std::string& component);

// The formats a local `source` may have, for messages ("a .json file (an array of rows or
// JSON lines), .jsonl, or .txt for text datasets; Parquet and CSV are not read").
std::string supported_dataset_formats();

// True for a `source` that names a Hub dataset ("owner/name", no file extension) and is not a
// file or directory here.
bool looks_like_hub_dataset(const std::string& source);

// Applies the builder of `section` ("dataset", "dataset_val") when its `_component_` is one of
// the table's: a Hub builder without `source` (or any builder whose source is a Hub name) is
// an Error naming the Hub dataset, `<section>.source=/path/to/local/copy.json` and the formats;
// otherwise `_component_` becomes the fusetune kind and the builder's column_map and options
// are filled in where the config does not set them. Sections that are absent, not maps, or
// of another component are left alone.
void apply_dataset_builder(Config& cfg, const std::string& section);
// Both sections.
void apply_dataset_builders(Config& cfg);

}  // namespace fusetune
