#include "fusetune/data/multiple_choice.h"

#include <cctype>
#include <regex>

#include "fusetune/data/records.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using nlohmann::json;

std::string capitalize(const std::string& s) {  // Python's str.capitalize() on ASCII
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(out[i]);
    out[i] = char(i == 0 ? std::toupper(c) : std::tolower(c));
  }
  return out;
}

std::string string_at(const json& row, const char* key, const std::string& where) {
  FT_CHECK(row.contains(key) && row[key].is_string(), where + ": '" + key + "' must be a string");
  return row[key].get<std::string>();
}

std::vector<std::string> strings_at(const json& v, const std::string& what,
                                    const std::string& where) {
  FT_CHECK(v.is_array() && v.size() >= 2, where + ": '" + what + "' must list at least 2 choices");
  std::vector<std::string> out;
  for (const auto& c : v) {
    FT_CHECK(c.is_string(), where + ": '" + what + "' must hold strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

int index_at(const json& v, size_t n, const std::string& what, const std::string& where) {
  int i = -1;
  if (v.is_number_integer()) i = v.get<int>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) i = std::stoi(s);
  }
  FT_CHECK(i >= 0 && size_t(i) < n, where + ": '" + what + "' must be a choice index below " +
                                        std::to_string(n) + ", got " + v.dump());
  return i;
}

MultipleChoiceQuestion parse_row(const json& row, const std::string& where) {
  FT_CHECK(row.is_object(), where + ": a task row must be a JSON object");
  MultipleChoiceQuestion q;
  q.where = where;
  if (row.contains("endings")) {  // HellaSwag
    std::string ctx = row.contains("ctx_a") ? string_at(row, "ctx_a", where) + " " +
                                                  capitalize(string_at(row, "ctx_b", where))
                                            : string_at(row, "ctx", where);
    const std::string label = row.contains("activity_label")
                                  ? string_at(row, "activity_label", where) + ": "
                                  : std::string();
    q.context = hellaswag_preprocess(label + ctx);
    for (const auto& e : strings_at(row["endings"], "endings", where))
      q.choices.push_back(hellaswag_preprocess(e));
    FT_CHECK(row.contains("label"), where + ": HellaSwag rows need 'label'");
    q.gold = index_at(row["label"], q.choices.size(), "label", where);
  } else if (row.contains("answerKey")) {  // ARC
    q.context = "Question: " + string_at(row, "question", where) + "\nAnswer:";
    FT_CHECK(row.contains("choices") && row["choices"].is_object(),
             where + ": ARC rows need 'choices' {text, label}");
    const json& c = row["choices"];
    FT_CHECK(c.contains("text") && c.contains("label"), where + ": 'choices' needs text and label");
    q.choices = strings_at(c["text"], "choices.text", where);
    const std::vector<std::string> labels = strings_at(c["label"], "choices.label", where);
    FT_CHECK(labels.size() == q.choices.size(),
             where + ": choices.text and choices.label differ in length");
    const std::string key = string_at(row, "answerKey", where);
    q.gold = -1;
    for (size_t i = 0; i < labels.size(); ++i)
      if (labels[i] == key) q.gold = int(i);
    FT_CHECK(q.gold >= 0, where + ": answerKey '" + key + "' is not among choices.label");
  } else {  // generic
    FT_CHECK(row.contains("choices") && row.contains("gold") &&
                 (row.contains("context") || row.contains("query")),
             where +
                 ": a task row needs {context, choices, gold}, or HellaSwag's (ctx_a, ctx_b, "
                 "endings, label) or ARC's (question, choices, answerKey) fields");
    q.context = string_at(row, row.contains("context") ? "context" : "query", where);
    q.choices = strings_at(row["choices"], "choices", where);
    q.gold = index_at(row["gold"], q.choices.size(), "gold", where);
  }
  return q;
}

}  // namespace

std::string hellaswag_preprocess(const std::string& text) {
  std::string t = trim(text);
  for (size_t at = 0; (at = t.find(" [title]", at)) != std::string::npos; at += 2)
    t.replace(at, 8, ". ");
  static const std::regex bracketed("\\[.*?\\]");
  t = std::regex_replace(t, bracketed, "");
  // Python's str.replace: one pass over non-overlapping occurrences ("    " -> "  ").
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    out += t[i];
    if (t[i] == ' ' && i + 1 < t.size() && t[i + 1] == ' ') ++i;
  }
  return out;
}

std::vector<MultipleChoiceQuestion> load_multiple_choice(const std::string& path) {
  std::vector<MultipleChoiceQuestion> out;
  for (const Record& r : read_json_records(path)) {
    FT_CHECK(r.error.empty(), r.where + ": " + r.error);
    out.push_back(parse_row(r.value, r.where));
  }
  FT_CHECK(!out.empty(), path + ": the task has no questions");
  return out;
}

}  // namespace fusetune
