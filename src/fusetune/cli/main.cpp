#include <cstdio>
#include <exception>

#include "fusetune/cli/commands.h"
#include "fusetune/util/error.h"

int main(int argc, char** argv) {
  try {
    return fusetune::cli::dispatch(argc, argv);
  } catch (const fusetune::Error& e) {
    std::fprintf(stderr, "fusetune: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusetune: internal error: %s\n", e.what());
    return 2;
  }
}
