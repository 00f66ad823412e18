#pragma once
// ZeRO-3's schedule: each parameter leaf is bound right before its first reader, so a parameter
// gathered from the rank that owns it (distributed/sharded_params.h) lives only around its uses.
// With reshard_after_forward (the default) the backward gets its own leaf of the same name, placed
// before its first backward reader: the forward's copy is dropped after the forward and the
// parameter gathered again for the backward (torchtune's fsdp_reshard_after_forward). Every rank
// runs the same graph, so every rank binds the parameters in the same order.
#include "fusetune/compile/pass.h"

namespace fusetune::passes::params_at_use {
std::string run(Graph& g, const PassOptions& opts);
}
