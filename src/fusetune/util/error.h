#pragma once
// One exception type for every user-facing failure. The message is the whole story: it names
// the file, key or row at fault, so the CLI prints it as one line and exits non-zero.
#include <stdexcept>
#include <string>

namespace fusetune {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// FT_CHECK(cond, msg): throws fusetune::Error(msg) when cond is false. For input validation
// and internal invariants alike; msg is only built on failure.
#define FT_CHECK(cond, msg)                                        \
  do {                                                             \
    if (!(cond)) throw ::fusetune::Error(std::string() + msg);     \
  } while (0)

}  // namespace fusetune
