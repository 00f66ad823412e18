#pragma once
// Runs the built `fusetune` binary as a user would, for tests of whole commands.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "test_paths.h"

namespace fusetune::testing {

struct CliResult {
  int code;
  std::string out;  // stdout and stderr together
};

// `args` are shell words; runs in `cwd` (default: the checkout's root, where the built-in
// configs' ../shared/assets paths resolve).
inline CliResult run_fusetune(const std::string& args, const std::string& cwd = source_dir()) {
  const std::string cmd = "cd '" + cwd + "' && " + binary_path() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace fusetune::testing
