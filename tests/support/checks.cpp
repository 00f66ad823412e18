#include "checks.h"

#include "fusetune/util/error.h"

namespace fusetune::testing {

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

size_t occurrences(std::string_view text, std::string_view part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string_view::npos;
       at = text.find(part, at + part.size()))
    ++n;
  return n;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string what = e.what();
    return what.empty() ? "(a fusetune::Error with an empty message)" : what;
  }
  return "";
}

}  // namespace fusetune::testing
