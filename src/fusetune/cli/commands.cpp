#include "fusetune/cli/commands.h"

#include <cstdio>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune::cli {

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fusetune <run|ls|cp|validate> ...\n");
    return 1;
  }
  throw Error(std::string("unknown command '") + argv[1] + "'");
}

}  // namespace fusetune::cli
