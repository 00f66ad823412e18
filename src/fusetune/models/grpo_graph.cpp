#include "fusetune/models/grpo_graph.h"

#include "fusetune/graph/verifier.h"

namespace fusetune {

LossBuilder grpo_loss_builder(const GrpoLoss& loss) {
  return [loss](Builder& b, const LossContext& c) {
    Graph& g = b.graph();
    const int64_t N = c.batch_size * c.seq_len;
    const DType fd = g.compute_dtype();  // data inputs are fp32 in a bf16 graph
    GrpoLossInputs in;
    in.logps = build_token_log_probs(b, c.model.hidden, c.model.lm_head, c.model.logits, c.labels,
                                     loss.temperature);
    in.old_logps = g.input("old_logps", {N}, fd);
    in.advantages = g.input("advantages", {N}, fd);
    in.weights = g.input("token_weights", {N}, fd);
    if (loss.needs_reference()) in.ref_logps = g.input("ref_logps", {N}, fd);
    GrpoLossOutputs l = build_grpo_loss(b, loss, in);
    LossOutputs out;
    out.loss = l.loss;
    out.report = {{"token_logps", in.logps}, {"ratio", l.ratio}};
    if (l.kl.valid()) out.report.emplace_back("kl", l.kl);
    return out;
  };
}

Graph build_token_log_probs_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len,
                                  DType dtype, const LlamaOptions& llama, double temperature) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {rows, seq_len}, DType::I32);
  Value labels = g.input("labels", {rows, seq_len}, DType::I32);
  in.positions = g.input("positions", {rows, seq_len}, DType::I32);
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string&) { return false; }, llama);
  g.mark_output("token_logps",
                build_token_log_probs(b, m.hidden, m.lm_head, m.logits,
                                      b.reshape(labels, {rows * seq_len}), temperature));
  verify_graph(g);
  return g;
}

}  // namespace fusetune
