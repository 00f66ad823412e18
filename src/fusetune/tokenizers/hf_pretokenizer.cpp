#include "fusetune/tokenizers/hf_pretokenizer.h"

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/hf_normalizer.h"
#include "fusetune/tokenizers/regex.h"
#include "fusetune/tokenizers/unicode_normalize.h"
#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using hf_json::Json;
using hf_json::Where;

// What happens to the delimiter matches when splitting (tokenizers' SplitDelimiterBehavior).
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Span {
  size_t begin, end;
  bool match;
};

// Applies a behavior to spans that tile a string, as NormalizedString::split does.
void apply_behavior(std::vector<Span>& spans, Behavior bh) {
  std::vector<Span> out;
  out.reserve(spans.size());
  switch (bh) {
    case Behavior::Isolated:
      return;
    case Behavior::Removed:
      for (const Span& s : spans)
        if (!s.match) out.push_back(s);
      break;
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match && !prev_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        prev_match = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.match && !prev_match && !out.empty())
          out.back().begin = s.begin;
        else
          out.push_back({s.begin, s.end, false});
        prev_match = s.match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.match == prev_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        prev_match = s.match;
      }
      break;
    }
  }
  spans = std::move(out);
}

// Splits every piece at the spans `find` reports, keeping at_start on the first sub-piece.
template <typename Find>
void split_pieces(std::vector<PreToken>& pieces, Behavior bh, bool invert, Find&& find) {
  // Scratch buffers reused across calls (split_pieces never nests).
  thread_local std::vector<PreToken> out;
  thread_local std::vector<Span> spans;
  out.clear();
  for (PreToken& p : pieces) {
    spans.clear();
    size_t prev = 0;
    find(p.text, [&](size_t b, size_t e) {
      if (b > prev) spans.push_back({prev, b, invert});
      spans.push_back({b, e, !invert});
      prev = e;
    });
    if (prev < p.text.size()) spans.push_back({prev, p.text.size(), invert});
    apply_behavior(spans, bh);
    for (const Span& s : spans) {
      if (s.end <= s.begin) continue;
      out.push_back({p.text.substr(s.begin, s.end - s.begin), p.at_start && s.begin == 0});
    }
  }
  pieces.swap(out);
}

Behavior parse_behavior(const std::string& s, const Where& w) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  throw Error(w.str() + ": unknown split behavior '" + s +
              "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
}

class Split : public HfPreTokenizer {
 public:
  Split(std::unique_ptr<Regex> re, std::string literal, Behavior bh, bool invert)
      : re_(std::move(re)), literal_(std::move(literal)), bh_(bh), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, bh_, invert_, [&](const std::string& t, auto&& on_match) {
      if (re_) {
        re_->find_all(t, on_match);
      } else if (!literal_.empty()) {
        for (size_t p = t.find(literal_); p != std::string::npos;
             p = t.find(literal_, p + literal_.size()))
          on_match(p, p + literal_.size());
      }
    });
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string literal_;
  Behavior bh_;
  bool invert_;
};

// GPT-2's split pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public HfPreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) re_ = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel pre-tokenizer");
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_)
      for (PreToken& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(p.text.begin(), ' ');
    if (re_)
      split_pieces(pieces, Behavior::Isolated, false,
                   [&](const std::string& t, auto&& on_match) { re_->find_all(t, on_match); });
    std::string mapped;
    for (PreToken& p : pieces) {
      mapped.clear();
      byte_level::encode(p.text, mapped);
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class Metaspace : public HfPreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(std::string replacement, Prepend scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (PreToken& p : pieces) {
      std::string out;
      for (char c : p.text) {
        if (c == ' ')
          out += rep_;
        else
          out.push_back(c);
      }
      bool starts = out.compare(0, rep_.size(), rep_) == 0;
      if (!starts && (scheme_ == Prepend::Always || (scheme_ == Prepend::First && p.at_start)))
        out = rep_ + out;
      p.text = std::move(out);
    }
    if (split_)
      split_pieces(
          pieces, Behavior::MergedWithNext, false, [&](const std::string& t, auto&& on_match) {
            for (size_t q = t.find(rep_); q != std::string::npos; q = t.find(rep_, q + rep_.size()))
              on_match(q, q + rep_.size());
          });
  }

 private:
  std::string rep_;
  Prepend scheme_;
  bool split_;
};

// Whitespace: \w+|[^\w\s]+ ; WhitespaceSplit: runs of non-whitespace; Digits: runs of digits
// (or each digit alone) isolated from the rest.
class RegexKeep : public HfPreTokenizer {
 public:
  RegexKeep(const char* pattern, Behavior bh, bool invert, const char* what)
      : re_(pattern, what), bh_(bh), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, bh_, invert_,
                 [&](const std::string& t, auto&& on_match) { re_.find_all(t, on_match); });
  }

 private:
  Regex re_;
  Behavior bh_;
  bool invert_;
};

