#include "fusetune/data/datasets/common.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "fusetune/data/split.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune::datasets {

void for_each_row(std::vector<Record>& records, const DatasetOptions& opts, DatasetReport& rep,
                  const std::function<void(const nlohmann::json& row)>& visit) {
  FT_CHECK(opts.on_bad_row == "error" || opts.on_bad_row == "skip",
           "dataset.on_bad_row is '" + opts.on_bad_row + "', expected 'error' or 'skip'");
  const bool skip = opts.on_bad_row == "skip";
  rep.name = std::filesystem::path(opts.source).filename().string();
  // Slice by row position before parsing, so train[:90%] and train[90%:] partition the file's
  // rows whatever is skipped later.
  auto [begin, end] = SplitSpec::parse(opts.split).resolve(static_cast<int64_t>(records.size()));
  rep.rows_read = end - begin;
  for (int64_t i = begin; i < end; ++i) {
    const Record& r = records[i];
    std::string problem = r.error;
    if (problem.empty()) {
      try {
        visit(r.value);
      } catch (const Error& e) {
        problem = e.what();
      } catch (const nlohmann::json::exception& e) {
        problem = e.what();
      }
    }
    if (problem.empty()) continue;
    std::string msg = r.where + ": " + problem;
    if (!skip) throw Error(msg + " (set dataset.on_bad_row=skip to skip bad rows)");
    if (rep.bad_rows_skipped++ == 0) rep.first_bad_row = msg;
  }
}

void check_not_empty(const DatasetReport& rep, const DatasetOptions& opts) {
  if (rep.examples > 0) return;
  std::string why = std::to_string(rep.rows_read) + " rows in split '" + opts.split + "'";
  if (rep.bad_rows_skipped)
    why += ", " + std::to_string(rep.bad_rows_skipped) + " bad rows skipped";
  if (rep.dropped_no_targets)
    why += ", " + std::to_string(rep.dropped_no_targets) +
           " without trained tokens (prompt longer than max_seq_len?)";
  throw Error("dataset " + opts.source + " has no examples after filtering (" + why + ")");
}

std::unique_ptr<SampleDataset> build_samples(std::vector<Record> records,
                                             const DatasetOptions& opts, int64_t truncate_to,
                                             const RowConverter& convert) {
  DatasetReport rep;
  std::vector<Sample> samples;
  for_each_row(records, opts, rep, [&](const nlohmann::json& row) {
    Sample s = convert(row);
    FT_CHECK(s.labels.size() == s.tokens.size(), "internal: labels and tokens differ in length");
    rep.truncated += truncate_sample(s, truncate_to);
    if (count_targets(s) == 0) {
      ++rep.dropped_no_targets;
      return;
    }
    rep.tokens += static_cast<int64_t>(s.tokens.size());
    samples.push_back(std::move(s));
  });
  rep.examples = static_cast<int64_t>(samples.size());
  check_not_empty(rep, opts);
  return std::make_unique<SampleDataset>(std::move(samples), std::move(rep));
}

std::vector<Record> read_records(const DatasetOptions& opts, bool allow_text) {
  FT_CHECK(!opts.source.empty(), "dataset.source is empty: give the path of a .json, .jsonl" +
                                     std::string(allow_text ? " or .txt" : "") + " file");
  std::string ext = std::filesystem::path(opts.source).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == ".json" || ext == ".jsonl") return read_json_records(opts.source);
  if (ext == ".txt") {
    FT_CHECK(allow_text, "dataset " + opts.source + ": dataset kind '" + opts.kind +
                             "' reads .json or .jsonl files, not plain text");
    return read_text_documents(opts.source);
  }
  throw Error("dataset " + opts.source + ": unsupported file type '" + ext +
              "' (expected .json, .jsonl" + (allow_text ? ", .txt" : "") + ")");
}

std::string mapped(const DatasetOptions& opts, const std::string& expected) {
  auto it = opts.column_map.find(expected);
  return it == opts.column_map.end() ? expected : it->second;
}

void check_column_map(const DatasetOptions& opts, const std::vector<std::string>& expected,
                      const std::string& kind) {
  for (const auto& [key, value] : opts.column_map) {
    if (std::find(expected.begin(), expected.end(), key) != expected.end()) continue;
    std::string hint = closest_match(key, expected);
    throw Error("dataset.column_map has key '" + key + "', which a " + kind +
                " dataset does not use" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                "; its columns are " + join(expected, ", "));
  }
}

std::string json_kind(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a float";
    default:
      return "an unsupported value";
  }
}

const nlohmann::json* optional_column(const nlohmann::json& row, const std::string& name) {
  FT_CHECK(row.is_object(), "row is " + json_kind(row) + ", expected a JSON object");
  auto it = row.find(name);
  return it == row.end() ? nullptr : &*it;
}

const nlohmann::json& column(const nlohmann::json& row, const std::string& name) {
  if (const nlohmann::json* v = optional_column(row, name)) return *v;
  std::vector<std::string> keys;
  for (auto it = row.begin(); it != row.end(); ++it) keys.push_back(it.key());
  std::string hint = closest_match(name, keys);
  throw Error(
      "missing column '" + name + "' (columns: " + (keys.empty() ? "none" : join(keys, ", ")) +
      (hint.empty() ? "" : "; did you mean '" + hint + "'? map it with dataset.column_map") + ")");
}

std::string string_column(const nlohmann::json& row, const std::string& name) {
  const nlohmann::json& v = column(row, name);
  FT_CHECK(v.is_string(), "column '" + name + "' is " + json_kind(v) + ", expected a string");
  return v.get<std::string>();
}

bool splits_across_pack(const DatasetOptions& opts) {
  if (opts.split_across_pack) return *opts.split_across_pack;
  return opts.kind == "text_completion" || opts.kind == "pretokenized";
}

int64_t truncation_for(const DatasetOptions& opts) {
  return opts.packed && splits_across_pack(opts) ? 0 : opts.max_seq_len;
}

}  // namespace fusetune::datasets
