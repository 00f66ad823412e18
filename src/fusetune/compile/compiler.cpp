#include "fusetune/compile/compiler.h"

#include <chrono>

#include "fusetune/compile/activation_checkpointing.h"
#include "fusetune/compile/dead_code.h"
#include "fusetune/compile/eliminate_copies.h"
#include "fusetune/compile/fuse_attention.h"
#include "fusetune/compile/fuse_elementwise.h"
#include "fusetune/compile/fuse_linear_cross_entropy.h"
#include "fusetune/compile/fuse_linear_divergence.h"
#include "fusetune/compile/fuse_linear_log_probs.h"
#include "fusetune/compile/fuse_rmsnorm_residual.h"
#include "fusetune/compile/fuse_swiglu.h"
#include "fusetune/compile/memory_plan.h"
#include "fusetune/compile/params_at_use.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/runtime/node_kernels.h"
#include "fusetune/runtime/plan_executor.h"
#include "fusetune/util/error.h"
#include "fusetune/util/strings.h"

namespace fusetune {

CompileMode parse_compile_mode(const std::string& v) {
  if (v == "false" || v == "False" || v == "none") return CompileMode::None;
  if (v == "true" || v == "True" || v == "model+loss") return CompileMode::Full;
  if (v == "model") return CompileMode::Model;
  throw Error("compile must be one of false, model, true (alias model+loss); got '" + v + "'");
}

const char* compile_mode_name(CompileMode m) {
  switch (m) {
    case CompileMode::None:
      return "false";
    case CompileMode::Model:
      return "model";
    case CompileMode::Full:
      return "true";
  }
  return "?";
}

Graph run_passes(const Graph& g, const PassOptions& opts, std::vector<std::string>* report) {
  Graph out = g;
  auto note = [&](std::string line) {
    if (report) report->push_back(std::move(line));
  };
  if (opts.mode != CompileMode::None) {
    note(passes::fuse_attention::run(out, opts));
    note(passes::fuse_swiglu::run(out, opts));
    note(passes::fuse_rmsnorm_residual::run(out, opts));
    note(passes::dead_code::run(out, opts));
    note(passes::fuse_linear_cross_entropy::run(out, opts));
    note(passes::fuse_linear_log_probs::run(out, opts));
    if (std::string line = passes::fuse_linear_divergence::run(out, opts); !line.empty())
      note(std::move(line));
    // Generic passes last: they take whatever the pattern fusions above left.
    if (opts.eliminate_copies) note(passes::eliminate_copies::run(out, opts));
    if (opts.fuse_elementwise) note(passes::fuse_elementwise::run(out, opts));
  }
  if (opts.activation_checkpointing) note(passes::activation_checkpointing::run(out, opts));
  // Last: it orders the parameter leaves around the schedule the passes above produced.
  if (opts.params_at_use) note(passes::params_at_use::run(out, opts));
  verify_graph(out);
  return out;
}

CompiledStep compile_graph(const Graph& g, const PassOptions& opts,
                           std::shared_ptr<SharedArena> arena) {
  auto t0 = std::chrono::steady_clock::now();
  CompiledStep step;
  if (opts.mode == CompileMode::None) {
    step.executor = std::make_unique<EagerExecutor>(
        opts.activation_checkpointing || opts.params_at_use ? run_passes(g, opts, &step.report)
                                                            : g);
  } else {
    Graph compiled = run_passes(g, opts, &step.report);
    MemoryPlan plan =
        plan_memory(compiled, opts.mode == CompileMode::Model ? 1 : -1, opts.in_place);
    step.arena_bytes = plan.arena_bytes;
    step.report.push_back("memory_plan: " + std::to_string(plan.buffers) + " buffers, " +
                          format_gib(double(plan.placed_bytes)) + " GiB placed in a " +
                          format_gib(double(plan.arena_bytes)) + " GiB arena (" +
                          std::to_string(plan.in_place) + " written in place)");
    step.executor =
        std::make_unique<PlanExecutor>(std::move(compiled), std::move(plan), std::move(arena));
  }
  step.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return step;
}

}  // namespace fusetune
