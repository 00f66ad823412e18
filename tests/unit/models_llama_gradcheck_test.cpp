// The whole model's gradient (embedding, attention with GQA and RoPE, MLP, norms, tied or
// untied head, qkv bias, Qwen3's q/k norms, Gemma's GeGLU, (1 + w) norms and scaled embeddings,
// Gemma 2's post-norms, soft-caps and sliding window, Phi-3's fused qkv_proj and gate_up_proj,
// cross-entropy with ignored labels) against finite differences.
#include <gtest/gtest.h>

#include "fusetune/graph/builder.h"
#include "fusetune/losses/cross_entropy.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "gradcheck.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

void check_model(const ModelConfig& cfg, bool packed) {
  const int64_t B = 2, T = 6;
  Graph g(DType::F64);
  Builder b(g);
  LlamaInputs in;
  in.tokens = g.input("tokens", {B, T}, DType::I32);
  Value labels = g.input("labels", {B, T}, DType::I32);
  in.positions = g.input("positions", {B, T}, DType::I32);
  if (packed) in.doc_ids = g.input("doc_ids", {B, T}, DType::I32);
  Value scale = g.input("loss_scale", {}, DType::F64);
  LlamaOutputs m = build_llama(b, cfg, in, [](const std::string&) { return true; });
  Value flat = b.reshape(labels, {B * T});
  // A Gemma 2 returns its soft-capped logits.
  Value loss = m.logits.valid() ? build_cross_entropy_from_logits(b, m.logits, flat, scale)
                                : build_cross_entropy(b, m.hidden, m.lm_head, flat, scale);
  g.mark_output("loss", loss);

  // Larger init than 0.02 so the finite differences see real curvature.
  TensorMap params = init_parameters(graph_parameters(g), 7, DType::F64, 0.3);
  for (auto& [name, t] : params)
    if (name.find("norm") != std::string::npos || name.find("bias") != std::string::npos)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] += 0.1 * double(i % 3);
  Batch batch = random_batch(B, T, cfg.vocab_size, 3, packed);
  TensorMap inputs = batch_inputs(batch, DType::F64, 1.0 / double(batch.num_valid_labels()));
  double worst = check_gradients(g, loss, params, inputs, 6, 1e-6);
  EXPECT_LT(worst, 1e-6);
}

}  // namespace

TEST(LlamaGradcheck, GqaUntiedNoBias) { check_model(tiny_config(false, false), false); }
TEST(LlamaGradcheck, GqaTiedWithQkvBias) { check_model(tiny_config(true, true), false); }
TEST(LlamaGradcheck, MultiHeadNoGqaPacked) { check_model(tiny_config(false, true, 4), true); }
TEST(LlamaGradcheck, Qwen3QkNormsWithHeadDimApartPacked) { check_model(tiny_qwen3_config(), true); }
TEST(LlamaGradcheck, GemmaGeGluOnePlusWNormsScaledEmbeddingMqa) {
  check_model(tiny_gemma_config(), false);
}
// Post-norms, soft-capped scores and logits, a window of 3 on layers 0 and 2 (T = 6), the
// query_pre_attn_scalar scale; packed documents too.
TEST(LlamaGradcheck, Gemma2PostNormsSoftcapsSlidingWindowPacked) {
  check_model(tiny_gemma2_config(), true);
}
// (1 + w) q/k norms, two RoPE bases, local and global layers, no caps.
TEST(LlamaGradcheck, Gemma3QkNormsTwoRopeBasesLocalLayers) {
  check_model(tiny_gemma3_config(), false);
}

TEST(LlamaTrainingGraph, OutputsLossThenOneGradPerTrainableParam) {
  ModelConfig cfg = tiny_config(true, false);
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 4;
  o.trainable = [](const std::string& n) { return n.find("mlp") == std::string::npos; };
  TrainingGraph tg = build_training_graph(cfg, o);
  ASSERT_EQ(tg.graph.outputs().size(), 1 + tg.trainable_params.size());
  EXPECT_EQ(tg.graph.outputs()[0].first, "loss");
  for (const auto& p : tg.trainable_params) EXPECT_EQ(p.find("mlp"), std::string::npos) << p;
  // Tied: the embedding appears once and lm_head is not a parameter.
  for (const auto& p : graph_parameters(tg.graph)) EXPECT_NE(p.name, "lm_head.weight");
}

// The fused projections' slices (q, k, v of qkv_proj; gate, up of gate_up_proj), packed.
TEST(LlamaGradcheck, Phi3FusedQkvAndGateUpPacked) { check_model(tiny_phi3_config(), true); }
