#pragma once
// The three ways to run the joint graph (docs/design.md §4):
//   compile: false        -> eager executor
//   compile: model        -> passes on the model region; the loss region stays eager
//   compile: true         -> passes on the whole joint graph (alias: model+loss)
#include <memory>
#include <string>
#include <vector>

#include "fusetune/compile/pass.h"
#include "fusetune/runtime/executor.h"
#include "fusetune/runtime/shared_arena.h"

namespace fusetune {

CompileMode parse_compile_mode(const std::string& value);  // false|true|model|model+loss
const char* compile_mode_name(CompileMode mode);           // "false", "model", "true"

struct CompiledStep {
  std::unique_ptr<Executor> executor;
  std::vector<std::string> report;  // one line per pass, then the memory plan
  double compile_seconds = 0.0;
  int64_t arena_bytes = 0;
};

// Runs the passes for `opts.mode` on a copy of `g` and returns an executor for the result.
// `arena`: the run's shared arena (runtime/shared_arena.h); null: the step gets its own.
CompiledStep compile_graph(const Graph& g, const PassOptions& opts,
                           std::shared_ptr<SharedArena> arena = nullptr);

// The pass pipeline alone (for tests and `fusetune plan`): returns the rewritten graph.
Graph run_passes(const Graph& g, const PassOptions& opts, std::vector<std::string>* report);

}  // namespace fusetune
