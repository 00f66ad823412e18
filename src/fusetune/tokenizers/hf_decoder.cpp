#include "fusetune/tokenizers/hf_decoder.h"

#include "fusetune/tokenizers/byte_level.h"
#include "fusetune/tokenizers/hf_normalizer.h"
#include "fusetune/tokenizers/regex.h"
#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

using hf_json::Json;
using hf_json::Where;

// Byte-level characters back to bytes; a token with a character outside the alphabet (an
// added token, say) contributes its own UTF-8 bytes. The bytes become one lossy UTF-8 string.
class ByteLevel : public HfDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t mark = bytes.size(), i = 0;
      bool ok = true;
      while (i < t.size()) {
        int b = byte_level::decode_char(utf8::next(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(char(b));
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8::to_valid_lossy(bytes));
  }
};

class Replace : public HfDecoder {
 public:
  Replace(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) replace_matches(t, literal_, re_.get(), content_);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

// <0xXX> tokens become bytes; a run of them that is not valid UTF-8 becomes one U+FFFD per
// byte, as tokenizers does.
class ByteFallback : public HfDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (utf8::is_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run_len; ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_len = 0;
    };
    for (std::string& t : tokens) {
      int b = parse_byte(t);
      if (b >= 0) {
        run.push_back(char(b));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class Fuse : public HfDecoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class Strip : public HfDecoder {
 public:
  Strip(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class Metaspace : public HfDecoder {
 public:
  Metaspace(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, rep_.size(), rep_) == 0) {
          out.push_back(' ');
          p += rep_.size();
        } else {
          out.push_back(t[p++]);
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

// BPEDecoder: the end-of-word suffix becomes a space (nothing after the last token).
class BpeSuffix : public HfDecoder {
 public:
  explicit BpeSuffix(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      const std::string rep = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      size_t last = 0;
      for (size_t p = t.find(suffix_); p != std::string::npos; p = t.find(suffix_, last)) {
        out.append(t, last, p - last);
        out += rep;
        last = p + suffix_.size();
      }
      out.append(t, last, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class Sequence : public HfDecoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<HfDecoder>> items) : items_(std::move(items)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& d : items_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<HfDecoder>> items_;
};

}  // namespace

std::unique_ptr<HfDecoder> make_hf_decoder(const Json& j, const Where& w) {
  if (j.is_null()) return nullptr;
  const std::string type = hf_json::require_string(j, "type", w);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Replace") {
    std::string literal;
    auto re = read_hf_pattern(hf_json::require(j, "pattern", w), w / "pattern", literal);
    return std::make_unique<Replace>(literal, std::move(re),
                                     hf_json::require_string(j, "content", w));
  }
  if (type == "Strip") {
    int64_t start = hf_json::get_int(j, "start", 0, w), stop = hf_json::get_int(j, "stop", 0, w);
    FT_CHECK(start >= 0 && stop >= 0, w.str() + ": Strip start/stop must not be negative");
    return std::make_unique<Strip>(hf_json::require_string(j, "content", w), size_t(start),
                                   size_t(stop));
  }
  if (type == "Metaspace") {
    std::string rep = hf_json::get_string(j, "replacement", "\xE2\x96\x81", w);
    FT_CHECK(!rep.empty(), (w / "replacement").str() + " must not be empty");
    bool strip = hf_json::get_bool(j, "add_prefix_space", true, w);
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null())
      strip = hf_json::get_string(j, "prepend_scheme", "always", w) != "never";
    return std::make_unique<Metaspace>(rep, strip);
  }
  if (type == "BPEDecoder")
    return std::make_unique<BpeSuffix>(hf_json::get_string(j, "suffix", "</w>", w));
  if (type == "Sequence") {
    const Json& arr = hf_json::require_array(j, "decoders", w);
    std::vector<std::unique_ptr<HfDecoder>> items;
    for (size_t i = 0; i < arr.size(); ++i) {
      auto d = make_hf_decoder(arr[i], (w / "decoders").at(i));
      if (d) items.push_back(std::move(d));
    }
    return std::make_unique<Sequence>(std::move(items));
  }
  static const std::vector<std::string> kKnown = {"ByteLevel",    "Metaspace", "Replace",
                                                  "ByteFallback", "Fuse",      "Strip",
                                                  "BPEDecoder",   "Sequence"};
  std::string hint = closest_match(type, kKnown);
  throw Error(w.str() + ": decoder type '" + type + "' is not supported" +
              (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
              "; supported: " + join(kKnown, ", "));
}

}  // namespace fusetune
