#include "cli_runner.h"

#include <sys/wait.h>

#include <cstdio>

namespace fusetune::testing {

CliResult run_fusetune(const std::string& args, const std::string& cwd, const std::string& env) {
  const std::string cmd = "cd '" + cwd + "' && " + env + binary_path() + " " + args + " 2>&1";
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
