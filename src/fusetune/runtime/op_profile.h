#pragma once
// Per-op time, for finding what a step spends its time on. Enabled by FUSETUNE_PROFILE=1 (or
// set_enabled); executors add each kernel's wall time under its op; report() prints a table
// sorted by time. Off by default: the check is one branch per node.
#include <string>

#include "fusetune/graph/op.h"

namespace fusetune::op_profile {

bool enabled();
void set_enabled(bool on);
void add(Op op, double seconds, double bytes_out);
void reset();
std::string report();  // "op  calls  seconds  share  GB written" rows

}  // namespace fusetune::op_profile
