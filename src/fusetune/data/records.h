#pragma once
// Reading dataset files into rows, each remembering where it came from so that an error can
// name the file and the line (JSON lines) or array index (JSON array) at fault.
//   .json   an array of objects, or JSON lines (sniffed: first non-blank character '[' or '{')
//   .jsonl  JSON lines; blank lines are not rows
//   .txt    plain text documents (see read_text_documents)
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fusetune {

struct Record {
  nlohmann::json value;  // the parsed row (a JSON string for text documents)
  std::string where;     // "data.jsonl line 12", "data.json element [5]", "book.txt line 40"
  std::string error;     // non-empty when the row itself did not parse (JSON lines only)
};

// Whole file as bytes; throws fusetune::Error naming the path when it cannot be read.
std::string read_file_bytes(const std::string& path);

// Rows of a .json / .jsonl file. A JSON array that does not parse fails as a whole (with the
// line and column); a bad JSON line becomes a Record with `error` set, so that
// on_bad_row: skip can skip just that line.
std::vector<Record> read_json_records(const std::string& path);

// Marker between documents of a .txt corpus (the convention of GPT-2 / TinyStories dumps).
inline constexpr const char* kEndOfTextMarker = "<|endoftext|>";

// Documents of a .txt file: when the file contains kEndOfTextMarker anywhere, documents are
// the text between markers; otherwise they are paragraphs separated by one or more blank
// (whitespace-only) lines. Each document is trimmed of surrounding whitespace; empty ones are
// dropped. `where` names the document's first line.
std::vector<Record> read_text_documents(const std::string& path);

}  // namespace fusetune
