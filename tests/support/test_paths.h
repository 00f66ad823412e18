#pragma once
// Paths the tests need (source tree, CLI binary, tests/data). They live in one generated .cpp
// (tests/CMakeLists.txt) rather than in -D flags, so every other test object is the same
// wherever the checkout is.

namespace fusetune::testing {

const char* source_dir();     // the checkout's root
const char* binary_path();    // the built `fusetune` CLI
const char* test_data_dir();  // tests/data

}  // namespace fusetune::testing
