#include "fusetune/data/records.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

// 1-based line and column of a byte offset, for parse errors.
std::string line_col(const std::string& text, size_t byte) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + " column " + std::to_string(col);
}

bool is_blank(std::string_view s) {
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::string read_file_bytes(const std::string& path) {
  std::error_code ec;
  FT_CHECK(!std::filesystem::is_directory(path, ec),
           "dataset file '" + path + "' is a directory, expected a .json, .jsonl or .txt file");
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "cannot open dataset file '" + path + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  FT_CHECK(!in.bad(), "error reading dataset file '" + path + "'");
  return ss.str();
}

std::vector<Record> read_json_records(const std::string& path) {
  const std::string text = read_file_bytes(path);
  size_t first = 0;
  while (first < text.size() && std::isspace(static_cast<unsigned char>(text[first]))) ++first;
  std::vector<Record> rows;
  if (first == text.size()) return rows;  // empty file: the caller reports "no examples"

  if (text[first] == '[') {
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(path + ": invalid JSON at " + line_col(text, e.byte > 0 ? e.byte - 1 : 0) +
                  " (expected an array of records): " + e.what());
    } catch (const nlohmann::json::exception& e) {  // a number out of double's range
      throw Error(path + ": invalid JSON (expected an array of records): " + e.what());
    }
    rows.reserve(doc.size());
    for (size_t i = 0; i < doc.size(); ++i)
      rows.push_back({std::move(doc[i]), path + " element [" + std::to_string(i) + "]", ""});
    return rows;
  }

  // JSON lines.
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    if (is_blank(line)) return;
    Record r;
    r.where = path + " line " + std::to_string(line_no);
    try {
      r.value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // A pretty-printed single object is a common mistake: say so instead of "line 1".
      if (line_no == 1 && nlohmann::json::accept(text))
        throw Error(path +
                    " holds a single JSON value spanning lines; expected an array of "
                    "records or one JSON object per line (JSON lines)");
      r.error = std::string("invalid JSON: ") + e.what();
    } catch (const nlohmann::json::exception& e) {  // a number out of double's range
      r.error = std::string("invalid JSON: ") + e.what();
    }
    rows.push_back(std::move(r));
  });
  return rows;
}

std::vector<Record> read_text_documents(const std::string& path) {
  const std::string text = read_file_bytes(path);
  std::vector<Record> docs;
  auto emit = [&](std::string_view body, size_t start_line) {
    std::string t = trim(body);
    if (!t.empty())
      docs.push_back(
          {nlohmann::json(std::move(t)), path + " line " + std::to_string(start_line), ""});
  };
  // The line number of every byte offset we cut at is needed only for `where`.
  auto line_of = [&](size_t byte, size_t from, size_t line) {
    for (size_t i = from; i < byte && i < text.size(); ++i) line += text[i] == '\n';
    return line;
  };

  const std::string marker = kEndOfTextMarker;
  if (text.find(marker) != std::string::npos) {
    size_t pos = 0, line = 1;
    while (pos <= text.size()) {
      size_t end = text.find(marker, pos);
      if (end == std::string::npos) end = text.size();
      // Report the line of the first non-blank character of the document.
      size_t body = pos;
      while (body < end && std::isspace(static_cast<unsigned char>(text[body]))) ++body;
      size_t start_line = line_of(body, pos, line);
      emit(std::string_view(text).substr(pos, end - pos), start_line);
      line = line_of(end, pos, line);
      pos = end + marker.size();
    }
    return docs;
  }

  // Paragraph mode: blank lines separate documents.
  size_t pos = 0, line_no = 0, doc_start = 0, doc_line = 0;
  bool in_doc = false;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    bool blank = is_blank(std::string_view(text).substr(pos, end - pos));
    if (!blank && !in_doc) {
      in_doc = true;
      doc_start = pos;
      doc_line = line_no;
    } else if (blank && in_doc) {
      emit(std::string_view(text).substr(doc_start, pos - doc_start), doc_line);
      in_doc = false;
    }
    if (end == text.size()) break;
    pos = end + 1;
  }
  if (in_doc) emit(std::string_view(text).substr(doc_start), doc_line);
  return docs;
}

}  // namespace fusetune
