#define PCRE2_CODE_UNIT_WIDTH 8
#include "fusetune/tokenizers/regex.h"

#include <pcre2.h>

#include "fusetune/tokenizers/utf8.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread matching state, shared by all patterns: match data (the overall match is all we
// read, so a fixed ovector suffices; a pattern with more groups reports rc == 0, still with
// the match in ovector[0..1]) and a context carrying a JIT stack larger than the default
// 32 KiB, which patterns like `\s+(?!\S)` exhaust on long runs of spaces.
struct ThreadState {
  pcre2_match_data* md = pcre2_match_data_create(32, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadState() {
    FT_CHECK(md && ctx && stack, "out of memory creating regex match state");
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(md);
  }
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string pattern, const std::string& what)
    : pattern_(std::move(pattern)), impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const std::string compiled = onig_compatible(pattern_);
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  FT_CHECK(impl_->code, what + ": regex " + pattern_ + " does not compile at offset " +
                            std::to_string(offset) + ": " + pcre2_message(err));
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text,
                     const std::function<void(size_t, size_t)>& on_match) const {
  ThreadState& st = thread_state();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    // pcre2_jit_match skips pcre2_match's per-call checks; callers pass valid UTF-8.
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, st.md, st.ctx)
                        : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // No JIT, or its stack ran out: the interpreter keeps its backtracking on the heap.
      rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       st.md, st.ctx);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    FT_CHECK(rc >= 0, "regex " + pattern_ + " failed on a text of " + std::to_string(text.size()) +
                          " bytes: " + pcre2_message(rc));
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
    size_t start = ov[0], end = ov[1];
    if (end > start) {
      on_match(start, end);
      pos = end;
    } else {
      // Empty match: skip one character, as find_iter does.
      if (start >= text.size()) break;
      pos = start + utf8::seq_len(static_cast<unsigned char>(text[start]));
    }
  }
}

std::string Regex::onig_compatible(std::string_view p) {
  static constexpr std::string_view kSpace = R"(\t-\r\x{85}\p{Z})";
  static constexpr std::string_view kWord = R"(\p{L}\p{M}\p{N}\p{Pc})";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      if (d == 'Q') {  // \Q...\E: literal text, copied as is
        size_t end = p.find("\\E", i + 2);
        end = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, end - i));
        i = end;
        continue;
      }
      const bool space = d == 's' || d == 'S', word = d == 'w' || d == 'W';
      const bool negated = d == 'S' || d == 'W';
      if ((space || word) && !(in_class && negated)) {
        const std::string_view set = space ? kSpace : kWord;
        if (in_class) {
          out.append(set);
        } else {
          out += negated ? "[^" : "[";
          out.append(set);
          out += ']';
        }
        i += 2;
        continue;
      }
      out.append(p.substr(i, 2));
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      size_t end = p.find(":]", i + 2);
      end = end == std::string_view::npos ? p.size() : end + 2;
      out.append(p.substr(i, end - i));
      i = end;
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos)
      out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void replace_matches(std::string& text, const std::string& literal, const Regex* re,
                     const std::string& content) {
  std::string out;
  size_t last = 0;
  auto on_match = [&](size_t s, size_t e) {
    out.append(text, last, s - last);
    out += content;
    last = e;
  };
  if (re) {
    re->find_all(text, on_match);
  } else if (!literal.empty()) {
    for (size_t p = text.find(literal); p != std::string::npos; p = text.find(literal, last))
      on_match(p, p + literal.size());
  }
  if (last == 0 && out.empty()) return;  // no match: the text stays as it is
  out.append(text, last, std::string::npos);
  text = std::move(out);
}

}  // namespace fusetune
