#pragma once
// Text checks the tests share: whether a text holds a part, and the message of the
// fusetune::Error a call throws.
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace fusetune::testing {

// Whether `part` occurs in `text`.
bool contains(std::string_view text, std::string_view part);

// How many times `part` (not empty) occurs in `text`, without overlaps.
size_t occurrences(std::string_view text, std::string_view part);

// The message of the fusetune::Error that `fn` throws, or "" when it throws none; so
// `EXPECT_EQ(error_of(f), "")` says "no error", and `contains(error_of(f), "x")` (x not empty)
// fails when f throws nothing. An Error with an empty message comes back as a non-empty note
// saying so. Other exceptions propagate (the test fails on them).
std::string error_of(const std::function<void()>& fn);

}  // namespace fusetune::testing
