#include "fusetune/models/ppo_graph.h"

#include "fusetune/graph/verifier.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The classifier's score at every position, [N].
Value ppo_token_values(Builder& b, const LlamaOutputs& m, int64_t N) {
  FT_CHECK(m.scores.valid() && b.shape(m.scores).size() == 2 && b.shape(m.scores)[1] == 1,
           "a PPO value model is a sequence classifier of one score (num_labels: 1)");
  return b.reshape(m.scores, {N});
}

}  // namespace

LossBuilder ppo_value_loss_builder(const PpoLoss& loss) {
  return [loss](Builder& b, const LossContext& c) {
    Graph& g = b.graph();
    const int64_t N = c.batch_size * c.seq_len;
    const DType fd = g.compute_dtype();
    PpoValueLossInputs in;
    in.values = ppo_token_values(b, c.model, N);
    in.old_values = g.input("old_values", {N}, fd);
    in.returns = g.input("returns", {N}, fd);
    in.weights = g.input("value_weights", {N}, fd);
    PpoValueLossOutputs l = build_ppo_value_loss(b, loss, in);
    LossOutputs out;
    out.loss = l.loss;
    out.report = {{"value_loss", l.value_loss}, {"values", in.values}};
    return out;
  };
}

Graph build_token_values_graph(const ModelConfig& cfg, int64_t rows, int64_t seq_len, DType dtype) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {rows, seq_len}, DType::I32);
  in.positions = g.input("positions", {rows, seq_len}, DType::I32);
  LlamaOutputs m = build_llama(b, cfg, in, [](const std::string&) { return false; });
  g.mark_output("values", ppo_token_values(b, m, rows * seq_len));
  verify_graph(g);
  return g;
}

}  // namespace fusetune
