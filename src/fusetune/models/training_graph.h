#pragma once
// The joint training step as one graph: model forward + loss + backward (DESIGN.md §1).
// Inputs (bound by name each step): "tokens", "labels", "positions" [B, T] I32, "doc_ids"
// [B, T] I32 when packed, and "loss_scale" [] (1 / valid labels in the optimizer step).
// Outputs: "loss", then "grad:<param>" for every trainable parameter.
#include <string>
#include <vector>

#include "fusetune/graph/graph.h"
#include "fusetune/models/llama.h"

namespace fusetune {

struct TrainingGraphOptions {
  int64_t batch_size = 1;
  int64_t seq_len = 1;
  bool packed = false;
  DType dtype = DType::F32;
  TrainablePredicate trainable = [](const std::string&) { return true; };
  LlamaOptions llama;  // linear-layer hooks (PEFT adapters, NF4 base weights)
};

struct TrainingGraph {
  Graph graph;
  std::vector<std::string> trainable_params;  // in the order of the "grad:" outputs
};

TrainingGraph build_training_graph(const ModelConfig& cfg, const TrainingGraphOptions& opts);

// Forward only, returning "logits" [B*T, V] (for evaluation, generation and golden checks).
Graph build_logits_graph(const ModelConfig& cfg, int64_t batch_size, int64_t seq_len, DType dtype,
                         const LlamaOptions& llama = {});

}  // namespace fusetune
