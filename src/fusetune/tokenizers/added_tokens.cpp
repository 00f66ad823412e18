#include "fusetune/tokenizers/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "fusetune/tokenizers/unicode_normalize.h"
#include "fusetune/tokenizers/utf8.h"

namespace fusetune {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens,
                                     const std::vector<std::string>& patterns)
    : tokens_(tokens) {
  for (size_t k = 0; k < tokens.size(); ++k) {
    const std::string& p = patterns[k];
    if (p.empty()) continue;
    int node = 0;
    for (unsigned char c : p) {
      int next = child(node, c);
      if (next < 0) {
        next = int(nodes_.size());
        nodes_.emplace_back();
        auto& kids = nodes_[node].kids;
        kids.insert(std::upper_bound(kids.begin(), kids.end(), std::make_pair(c, -1)), {c, next});
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = int(k);  // first registration wins
    first_byte_[static_cast<unsigned char>(p[0])] = true;
  }
  for (int b = 0; b < 256; ++b) {
    if (!first_byte_[b]) continue;
    only_first_byte_ = only_first_byte_ == -1 ? b : -2;
  }
  if (only_first_byte_ < 0) only_first_byte_ = -1;
}

int AddedTokenMatcher::child(int node, unsigned char c) const {
  const auto& kids = nodes_[node].kids;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, -1));
  return it != kids.end() && it->first == c ? it->second : -1;
}

namespace {

bool word_char_before(std::string_view s, size_t pos) {
  if (pos == 0) return false;
  size_t start;
  char32_t cp = utf8::prev(s, pos, start);
  return cp == '_' || unicode::is_alphanumeric(cp);
}

bool word_char_at(std::string_view s, size_t pos) {
  if (pos >= s.size()) return false;
  char32_t cp = utf8::next(s, pos);
  return cp == '_' || unicode::is_alphanumeric(cp);
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t plain_start = 0, pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (only_first_byte_ >= 0) {
      const void* hit = std::memchr(text.data() + pos, only_first_byte_, n - pos);
      if (!hit) break;
      pos = size_t(static_cast<const char*>(hit) - text.data());
    } else if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest token starting at pos.
    int best = -1;
    size_t best_end = 0;
    for (size_t k = pos, node = 0; k < n; ++k) {
      int next = child(int(node), static_cast<unsigned char>(text[k]));
      if (next < 0) break;
      node = size_t(next);
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = k + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[best];
    size_t start = pos, stop = best_end;
    if (tok.single_word && (word_char_before(text, start) || word_char_at(text, stop))) {
      pos = best_end;  // tokenizers' matcher resumes after a rejected match, too
      continue;
    }
    if (tok.lstrip) {
      while (start > plain_start) {
        size_t s;
        if (!unicode::is_whitespace(utf8::prev(text, start, s))) break;
        start = s;
      }
    }
    if (tok.rstrip) {
      while (stop < n) {
        size_t k = stop;
        if (!unicode::is_whitespace(utf8::next(text, k))) break;
        stop = k;
      }
    }
    if (start > plain_start) out.push_back({plain_start, start, -1});
    out.push_back({start, stop, tok.id});
    plain_start = pos = stop;
  }
  if (plain_start < n) out.push_back({plain_start, n, -1});
}

}  // namespace fusetune
