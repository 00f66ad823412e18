#include "fusetune/tokenizers/hf_normalizer.h"

#include <vector>

#include "fusetune/tokenizers/regex.h"
#include "fusetune/tokenizers/unicode_normalize.h"
#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using hf_json::Json;
using hf_json::Where;

class UnicodeForm : public HfNormalizer {
 public:
  explicit UnicodeForm(unicode::NormalForm f) : form_(f) {}
  void normalize(std::string& t) const override { t = unicode::normalize(t, form_); }

 private:
  unicode::NormalForm form_;
};

class Lowercase : public HfNormalizer {
 public:
  void normalize(std::string& t) const override { t = unicode::to_lower(t); }
};

class Prepend : public HfNormalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& t) const override {
    if (!t.empty()) t = prepend_ + t;  // tokenizers leaves an empty string empty
  }

 private:
  std::string prepend_;
};

// Replace every match of a literal string or a regex with `content`.
class Replace : public HfNormalizer {
 public:
  Replace(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& t) const override {
    replace_matches(t, literal_, re_.get(), content_);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class Strip : public HfNormalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& t) const override {
    size_t b = 0, e = t.size();
    while (left_ && b < e) {
      size_t i = b;
      if (!unicode::is_whitespace(utf8::next(t, i))) break;
      b = i;
    }
    while (right_ && e > b) {
      size_t s;
      if (!unicode::is_whitespace(utf8::prev(t, e, s))) break;
      e = s;
    }
    t = t.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class StripAccents : public HfNormalizer {
 public:
  void normalize(std::string& t) const override {
    std::string out;
    size_t i = 0;
    while (i < t.size()) {
      char32_t cp = utf8::next(t, i);
      if (!unicode::is_combining_mark(cp)) utf8::append(out, cp);
    }
    t = std::move(out);
  }
};

class Sequence : public HfNormalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<HfNormalizer>> items) : items_(std::move(items)) {}
  void normalize(std::string& t) const override {
    for (const auto& n : items_) n->normalize(t);
  }

 private:
  std::vector<std::unique_ptr<HfNormalizer>> items_;
};

}  // namespace

// Reads a {"String": s} or {"Regex": r} pattern; exactly one of literal / regex is set.
std::unique_ptr<Regex> read_hf_pattern(const Json& j, const Where& w, std::string& literal) {
  FT_CHECK(j.is_object(), w.str() + " must be {\"String\": ...} or {\"Regex\": ...}");
  if (j.contains("Regex")) {
    return std::make_unique<Regex>(hf_json::require_string(j, "Regex", w), w.str());
  }
  literal = hf_json::require_string(j, "String", w);
  return nullptr;
}

std::unique_ptr<HfNormalizer> make_hf_normalizer(const Json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = hf_json::require_string(j, "type", w);
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Prepend") return std::make_unique<Prepend>(hf_json::require_string(j, "prepend", w));
  if (type == "Strip")
    return std::make_unique<Strip>(hf_json::get_bool(j, "strip_left", true, w),
                                   hf_json::get_bool(j, "strip_right", true, w));
  if (type == "Replace") {
    std::string literal;
    auto re = read_hf_pattern(hf_json::require(j, "pattern", w), w / "pattern", literal);
    return std::make_unique<Replace>(literal, std::move(re),
                                     hf_json::require_string(j, "content", w));
  }
  if (type == "Sequence") {
    const Json& arr = hf_json::require_array(j, "normalizers", w);
    std::vector<std::unique_ptr<HfNormalizer>> items;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto n = make_hf_normalizer(arr[i], (w / "normalizers").at(i));
      if (n) items.push_back(std::move(n));
    }
    return std::make_unique<Sequence>(std::move(items));
  }
  static const std::vector<std::string> kKnown = {"NFC",          "NFD",     "NFKC",    "NFKD",
                                                  "Lowercase",    "Prepend", "Replace", "Strip",
                                                  "StripAccents", "Sequence"};
  std::string hint = closest_match(type, kKnown);
  throw Error(w.str() + ": normalizer type '" + type + "' is not supported" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; supported: " + join(kKnown, ", "));
}

}  // namespace fusetune
