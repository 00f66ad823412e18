#include "fusetune/models/training_graph.h"

#include "fusetune/graph/autodiff.h"
#include "fusetune/graph/verifier.h"
#include "fusetune/losses/cross_entropy.h"

namespace fusetune {

TrainingGraph build_training_graph(const ModelConfig& cfg, const TrainingGraphOptions& o) {
  TrainingGraph tg{Graph(o.dtype), {}};
  Graph& g = tg.graph;
  Builder b(g);
  const int64_t B = o.batch_size, T = o.seq_len;
  LlamaInputs in;
  in.tokens = g.input("tokens", {B, T}, DType::I32);
  Value labels = g.input("labels", {B, T}, DType::I32);
  in.positions = g.input("positions", {B, T}, DType::I32);
  if (o.packed) in.doc_ids = g.input("doc_ids", {B, T}, DType::I32);
  Value scale = g.input("loss_scale", {}, o.dtype);

  LlamaOutputs m = build_llama(b, cfg, in, o.trainable, o.llama);
  Value flat_labels = b.reshape(labels, {B * T});
  Value loss = m.logits.valid() ? build_cross_entropy_from_logits(b, m.logits, flat_labels, scale)
                                : build_cross_entropy(b, m.hidden, m.lm_head, flat_labels, scale);
  g.mark_output("loss", loss);
  for (auto& [name, grad] : append_backward(g, loss)) tg.trainable_params.push_back(name);
  verify_graph(g);
  return tg;
}

Graph build_logits_graph(const ModelConfig& cfg, int64_t batch_size, int64_t seq_len, DType dtype,
                         const LlamaOptions& llama) {
  Graph g(dtype);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {batch_size, seq_len}, DType::I32);
  in.positions = g.input("positions", {batch_size, seq_len}, DType::I32);
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string&) { return false; }, llama);
  g.mark_output("logits", m.logits.valid() ? m.logits : b.matmul(m.hidden, m.lm_head, false, true));
  verify_graph(g);
  return g;
}

}  // namespace fusetune
