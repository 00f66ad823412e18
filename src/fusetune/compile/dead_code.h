#pragma once
// Dead-code elimination: drops nodes that no graph output depends on.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::dead_code {
std::string run(Graph& g, const PassOptions& opts);
}
