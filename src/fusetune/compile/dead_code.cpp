#include "fusetune/compile/dead_code.h"

#include "fusetune/compile/rewrite.h"

namespace fusetune::passes::dead_code {

std::string run(Graph& g, const PassOptions&) {
  const size_t before = g.nodes().size();
  compact(g);
  return "dead_code: removed " + std::to_string(before - g.nodes().size()) + " nodes";
}

}  // namespace fusetune::passes::dead_code