class WhitespaceSplit : public HfPreTokenizer {
 public:
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    split_pieces(pieces, Behavior::Removed, false, [&](const std::string& t, auto&& on_match) {
      size_t i = 0;
      while (i < t.size()) {
        size_t b = i;
        char32_t cp = utf8::next(t, i);
        if (!unicode::is_whitespace(cp)) continue;
        size_t e = i;
        while (e < t.size()) {
          size_t k = e;
          if (!unicode::is_whitespace(utf8::next(t, k))) break;
          e = k;
        }
        on_match(b, e);
        i = e;
      }
    });
  }
};

class Sequence : public HfPreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<HfPreTokenizer>> items)
      : items_(std::move(items)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& p : items_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<HfPreTokenizer>> items_;
};

}  // namespace

std::unique_ptr<HfPreTokenizer> make_hf_pre_tokenizer(const Json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = hf_json::require_string(j, "type", w);
  if (type == "Split") {
    std::string literal;
    auto re = read_hf_pattern(hf_json::require(j, "pattern", w), w / "pattern", literal);
    return std::make_unique<Split>(
        std::move(re), literal,
        parse_behavior(hf_json::require_string(j, "behavior", w), w / "behavior"),
        hf_json::get_bool(j, "invert", false, w));
  }
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(hf_json::get_bool(j, "add_prefix_space", true, w),
                                       hf_json::get_bool(j, "use_regex", true, w));
  if (type == "Metaspace") {
    std::string rep = hf_json::get_string(j, "replacement", "\xE2\x96\x81", w);
    FT_CHECK(!rep.empty(), (w / "replacement").str() + " must not be empty");
    Metaspace::Prepend scheme = hf_json::get_bool(j, "add_prefix_space", true, w)
                                    ? Metaspace::Prepend::Always
                                    : Metaspace::Prepend::Never;
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      std::string s = hf_json::get_string(j, "prepend_scheme", "always", w);
      if (s == "always")
        scheme = Metaspace::Prepend::Always;
      else if (s == "first")
        scheme = Metaspace::Prepend::First;
      else if (s == "never")
        scheme = Metaspace::Prepend::Never;
      else
        throw Error((w / "prepend_scheme").str() + ": unknown value '" + s +
                    "' (expected always, first or never)");
    }
    return std::make_unique<Metaspace>(rep, scheme, hf_json::get_bool(j, "split", true, w));
  }
  if (type == "Whitespace")
    return std::make_unique<RegexKeep>(R"(\w+|[^\w\s]+)", Behavior::Removed, true,
                                       "Whitespace pre-tokenizer");
  if (type == "WhitespaceSplit") return std::make_unique<WhitespaceSplit>();
  if (type == "Digits") {
    bool individual = hf_json::get_bool(j, "individual_digits", false, w);
    return std::make_unique<RegexKeep>(individual ? R"(\p{N})" : R"(\p{N}+)", Behavior::Isolated,
                                       false, "Digits pre-tokenizer");
  }
  if (type == "Sequence") {
    const Json& arr = hf_json::require_array(j, "pretokenizers", w);
    std::vector<std::unique_ptr<HfPreTokenizer>> items;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto p = make_hf_pre_tokenizer(arr[i], (w / "pretokenizers").at(i));
      if (p) items.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(items));
  }
  static const std::vector<std::string> kKnown = {
      "Split", "ByteLevel", "Metaspace", "Whitespace", "WhitespaceSplit", "Digits", "Sequence"};
  std::string hint = closest_match(type, kKnown);
  throw Error(w.str() + ": pre_tokenizer type '" + type + "' is not supported" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; supported: " + join(kKnown, ", "));
}

}  // namespace fusetune
