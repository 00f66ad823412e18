#include "fusetune/rewards/verifiable_rewards.h"

#include <cctype>

#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {
namespace {

bool reward_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string reward_lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Whether `<tag>...</tag>` occurs exactly once, its close after its open; *open_at is where.
bool one_tag_pair(const std::string& s, const std::string& tag, size_t* open_at, size_t* close_at) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t o = s.find(open), c = s.find(close);
  if (o == std::string::npos || c == std::string::npos || c < o + open.size()) return false;
  if (s.find(open, o + 1) != std::string::npos || s.find(close, c + 1) != std::string::npos)
    return false;
  *open_at = o;
  *close_at = c;
  return true;
}

}  // namespace

bool extract_marked_answer(const std::string& text, const std::string& marker, std::string* out) {
  if (marker.empty()) {
    *out = trim(text);
    return true;
  }
  const size_t at = text.rfind(marker);
  if (at == std::string::npos) return false;
  const size_t from = at + marker.size();
  const size_t eol = text.find('\n', from);
  *out = trim(std::string_view(text).substr(from, eol == std::string::npos ? eol : eol - from));
  return true;
}

double answer_match_reward(const ScoredCompletion& c, const std::string& marker,
                           const std::string& answer_column) {
  const auto col = c.columns.find(answer_column);
  FT_CHECK(col != c.columns.end(), "the answer_match reward reads the dataset column '" +
                                       answer_column + "', which this sample does not have");
  std::string expected, got;
  if (!extract_marked_answer(col->second, marker, &expected)) expected = trim(col->second);
  if (!extract_marked_answer(c.completion, marker, &got) || got.empty()) return 0.0;
  return got == expected ? 1.0 : 0.0;
}

double format_reward(const std::string& completion, const std::string& think_tag,
                     const std::string& answer_tag) {
  size_t to = 0, tc = 0, ao = 0, ac = 0;
  const bool think = one_tag_pair(completion, think_tag, &to, &tc);
  const bool answer = one_tag_pair(completion, answer_tag, &ao, &ac);
  // Both present: the reasoning closes before the answer opens, else neither pair counts.
  if (think && answer && ao < tc + think_tag.size() + 3) return 0.0;
  return 0.5 * double(think) + 0.5 * double(answer);
}

double length_reward(int64_t tokens, int64_t min_tokens, int64_t max_tokens) {
  return tokens >= min_tokens && tokens <= max_tokens ? 1.0 : 0.0;
}

double stop_token_reward(bool stopped) { return stopped ? 1.0 : 0.0; }

double target_word_reward(const std::string& completion, const std::string& word,
                          bool ignore_case) {
  FT_CHECK(!word.empty(), "the target_word reward needs a non-empty word");
  const std::string s = ignore_case ? reward_lower(completion) : completion;
  const std::string w = ignore_case ? reward_lower(word) : word;
  for (size_t at = s.find(w); at != std::string::npos; at = s.find(w, at + 1)) {
    const bool left_ok = at == 0 || !reward_word_char(s[at - 1]) || !reward_word_char(w.front());
    const size_t end = at + w.size();
    const bool right_ok =
        end == s.size() || !reward_word_char(s[end]) || !reward_word_char(w.back());
    if (left_ok && right_ok) return 1.0;
  }
  return 0.0;
}

}  // namespace fusetune
