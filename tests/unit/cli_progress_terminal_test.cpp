// `fusetune run` draws torchtune's progress bar on stderr when stderr is a terminal, and only
// then. The terminal is a pseudo-terminal from util-linux's `script` (Debian's bsdutils,
// essential), so the test runs where it runs: CI has no terminal and no stdin (the run's stdin
// is /dev/null here too). Without `script` or a pseudo-terminal it skips, or fails under
// FUSETUNE_REQUIRE_ASSETS=1.
#include <pty.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "checks.h"
#include "recipe_runs.h"
#include "test_support.h"

using namespace fusetune::testing;

namespace {}  // namespace

TEST(CliProgressBar, DrawnOnAPseudoTerminalNotOnAPipe) {
  if (std::system("script --version >/dev/null 2>&1") != 0)
    FT_SKIP_UNLESS_REQUIRED("util-linux's script is not installed (Debian: bsdutils)");
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0)
    FT_SKIP_UNLESS_REQUIRED(std::string("no pseudo-terminal available: openpty: ") +
                            std::strerror(errno));
  ::close(master);
  ::close(slave);
  const TempDir tmp;
  // On a pipe (stdout and stderr to files): the step lines, no bar.
  const CliRun piped = run_shell(demo_command(tmp / "piped") + " </dev/null", tmp / "s_piped");
  ASSERT_EQ(piped.code, 0) << piped.out << piped.err;
  EXPECT_EQ(printed_steps(piped.out).size(), 6u) << piped.out;
  EXPECT_EQ(piped.err.find("Loss: "), std::string::npos) << piped.err;
  EXPECT_EQ(piped.err.find('\r'), std::string::npos) << piped.err;

  // On a terminal: `script` runs the same command with stdin, stdout and stderr on a
  // pseudo-terminal and copies what the terminal shows to its own stdout.
  const CliRun tty =
      run_shell("script -qefc " + shell_quote(demo_command(tmp / "tty")) + " /dev/null </dev/null",
                tmp / "s_tty");
  ASSERT_EQ(tty.code, 0) << tty.out << tty.err;
  EXPECT_EQ(printed_steps(tty.out).size(), 6u) << tty.out;
  // tqdm's layout: "epoch|step|Loss: x:  pct%|bar| n/total [elapsed<remaining, rate]", each
  // redraw starting with a carriage return, the last one at 6/6.
  EXPECT_NE(tty.out.find("\r1|1|Loss: "), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("| 6/6 ["), std::string::npos) << tty.out;
  EXPECT_GE(occurrences(tty.out, "|Loss: "), 6u) << tty.out;
  EXPECT_EQ(logged_steps(tmp / "tty").size(), logged_steps(tmp / "piped").size());
}
