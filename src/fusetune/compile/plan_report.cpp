#include "fusetune/compile/plan_report.h"

#include <cstdio>

#include "fusetune/compile/compiler.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/flash_attention.h"
#include "fusetune/runtime/node_kernels.h"
#include "fusetune/util/strings.h"

namespace fusetune {

ModePlan plan_mode(const Graph& g, const PassOptions& opts,
                   const OptimizerStateSize& optimizer_state, bool optimizer_in_bwd) {
  ModePlan p;
  p.mode = opts.mode;
  Graph run = run_passes(g, opts, &p.passes);
  MemoryPlan mp;
  const bool compiled = opts.mode != CompileMode::None;
  if (compiled) mp = plan_memory(run, opts.mode == CompileMode::Model ? 1 : -1, opts.in_place);
  const std::vector<int> last = last_uses(run);
  std::pair<std::string, int> attention[2];  // flash attention forward/backward: line, count
  for (size_t i = 0; i < run.nodes().size(); ++i) {
    const Node& n = run.nodes()[i];
    const bool leaf = n.op == Op::Input || n.op == Op::Param || n.op == Op::Constant;
    if (leaf || is_view_op(n.op) || last[i] < 0) continue;
    ++p.kernels[n.region ? 1 : 0];
    if (n.op == Op::FusedLinearCrossEntropy || n.op == Op::FusedNF4LinearCrossEntropy)
      p.fused.push_back(std::string(op_name(n.op)) + ": h " + shape_str(run.shape(n.inputs[0])) +
                        " x W " +
                        (n.op == Op::FusedNF4LinearCrossEntropy
                             ? shape_str(n.attrs.shape) + " (NF4, dequantized tile by tile)"
                         : n.inputs.size() == 5
                             ? shape_str(run.shape(n.inputs[1])) + " (" +
                                   kernels::fake_quant_name(kernels::FakeQuant(n.attrs.groups)) +
                                   ", fake-quantized tile by tile)"
                             : shape_str(run.shape(n.inputs[1]))) +
                        ", chunks of " + std::to_string(n.attrs.chunk_rows) +
                        " tokens (logits, log-probs and their gradients never materialized)");
    if (n.op == Op::FusedLinearLogProbs || n.op == Op::FusedLinearLogProbsBackward) {
      const size_t head = n.op == Op::FusedLinearLogProbs ? 2 : 4;
      const bool nf4 = !n.attrs.keep_logits && n.inputs.size() == head + 3;
      p.fused.push_back(
          std::string(op_name(n.op)) + ": h " + shape_str(run.shape(n.inputs[0])) + " x W " +
          (nf4 ? shape_str(n.attrs.shape) + " (NF4, dequantized tile by tile)"
               : shape_str(run.shape(n.inputs[head]))) +
          ", chunks of " + std::to_string(n.attrs.chunk_rows) +
          (n.attrs.keep_logits ? " tokens (one chunk: the forward's logits kept for the backward)"
                               : " tokens (label log-probs without a [tokens x vocab] tensor)"));
    }
    if (n.op == Op::FlashAttention || n.op == Op::FlashAttentionBackward) {
      const bool fwd = n.op == Op::FlashAttention;
      const Shape& q = run.shape(n.inputs[0]);
      const Shape& k = run.shape(n.inputs[1]);
      const bool docs = n.inputs.size() == (fwd ? 4u : 7u);
      attention[fwd ? 0 : 1] = {
          std::string(op_name(n.op)) + ": q " + shape_str(q) + ", k/v " + shape_str(k) + " (GQA " +
              std::to_string(q[2] / k[2]) + "), causal" + (docs ? " + doc mask" : "") +
              ", tiles of " + std::to_string(kernels::kFlashBlockQ) + "x" +
              std::to_string(kernels::kFlashBlockK) + " (" + shape_str({q[0], q[2], q[1], q[1]}) +
              (fwd ? " scores and probabilities" : " score gradients") + " never materialized)",
          attention[fwd ? 0 : 1].second + 1};
    }
  }
  for (const auto& [line, count] : attention)
    if (count > 0) p.fused.push_back(line + " x" + std::to_string(count));
  int elementwise = 0;
  for (const Node& n : run.nodes()) elementwise += n.op == Op::Elementwise;
  if (elementwise)
    p.fused.push_back(std::to_string(elementwise) +
                      " elementwise programs (trees of add/mul/scale/silu, one pass over memory)");
  if (compiled)
    p.passes.push_back("memory_plan: " + std::to_string(mp.in_place) + " of " +
                       std::to_string(mp.buffers) + " buffers written in place over an input, " +
                       format_bytes(double(mp.arena_bytes)) + " arena");
  p.arena_bytes = compiled ? mp.arena_bytes : 0;
  p.memory = estimate_step_memory(run, compiled ? &mp : nullptr, optimizer_state,
                                  optimizer_in_bwd ? all_gradients() : GradientFreed{});
  if (compiled) p.memory_plan = std::make_shared<const MemoryPlan>(std::move(mp));
  p.graph = std::make_shared<const Graph>(std::move(run));
  return p;
}

std::string format_mode_plan(const ModePlan& p) {
  std::string out = std::string("compile: ") + compile_mode_name(p.mode) + "\n";
  out += "  kernels: " + std::to_string(p.kernels[0]) + " in the model region, " +
         std::to_string(p.kernels[1]) + " in the loss region" +
         (p.mode == CompileMode::Model ? " (eager)" : "") + "\n";
  for (const auto& line : p.passes) out += "  pass " + line + "\n";
  for (const auto& line : p.fused) out += "  fused " + line + "\n";
  const MemoryBreakdown& m = p.memory;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "  peak memory: parameters %s + gradients %s + optimizer state %s + activations %s + "
      "workspace %s = %s\n",
      format_bytes(double(m.parameters)).c_str(), format_bytes(double(m.gradients)).c_str(),
      format_bytes(double(m.optimizer_state)).c_str(), format_bytes(double(m.activations)).c_str(),
      format_bytes(double(m.workspace)).c_str(), format_bytes(double(m.total())).c_str());
  return out + buf;
}

}  // namespace fusetune
