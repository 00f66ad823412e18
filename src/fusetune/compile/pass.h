#pragma once
// What every pass sees. A pass is one file with one entry point `run(Graph&, const PassOptions&)`
// returning a one-line summary for the compile report.
#include <cstdint>
#include <string>

#include "fusetune/graph/graph.h"

namespace fusetune {

enum class CompileMode { None, Model, Full };  // compile: false | model | true (model+loss)

struct PassOptions {
  CompileMode mode = CompileMode::Full;
  int64_t ce_chunk_budget_bytes = 32ll << 20;  // scratch for one [chunk, vocab] logits block
  bool activation_checkpointing = false;       // enable_activation_checkpointing (any mode)
  // Generic passes, on by default in compiled modes (off: to measure or test the others).
  bool eliminate_copies = true;
  bool fuse_elementwise = true;
  bool in_place = true;  // memory plan: an output may take over its input's buffer
  // ZeRO-3 (compile/params_at_use.h, any mode): parameters bound at first use; with
  // reshard_after_forward, bound again for the backward.
  bool params_at_use = false;
  bool reshard_after_forward = true;
  // Nodes of this region or lower may be rewritten (model-only compilation leaves the loss
  // region as it is).
  int max_region() const { return mode == CompileMode::Full ? 1 : 0; }
};

}  // namespace fusetune
