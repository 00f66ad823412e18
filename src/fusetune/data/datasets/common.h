#pragma once
// What every dataset reader shares: split slicing, bad-row policy, truncation, dropping
// samples with nothing to learn, the empty-dataset error, and column access that names the
// row and the column at fault.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fusetune/data/dataset.h"
#include "fusetune/data/dataset_options.h"
#include "fusetune/data/records.h"

namespace fusetune::datasets {

// Converts one row to a sample, or throws fusetune::Error with what is wrong (without the
// location: build_samples prefixes it).
using RowConverter = std::function<Sample(const nlohmann::json& row)>;

// Visits the rows of opts.split in order, calling visit(row). A row that did not parse, or
// whose visit throws fusetune::Error (or a JSON type error), is a bad row: rethrown as
// "<file> line N: <what>" or, with on_bad_row: skip, counted in `report`. Fills
// report.name and report.rows_read.
void for_each_row(std::vector<Record>& records, const DatasetOptions& opts, DatasetReport& report,
                  const std::function<void(const nlohmann::json& row)>& visit);

// Throws "dataset X has no examples after filtering (...)" when report.examples is 0.
void check_not_empty(const DatasetReport& report, const DatasetOptions& opts);

// Applies opts.split to `records`, converts each row, truncates to `truncate_to` tokens
// (0 = never), drops samples without targets. Bad rows throw "<file> line N: <what>" or,
// with on_bad_row: skip, are counted in the report.
std::unique_ptr<SampleDataset> build_samples(std::vector<Record> records,
                                             const DatasetOptions& opts, int64_t truncate_to,
                                             const RowConverter& convert);

// The records of opts.source: JSON/JSON lines by extension; .txt only when allow_text.
std::vector<Record> read_records(const DatasetOptions& opts, bool allow_text);

// The file's name for a column the reader expects (column_map applied).
std::string mapped(const DatasetOptions& opts, const std::string& expected);

// Throws when column_map names a column the reader does not use.
void check_column_map(const DatasetOptions& opts, const std::vector<std::string>& expected,
                      const std::string& kind);

// Column access with errors like "missing column 'output' (columns: ...; did you mean ...)".
const nlohmann::json& column(const nlohmann::json& row, const std::string& name);
const nlohmann::json* optional_column(const nlohmann::json& row, const std::string& name);
std::string string_column(const nlohmann::json& row, const std::string& name);

// "a string", "a number", ... for messages about a value of the wrong type.
std::string json_kind(const nlohmann::json& v);

// Truncation length readers use: none when packing splits samples across rows.
int64_t truncation_for(const DatasetOptions& opts);
bool splits_across_pack(const DatasetOptions& opts);

}  // namespace fusetune::datasets
