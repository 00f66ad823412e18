#pragma once
// Runs the built `fusetune` binary as a user would, for tests of whole commands.
#include <string>

#include "test_paths.h"

namespace fusetune::testing {

struct CliResult {
  int code;
  std::string out;  // stdout and stderr together
};

// `args` are shell words; runs in `cwd` (default: the checkout's root, where the built-in
// configs' ../shared/assets paths resolve); `env`: shell words `NAME=value ` set for it.
CliResult run_fusetune(const std::string& args, const std::string& cwd = source_dir(),
                       const std::string& env = "");

}  // namespace fusetune::testing
