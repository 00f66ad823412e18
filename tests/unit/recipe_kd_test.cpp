// knowledge_distillation_single_device (recipes/kd_step.h, losses/distillation.h): the KD
// step graph gives the same loss and gradients in every compile mode, the recipe trains a
// student against a teacher and logs class_loss and kd_loss, and a teacher of another
// vocabulary is refused at validation, naming both sizes. knowledge_distillation_distributed:
// 2 ranks train like one process with their global batch, and resume with another rank count.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <regex>
#include <tuple>

#include "checks.h"
#include "files.h"
#include "fusetune/compile/compiler.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/kernels/cpu/fused_linear_divergence.h"
#include "fusetune/losses/distillation.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/head_parts.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/recipes/distillation_recipe.h"
#include "fusetune/recipes/kd_step.h"
#include "fusetune/recipes/recipe_setup.h"
#include "fusetune/recipes/step_plan.h"
#include "fusetune/recipes/zero3_rank_plan.h"
#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "graph_compare.h"
#include "mpi_runs.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace kd_recipe_test {

Tensor random_logits(int64_t N, int64_t V, uint64_t seed) {
  Tensor t = Tensor::empty({N, V}, DType::F32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.f, 2.f);
  for (int64_t i = 0; i < N * V; ++i) t.data<float>()[i] = n(rng);
  return t;
}

TEST(KdStepGraph, CompileModesAgreeOnEveryDivergence) {
  const std::vector<DistillationLoss> losses = {{KdDivergence::ForwardKL, 0.5, 1.0},
                                                {KdDivergence::ReverseKL, 0.5, 2.0},
                                                {KdDivergence::GeneralizedJSD, 0.3, 1.5}};
  for (bool tied : {false, true})
    for (const DistillationLoss& l : losses) {
      const ModelConfig cfg = tiny_config(tied, false);
      const int64_t B = 2, T = 8;
      TrainingGraphOptions o;
      o.batch_size = B;
      o.seq_len = T;
      o.loss = distillation_loss_builder(l, 0.4);
      TrainingGraph tg = build_training_graph(cfg, o);
      TensorMap params = init_parameters(graph_parameters(tg.graph), 7, DType::F32, 0.3);
      const Batch b = random_batch(B, T, cfg.vocab_size, 11);
      TensorMap in = batch_inputs(b, DType::F32, 1.0 / double(b.num_valid_labels()));
      in["teacher_logits"] = random_logits(B * T, cfg.vocab_size, 5);
      std::vector<std::vector<Tensor>> outs;
      for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
        PassOptions po;
        po.mode = mode;
        outs.push_back(compile_graph(tg.graph, po).executor->run(in, params));
      }
      for (size_t m = 1; m < outs.size(); ++m)
        for (size_t k = 0; k < outs[0].size(); ++k)
          EXPECT_LT(max_rel_diff(outs[m][k], outs[0][k]), k == 0 ? 1e-5 : 1e-4)
              << l.name() << " tied " << tied << " mode " << m << " output "
              << tg.graph.outputs()[k].first;
    }
}

// teacher_hidden teacher_head^T: the logits the unfused graph takes.
Tensor teacher_logits_of(const Tensor& th, const Tensor& tw) {
  const int64_t N = th.dim(0), Dt = th.dim(1), V = tw.dim(0);
  Tensor z = Tensor::empty({N, V}, DType::F32);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t d = 0; d < Dt; ++d)
        s += double(th.data<float>()[i * Dt + d]) * double(tw.data<float>()[v * Dt + d]);
      z.data<float>()[i * V + v] = float(s);
    }
  return z;
}

std::map<std::string, Tensor> by_name(const Graph& g, const std::vector<Tensor>& out) {
  std::map<std::string, Tensor> m;
  for (size_t k = 0; k < out.size(); ++k) m.emplace(g.outputs()[k].first, out[k]);
  return m;
}

// The unfused and the fused KD graphs of `cfg` (3 x 12 tokens, a 24-wide teacher) in `dtype`,
// the inputs of the fused one (the teacher's hidden states and head, in `dtype`), and the
// unfused graph's eager outputs by name on the same teacher (its logits formed from them).
struct KdCase {
  TrainingGraph fused;
  TensorMap in, params;
  std::map<std::string, Tensor> want;
  int64_t N = 0;
};
// The batch and the teacher's width of kd_case and hooked_head_case.
constexpr int64_t kKdB = 3, kKdT = 12, kKdTeacherDim = 24;

// k's inputs (a random batch, plus `extra`, plus a random teacher's hidden states and head, in
// dtype) and the unfused graph `eager`'s outputs on them by name, its teacher's logits formed
// from the same teacher.
void add_inputs_and_expected(KdCase& k, const ModelConfig& cfg, const TrainingGraph& eager,
                             DType dtype, const TensorMap& extra = {}) {
  const Batch b = random_batch(kKdB, kKdT, cfg.vocab_size, 11);
  k.in = batch_inputs(b, DType::F32, 1.0 / double(b.num_valid_labels()));
  for (const auto& [name, t] : extra) k.in[name] = t;
  TensorMap ein = k.in;
  const Tensor th = random_tensor({k.N, kKdTeacherDim}, DType::F32, 5, -0.6, 0.6).to(dtype);
  const Tensor tw =
      random_tensor({cfg.vocab_size, kKdTeacherDim}, DType::F32, 6, -0.6, 0.6).to(dtype);
  k.in["teacher_hidden"] = th;
  k.in["teacher_head"] = tw;
  ein["teacher_logits"] = teacher_logits_of(th.to(DType::F32), tw.to(DType::F32)).to(dtype);
  k.want =
      by_name(eager.graph,
              compile_graph(eager.graph, {.mode = CompileMode::None}).executor->run(ein, k.params));
}

KdCase kd_case(const ModelConfig& cfg, const DistillationLoss& l, bool frozen, DType dtype) {
  const int64_t B = kKdB, T = kKdT, Dt = kKdTeacherDim;
  KdCase k;
  k.N = B * T;
  TrainingGraphOptions o;
  o.batch_size = B;
  o.seq_len = T;
  o.dtype = dtype;
  if (frozen) o.trainable = [](const std::string& n) { return n != "lm_head.weight"; };
  o.loss = distillation_loss_builder(l, 0.4);
  const TrainingGraph eager = build_training_graph(cfg, o);
  o.loss = fused_distillation_loss_builder(l, 0.4, Dt);
  k.fused = build_training_graph(cfg, o);
  k.params = init_parameters(graph_parameters(eager.graph), 7, dtype, 0.3);
  add_inputs_and_expected(k, cfg, eager, dtype);
  return k;
}

// The fused graph in every compile mode against `want` (the unfused graph's outputs by name,
// the loss within `loss_tol`, the rest within `tol`), over chunks of 16 rows; under `compile:
// true` the pass fuses it, merges its forward into the backward and leaves no [N x vocab]
// tensor.
void expect_fused_matches(const TrainingGraph& fused, const TensorMap& in, const TensorMap& params,
                          const std::map<std::string, Tensor>& want, int64_t N, int64_t V,
                          double loss_tol, double tol) {
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    SCOPED_TRACE(std::string("compile ") + compile_mode_name(mode));
    PassOptions po;
    po.mode = mode;
    po.ce_chunk_budget_bytes = po.tiled_head_ce_chunk_budget_bytes = 1;  // the 16-row floor
    const CompiledStep step = compile_graph(fused.graph, po);
    const auto got = by_name(fused.graph, step.executor->run(in, params));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_LT(max_rel_diff(got.at(name), t), name == "loss" ? loss_tol : tol) << name;
    }
    if (mode != CompileMode::Full) continue;
    EXPECT_TRUE(std::count(step.report.begin(), step.report.end(),
                           "fuse_linear_divergence: fused 1 (chunk 16 tokens)"))
        << ::testing::PrintToString(step.report);
    for (const Node& n : step.executor->graph().nodes()) {
      EXPECT_NE(n.op, Op::FusedLinearDivergence) << "the forward was not merged";
      for (const TensorType& t : n.outputs) EXPECT_NE(t.shape, (Shape{N, V})) << op_name(n.op);
    }
  }
}

// Under `compile: true` the KD step hands both models' final hidden states and heads to
// FusedLinearDivergence (fused_distillation_loss_builder). That graph, in every compile mode,
// gives the eager unfused graph's loss, reports and gradients (its teacher logits formed from
// the same teacher hidden states and head), over 3 chunks of 16 of the 36 tokens, for a
// trained, a tied and a frozen (LoRA-style) student head. Under `compile: true` the forward
// and its backward merge into one sweep and no [tokens x vocab] tensor is left.
TEST(KdStepGraph, FusedHeadsMatchTheUnfusedGraphInEveryCompileMode) {
  struct Head {
    bool tied, frozen;
  };
  const std::vector<DistillationLoss> losses = {{KdDivergence::ForwardKL, 0.5, 1.0},
                                                {KdDivergence::GeneralizedJSD, 0.3, 1.5}};
  for (Head head : {Head{false, false}, Head{true, false}, Head{false, true}})
    for (const DistillationLoss& l : losses) {
      const ModelConfig cfg = tiny_config(head.tied, false);
      const KdCase k = kd_case(cfg, l, head.frozen, DType::F32);
      SCOPED_TRACE(std::string(l.name()) + " tied " + std::to_string(head.tied) + " frozen " +
                   std::to_string(head.frozen));
      expect_fused_matches(k.fused, k.in, k.params, k.want, k.N, cfg.vocab_size, 1e-5, 1e-4);
    }
}

// bf16 weights (`dtype: bf16`): the fused graph reads both heads as stored, a tile at a time,
// and under every compile mode gives the unfused bf16 graph's loss, reports and gradients, its
// teacher logits formed from the same bf16 teacher hidden states and head, to bf16 rounding,
// for a trained and a frozen student head. Under `compile: true` it fuses and no [tokens x
// vocab] tensor is left.
TEST(KdStepGraph, Bf16HeadsFuseAndMatchTheUnfusedBf16Graph) {
  const DistillationLoss l{KdDivergence::ForwardKL, 0.5, 1.0};
  for (bool frozen : {false, true}) {
    SCOPED_TRACE("frozen " + std::to_string(frozen));
    const ModelConfig cfg = tiny_config(false, false);
    const KdCase k = kd_case(cfg, l, frozen, DType::BF16);
    expect_fused_matches(k.fused, k.in, k.params, k.want, k.N, cfg.vocab_size, 1e-2, 3e-2);
  }
}

// A LoRA or QLoRA student whose head is a hook (LoRA on lm_head, an NF4 head, both): the
// unfused graph runs the hook (its logits materialized), the fused one the hook that records
// the head's parts (peft::head_parts_hook). Same teacher and inputs as kd_case.
KdCase hooked_head_case(const ModelConfig& cfg, const DistillationLoss& l, peft::LoraConfig c,
                        bool nf4_head) {
  const int64_t B = kKdB, T = kKdT, Dt = kKdTeacherDim;
  KdCase k;
  k.N = B * T;
  TrainingGraphOptions o;
  o.batch_size = B;
  o.seq_len = T;
  o.trainable = peft::is_adapter_param;
  o.llama = peft::lora_llama_options(c);
  o.loss = distillation_loss_builder(l, 0.4);
  // Every weight (the adapters random, so that B's term is not 0), then the head to NF4.
  k.params =
      init_parameters(graph_parameters(build_training_graph(cfg, o).graph), 7, DType::F32, 0.3);
  auto nf4 = std::make_shared<peft::NF4Store>();
  const std::string head = cfg.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  if (nf4_head) {
    (*nf4)[head] = peft::quantize_nf4(k.params.at(head));
    k.params.erase(head);
  }
  o.llama = peft::lora_llama_options(c, nf4);
  const TrainingGraph eager = build_training_graph(cfg, o);
  auto parts = std::make_shared<KdStudentHead>();
  o.llama.head = peft::head_parts_hook(
      c, [nf4]() -> const peft::NF4Store* { return nf4.get(); }, parts);
  o.loss = fused_distillation_loss_builder(l, 0.4, Dt, parts);
  k.fused = build_training_graph(cfg, o);
  TensorMap extra;
  if (c.dropout > 0) {  // one seed: the two graphs draw the same masks from it
    Tensor seed = Tensor::empty({}, DType::I32);
    seed.data<int32_t>()[0] = 12345;
    extra[peft::kDropoutSeedInput] = seed;
  }
  add_inputs_and_expected(k, cfg, eager, DType::F32, extra);
  return k;
}

// Fused KD on any student head: LoRA on lm_head (its A and B trained inside the fused sweep),
// an NF4 head (QLoRA's, dequantized a tile at a time) and an NF4 head with LoRA on it, untied
// and tied. In every compile mode the fused graph gives the unfused graph's loss, reports and
// adapter gradients (lm_head's A and B included); under `compile: true` the forward merges
// into the backward and no [tokens x vocab] tensor is left.
TEST(KdStepGraph, LoraAndNf4StudentHeadsFuseAndMatchTheUnfusedGraph) {
  const DistillationLoss l{KdDivergence::GeneralizedJSD, 0.3, 1.5};
  struct Head {
    bool lora, nf4, tied;
  };
  for (Head h : {Head{true, false, false}, Head{false, true, false}, Head{true, true, false},
                 Head{true, false, true}, Head{true, true, true}}) {
    SCOPED_TRACE("lora " + std::to_string(h.lora) + " nf4 " + std::to_string(h.nf4) + " tied " +
                 std::to_string(h.tied));
    peft::LoraConfig c;
    c.rank = 2;
    c.alpha = 6;
    c.apply_to_output = h.lora;
    const ModelConfig cfg = tiny_config(h.tied, false);
    const KdCase k = hooked_head_case(cfg, l, c, h.nf4);
    if (h.lora) {
      ASSERT_TRUE(k.want.count("grad:lm_head.lora_A.weight"));
      ASSERT_TRUE(k.want.count("grad:lm_head.lora_B.weight"));
    }
    expect_fused_matches(k.fused, k.in, k.params, k.want, k.N, cfg.vocab_size, 1e-5, 1e-4);
  }
}

// DoRA and lora_dropout on lm_head inside the fused kernel: the head hook hands it the
// adapter's dropped-out input (the same Dropout node, seed and salt as the LoRA hook's: the
// same mask) and DoRA's column scale magnitude / ||W + s B A||_row. In every compile mode the
// fused graph gives the unfused graph's loss, reports and gradients (the magnitude's, A's and
// B's included, and through the dropout the hidden states'), untied and tied; under
// `compile: true` no [tokens x vocab] tensor is left.
TEST(KdStepGraph, DoraAndDropoutOnTheHeadFuseAndMatchTheUnfusedGraph) {
  const DistillationLoss l{KdDivergence::GeneralizedJSD, 0.3, 1.5};
  struct Head {
    bool dora;
    double dropout;
    bool tied;
  };
  for (Head h : {Head{true, 0, false}, Head{false, 0.3, false}, Head{true, 0.3, false},
                 Head{true, 0.3, true}}) {
    SCOPED_TRACE("dora " + std::to_string(h.dora) + " dropout " + std::to_string(h.dropout) +
                 " tied " + std::to_string(h.tied));
    peft::LoraConfig c;
    c.rank = 2;
    c.alpha = 6;
    c.apply_to_output = true;
    c.use_dora = h.dora;
    c.dropout = h.dropout;
    const ModelConfig cfg = tiny_config(h.tied, false);
    const KdCase k = hooked_head_case(cfg, l, c, false);
    ASSERT_TRUE(k.want.count("grad:lm_head.lora_B.weight"));
    if (h.dora) {
      ASSERT_TRUE(k.want.count("grad:lm_head.lora_magnitude_vector"));
    }
    expect_fused_matches(k.fused, k.in, k.params, k.want, k.N, cfg.vocab_size, 1e-5, 1e-4);
  }
}

// A top-k teacher (teacher_logits): the fused graph takes its ids and log-probs [N, k] (no
// teacher head) and in every compile mode gives the unfused graph's loss, reports and
// gradients, that graph taking them scattered into dense teacher logits (-1e30 elsewhere), in
// fp32 and bf16 (there to bf16 rounding: the unfused graph's logits are bf16); under `compile:
// true` no [tokens x vocab] tensor is left.
TEST(KdStepGraph, TopKTeacherFusesAndMatchesTheUnfusedGraph) {
  const DistillationLoss l{KdDivergence::ForwardKL, 0.5, 1.5};
  const int64_t B = 3, T = 12, Dt = 24, K = 5;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ModelConfig cfg = tiny_config(false, false);
    const int64_t N = B * T, V = cfg.vocab_size;
    TrainingGraphOptions o;
    o.batch_size = B;
    o.seq_len = T;
    o.dtype = dtype;
    o.loss = distillation_loss_builder(l, 0.4);
    const TrainingGraph eager = build_training_graph(cfg, o);
    o.loss = fused_distillation_loss_builder(l, 0.4, Dt, nullptr, K);
    const TrainingGraph fused = build_training_graph(cfg, o);
    const TensorMap params = init_parameters(graph_parameters(eager.graph), 7, dtype, 0.3);
    const Batch b = random_batch(B, T, V, 11);
    TensorMap in = batch_inputs(b, DType::F32, 1.0 / double(b.num_valid_labels()));
    const Tensor th = random_tensor({N, Dt}, DType::F32, 5, -0.6, 0.6);
    const Tensor tw = random_tensor({V, Dt}, DType::F32, 6, -0.6, 0.6);
    Tensor ids = Tensor::empty({N, K}, DType::I32), lp = Tensor::empty({N, K}, DType::F32);
    kernels::teacher_top_k<float>(th.data<float>(), tw.data<float>(), nullptr, N, Dt, V, K, 16,
                                  ids.data<int32_t>(), lp.data<float>());
    Tensor dense = Tensor::empty({N, V}, DType::F32);
    for (int64_t i = 0; i < N; ++i)
      kernels::scatter_top_k<float>(ids.data<int32_t>() + i * K, lp.data<float>() + i * K, K, V,
                                    dense.data<float>() + i * V);
    TensorMap ein = in;
    ein["teacher_logits"] = dense.to(dtype);
    in["teacher_topk_ids"] = ids;
    in["teacher_topk_logprobs"] = lp;
    const auto want =
        by_name(eager.graph,
                compile_graph(eager.graph, {.mode = CompileMode::None}).executor->run(ein, params));
    const bool bf16 = dtype == DType::BF16;
    expect_fused_matches(fused, in, params, want, N, V, bf16 ? 1e-2 : 1e-5, bf16 ? 3e-2 : 1e-4);
  }
}

// The fused divergence has no soft-cap: a model that caps its final logits (Gemma 2), as
// student or whole teacher (not a top-k one), keeps the logits path, as do the eager modes and a
// head hook that cannot hand its parts (DoRA or dropout on lm_head).
TEST(KdStepGraph, OnlyUncappedHeadsThatHandTheirPartsFuseUnderCompileTrue) {
  const ModelConfig plain = tiny_config(false, false);
  ModelConfig capped = plain;
  capped.final_logit_softcapping = 30.0;
  const LlamaOptions none;
  EXPECT_TRUE(kd_fuses_heads(CompileMode::Full, none, plain, plain, false));
  EXPECT_FALSE(kd_fuses_heads(CompileMode::Full, none, capped, plain, false));
  EXPECT_FALSE(kd_fuses_heads(CompileMode::Full, none, plain, capped, false));
  // A top-k teacher's cap is in its log-probs: only the student's head is in the step.
  EXPECT_TRUE(kd_fuses_heads(CompileMode::Full, none, plain, capped, false, true));
  EXPECT_FALSE(kd_fuses_heads(CompileMode::Full, none, capped, plain, false, true));
  EXPECT_FALSE(kd_fuses_heads(CompileMode::Model, none, plain, plain, false));
  LlamaOptions hooked;
  hooked.head = [](Builder&, Value x, const LinearSite&) { return x; };
  EXPECT_FALSE(kd_fuses_heads(CompileMode::Full, hooked, plain, plain, false));
  EXPECT_TRUE(kd_fuses_heads(CompileMode::Full, hooked, plain, plain, true));
  EXPECT_FALSE(kd_fuses_heads(CompileMode::Model, hooked, plain, plain, true));
}

// The loss is (1 - kd_ratio) CE + kd_ratio KD, each its sum over the labels times the scale.
TEST(KdStepGraph, LossMixesCrossEntropyAndTheDivergence) {
  const ModelConfig cfg = tiny_config(false, false);
  const int64_t B = 2, T = 6;
  const Batch b = random_batch(B, T, cfg.vocab_size, 3);
  TensorMap in = batch_inputs(b, DType::F32, 0.25);
  in["teacher_logits"] = random_logits(B * T, cfg.vocab_size, 9);
  TensorMap params;
  for (double ratio : {0.0, 0.3, 1.0}) {
    TrainingGraphOptions o;
    o.batch_size = B;
    o.seq_len = T;
    o.loss = distillation_loss_builder({KdDivergence::ReverseKL, 0.5, 1.0}, ratio);
    TrainingGraph tg = build_training_graph(cfg, o);
    if (params.empty()) params = init_parameters(graph_parameters(tg.graph), 1, DType::F32, 0.3);
    const auto out = compile_graph(tg.graph, {}).executor->run(in, params);
    std::map<std::string, double> v;
    for (size_t k = 0; k < out.size(); ++k)
      if (out[k].numel() == 1) v[tg.graph.outputs()[k].first] = element_as_double(out[k], 0);
    EXPECT_NEAR(v["loss"], 0.25 * ((1 - ratio) * v["report:ce_sum"] + ratio * v["report:kd_sum"]),
                1e-5 * std::abs(v["loss"]) + 1e-7)
        << ratio;
  }
}

Config kd_yaml(const std::string& teacher_vocab) {
  return Config::from_string(
      "output_dir: /tmp/x\n"
      "model: {init: random, vocab_size: 259, hidden_size: 16, intermediate_size: 32,\n"
      "        num_hidden_layers: 1, num_attention_heads: 2}\n"
      "teacher_model: {init: random, vocab_size: " +
          teacher_vocab +
          ", hidden_size: 32, intermediate_size: 64,\n"
          "        num_hidden_layers: 2, num_attention_heads: 4}\n"
          "tokenizer: {_component_: byte}\n"
          "dataset: {_component_: text_completion, source: x.txt}\n"
          "optimizer: {_component_: AdamW, lr: 1e-3}\n"
          "kd_loss: {_component_: torchtune.modules.loss.ForwardKLWithChunkedOutputLoss}\n"
          "kd_ratio: 0.5\n",
      "kd.yaml");
}

TEST(KdRecipe, TeacherOfAnotherVocabularyIsAValidationError) {
  EXPECT_NO_THROW(validate(kd_yaml("259"), knowledge_distillation_schema()));
  try {
    validate(kd_yaml("300"), knowledge_distillation_schema());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "model.vocab_size is 259, teacher_model.vocab_size 300"))
        << e.what();
  }
  // From checkpoints (whose config.json validation does not open) the recipe checks the
  // architectures before it reads a weight.
  ModelConfig s = tiny_config(false, false), t = tiny_config(false, false);
  t.vocab_size = 20;
  try {
    check_same_vocabulary(s, t);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(
        contains(e.what(), "the student's vocab_size is 13, the teacher's (teacher_model) 20"))
        << e.what();
  }
}

TEST(KdRecipe, KdLossKeysAreValidated) {
  Config c = kd_yaml("259");
  c.apply_overrides({"kd_loss.beta=0.5"});  // only the generalized JSD has a beta
  EXPECT_THROW(validate(c, knowledge_distillation_schema()), Error);
  c = kd_yaml("259");
  c.apply_overrides(
      {"kd_loss._component_=GeneralizedJSDLoss", "kd_loss.beta=0.25", "kd_loss.temperature=2"});
  validate(c, knowledge_distillation_schema());
  const DistillationLoss l =
      distillation_loss_from(with_defaults(c, knowledge_distillation_schema()));
  EXPECT_EQ(l.kind, KdDivergence::GeneralizedJSD);
  EXPECT_EQ(l.beta, 0.25);
  EXPECT_EQ(l.temperature, 2.0);
}

// `fusetune plan` counts a KD config's teacher: its weights in every mode, and what its
// forward hands the student's step, held through it (the [tokens x vocab] logits under false
// and model; under true the final hidden states, the student's graph being the fused one).
TEST(KdPlan, CountsTheTeacherWeightsAndWhatItsForwardHandsOver) {
  Config c = kd_yaml("259");
  c.apply_overrides({"tokenizer.max_seq_len=64", "batch_size=2"});
  validate(c, knowledge_distillation_schema());
  c = with_defaults(c, knowledge_distillation_schema());
  const PlannedStep s = plan_step(c, "knowledge_distillation_single_device", model_architecture(c));
  ASSERT_TRUE(s.teacher.has_value());
  ASSERT_TRUE(s.fused_kd_graph.has_value());
  PlannedStep student_only = s;
  student_only.teacher.reset();
  student_only.fused_kd_graph.reset();
  int64_t teacher_bytes = 0;
  for (const ParamInfo& p : graph_parameters(build_logits_graph(*s.teacher, 1, 1, DType::F32))) {
    int64_t n = 4;
    for (int64_t d : p.shape) n *= d;
    teacher_bytes += n;
  }
  const int64_t logits_bytes = 2 * 64 * 259 * 4;
  std::map<CompileMode, ModePlan> kd;
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full}) {
    SCOPED_TRACE(compile_mode_name(mode));
    kd[mode] = plan_step_mode(s, mode);
    const ModePlan alone = plan_step_mode(student_only, mode);
    // The teacher's weights and its graph's RoPE tables (cos and sin, [64, 4] each).
    EXPECT_EQ(kd[mode].memory.parameters, alone.memory.parameters + teacher_bytes + 2 * 64 * 4 * 4);
    if (mode != CompileMode::Full) {
      EXPECT_GE(kd[mode].memory.activations, alone.memory.activations + logits_bytes);
    }
    EXPECT_TRUE(std::any_of(kd[mode].passes.begin(), kd[mode].passes.end(), [](const auto& l) {
      return l.rfind("teacher (frozen, ", 0) == 0;
    })) << ::testing::PrintToString(kd[mode].passes);
  }
  // Fused, neither model's logits exist: the step needs more than one [tokens x vocab] block
  // less than under compile: model.
  EXPECT_LT(kd[CompileMode::Full].memory.total(),
            kd[CompileMode::Model].memory.total() - logits_bytes);
}

// `fusetune plan` of a LoRA student with an adapter on lm_head (as distillation_job runs it:
// adapters trained, the base frozen) plans the fused step: the head's base weight and its A and
// scale * B in one FusedLinearDivergence, no [tokens x vocab] tensor.
TEST(KdPlan, ALoraHeadStudentPlansTheFusedHead) {
  Config c = kd_yaml("259");
  c.apply_overrides({"tokenizer.max_seq_len=64", "batch_size=2", "model.lora_attn_modules=[q_proj]",
                     "model.apply_lora_to_output=true", "model.lora_rank=4"});
  validate(c, knowledge_distillation_schema());
  c = with_defaults(c, knowledge_distillation_schema());
  const PlannedStep s = plan_step(c, "knowledge_distillation_single_device", model_architecture(c));
  ASSERT_TRUE(s.fused_kd_graph.has_value());
  const Graph& g = s.fused_kd_graph->graph;
  int fused = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == Op::FusedLinearDivergence) {
      ++fused;
      EXPECT_EQ(n.inputs.size(), 7u);  // h, W, teacher h and W, labels, A, scale * B
    }
    for (const TensorType& t : n.outputs) EXPECT_NE(t.shape, (Shape{128, 259})) << op_name(n.op);
  }
  EXPECT_EQ(fused, 1);
  const auto& names = s.fused_kd_graph->trainable_params;
  EXPECT_NE(std::find(names.begin(), names.end(), "lm_head.lora_B.weight"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());
}

// `fusetune plan` with teacher_logits: the fused step takes the teacher's top-k (no teacher
// head); with precompute, the teacher is counted while its file is missing (the first run
// loads it to compute the file) and not once the file is there (the run does not load it).
TEST(KdPlan, APrecomputedTeacherIsNotCountedOnceItsFileIsThere) {
  TempDir tmp;
  Config c = kd_yaml("259");
  c.apply_overrides({"tokenizer.max_seq_len=64", "batch_size=2", "teacher_logits.top_k=8",
                     "teacher_logits.precompute=true",
                     "teacher_logits.path=" + (tmp / "topk").string()});
  validate(c, knowledge_distillation_schema());
  c = with_defaults(c, knowledge_distillation_schema());
  const PlannedStep first =
      plan_step(c, "knowledge_distillation_single_device", model_architecture(c));
  ASSERT_TRUE(first.teacher.has_value());
  ASSERT_TRUE(first.fused_kd_graph.has_value());
  int fused = 0;
  for (const Node& n : first.fused_kd_graph->graph.nodes())
    if (n.op == Op::FusedLinearDivergence) {
      ++fused;
      EXPECT_EQ(n.attrs.len, 8);
    }
  EXPECT_EQ(fused, 1);
  fs::create_directories(tmp / "topk");
  write_text(tmp / "topk" / "teacher_topk.safetensors", "x");
  const PlannedStep later =
      plan_step(c, "knowledge_distillation_single_device", model_architecture(c));
  EXPECT_FALSE(later.teacher.has_value());
  EXPECT_LT(plan_step_mode(later, CompileMode::Full).memory.parameters,
            plan_step_mode(first, CompileMode::Full).memory.parameters);
}

// `fusetune plan --nproc_per_node N` at ZeRO-3 counts the teacher sharded over the ranks
// (each rank its share of the weights, plus what its forward gathers and, fused, the gathered
// head): on 2 ranks each rank's teacher (6 layers, so that the layers outweigh the embedding
// and the head) costs less than the whole teacher does one rank, and more than nothing.
TEST(KdPlan, ZeroThreeShardsTheTeacherOverTheRanks) {
  Config c = kd_yaml("259");
  c.apply_overrides({"tokenizer.max_seq_len=64", "batch_size=2",
                     "teacher_model.num_hidden_layers=6", "teacher_model.hidden_size=64",
                     "teacher_model.intermediate_size=256"});
  c = with_defaults(c, knowledge_distillation_schema());
  const PlannedStep s = plan_step(c, "knowledge_distillation_single_device", model_architecture(c));
  PlannedStep student_only = s;
  student_only.teacher.reset();
  for (CompileMode mode : {CompileMode::None, CompileMode::Full}) {
    SCOPED_TRACE(compile_mode_name(mode));
    const int64_t whole = plan_zero3_rank_peaks(s, mode, 1)[0].bytes -
                          plan_zero3_rank_peaks(student_only, mode, 1)[0].bytes;
    const std::vector<RankPeak> kd = plan_zero3_rank_peaks(s, mode, 2);
    const std::vector<RankPeak> alone = plan_zero3_rank_peaks(student_only, mode, 2);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_GT(kd[r].bytes, alone[r].bytes) << "rank " << r;
      EXPECT_LT(kd[r].bytes - alone[r].bytes, whole) << "rank " << r;
    }
  }
}

// The demo's tiny model shrunk as the student and a random teacher twice its size, with
// `extra` on top.
Overrides tiny_kd_models(const Overrides& extra) {
  Overrides kd = {{"model.hidden_size", "16"},
                  {"model.intermediate_size", "32"},
                  {"model.num_hidden_layers", "1"},
                  {"teacher_model.init", "random"},
                  {"teacher_model.vocab_size", "259"},
                  {"teacher_model.hidden_size", "32"},
                  {"teacher_model.intermediate_size", "64"},
                  {"teacher_model.num_hidden_layers", "2"},
                  {"teacher_model.num_attention_heads", "4"}};
  for (const auto& [k, v] : extra) kd[k] = v;
  return kd;
}

// The demo's tiny model as the student, a random teacher twice its size, a few steps in each
// compile mode: the run succeeds and logs the two parts of the loss.
TEST(KdRecipe, TrainsAStudentAndLogsClassAndKdLoss) {
  for (const char* compile : {"false", "true"}) {
    TempDir tmp;
    Overrides o =
        demo_overrides(tmp / "out", tiny_kd_models({{"dataset.packed", "false"},
                                                    {"max_steps_per_epoch", "3"},
                                                    {"kd_loss._component_", "ReverseKLLoss"},
                                                    {"kd_ratio", "0.7"},
                                                    {"compile", compile}}));
    const CliRun r = run_shell(
        run_command("knowledge_distillation_single_device", "demo/tiny_full", o), tmp / "io");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(printed_steps(r.out).size(), 3u) << r.out;
    EXPECT_TRUE(contains(r.out, "class_loss:")) << r.out;
    EXPECT_TRUE(contains(r.out, "kd_loss:")) << r.out;
    EXPECT_TRUE(fs::exists(tmp / "out" / "epoch_0" / "model.safetensors"));
  }
}

// The KD run of the distributed test: the demo's tiny model as the student (every weight), a
// random teacher twice its size, the uneven corpus (each rank's label count differs), `batch`
// rows per rank, 6 steps, a checkpoint at step 3.
Overrides dist_kd_overrides(const fs::path& out, const fs::path& corpus, int batch,
                            const Overrides& extra) {
  Overrides kd = tiny_kd_models(
      {{"kd_loss._component_", "ForwardKLLoss"}, {"kd_ratio", "0.7"}, {"save_every_n_steps", "3"}});
  for (const auto& [k, v] : extra) kd[k] = v;
  return rank_run_overrides(out, corpus, batch, 6, kd);
}

// A LoRA student with an adapter on lm_head, and a QLoRA one (its head NF4, with the adapter),
// and LoRA students with DoRA or lora_dropout on lm_head, run end to end: under `compile: true`
// the log says the heads are fused and the losses are `compile: false`'s (the logits
// materialized) to 1e-5.
TEST(KdRecipe, LoraAndQloraHeadStudentsTrainFusedAsUnfused) {
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  const auto run = [&](const std::string& name, Overrides extra) {
    extra["model.lora_attn_modules"] = "[q_proj,v_proj]";
    extra["model.apply_lora_to_output"] = "true";
    extra["model.lora_rank"] = "4";
    extra["model.lora_alpha"] = "8";
    const CliRun r = run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                                           dist_kd_overrides(tmp / name, corpus, 4, extra)),
                               tmp / ("s_" + name));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r;
  };
  for (const char* qlora : {"false", "true"}) {
    SCOPED_TRACE(std::string("quantize_base ") + qlora);
    const std::string q = qlora;
    const CliRun fused = run("fused" + q, {{"compile", "true"}, {"model.quantize_base", q}});
    EXPECT_TRUE(contains(fused.out,
                         "kd: the student's head and the teacher's head run inside the "
                         "fused divergence"))
        << fused.out;
    run("unfused" + q, {{"compile", "false"}, {"model.quantize_base", q}});
    const std::vector<double> want = losses_of(logged_steps(tmp / ("unfused" + q)));
    ASSERT_EQ(want.size(), 6u);
    expect_same_curve(losses_of(logged_steps(tmp / ("fused" + q))), want, "fused vs unfused");
  }
  // DoRA and lora_dropout on lm_head fuse too: the same curve as their logits path (dropout:
  // the same masks, drawn from the step's seed), and the same val_loss (validation runs the
  // head without dropout, and so without the seed input).
  for (const auto& [name, key, value] : {std::tuple{"dora", "model.use_dora", "true"},
                                         std::tuple{"dropout", "model.lora_dropout", "0.2"}}) {
    SCOPED_TRACE(name);
    Overrides o = {{key, value},
                   {"max_steps_per_epoch", "3"},
                   {"dataset_val._component_", "text_completion"},
                   {"dataset_val.source", corpus.string()},
                   {"dataset_val.split", "train[:5]"},
                   {"dataset_val.packed", "false"},
                   {"run_val_every_n_steps", "3"}};
    o["compile"] = "true";
    const CliRun fused = run(std::string("fused_") + name, o);
    EXPECT_TRUE(contains(fused.out, "kd: the student's head and the teacher's head run inside"))
        << fused.out;
    o["compile"] = "false";
    run(std::string("unfused_") + name, o);
    const fs::path unfused = tmp / (std::string("unfused_") + name);
    const fs::path fused_dir = tmp / (std::string("fused_") + name);
    const std::vector<double> want = losses_of(logged_steps(unfused));
    ASSERT_EQ(want.size(), 3u);
    expect_same_curve(losses_of(logged_steps(fused_dir)), want,
                      std::string(name) + ", fused vs unfused");
    ASSERT_EQ(logged_values(unfused, "val_loss").size(), 1u);
    expect_same_curve(logged_values(fused_dir, "val_loss"), logged_values(unfused, "val_loss"),
                      std::string(name) + ", val_loss");
  }
}

// teacher_logits (the teacher restricted to its top-16 tokens): a run that precomputes them
// into a file and trains from it (compile: true, the fused kernel reading the sparse teacher;
// compile: false, the unfused divergence over them scattered) gives the losses of a run that
// computes the same top-16 from the teacher every step; the precomputed run's step-3
// checkpoint resumes on that curve from the file without loading the teacher.
TEST(KdTopK, PrecomputedLogitsMatchTheOnTheFlyTopKAndResume) {
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  const fs::path fly = tmp / "fly", pre = tmp / "pre", eager = tmp / "eager", res = tmp / "res";
  const fs::path file = tmp / "topk" / "teacher_topk.safetensors";
  const Overrides top16 = {{"teacher_logits.top_k", "16"}};
  Overrides precompute = top16;
  precompute["teacher_logits.precompute"] = "true";
  precompute["teacher_logits.path"] = (tmp / "topk").string();
  run_ok(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                     dist_kd_overrides(fly, corpus, 4, top16)),
         tmp / "s_fly");
  const std::vector<double> want = losses_of(logged_steps(fly));
  ASSERT_EQ(want.size(), 6u);
  const CliRun first =
      run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                            dist_kd_overrides(pre, corpus, 4, precompute)),
                tmp / "s_pre");
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_TRUE(contains(first.out, "teacher_logits: computing the teacher's top-16")) << first.out;
  ASSERT_TRUE(fs::exists(file));
  expect_same_curve(losses_of(logged_steps(pre)), want, "precomputed vs on the fly");
  for (const char* key : {"class_loss", "kd_loss"})
    expect_same_curve(logged_values(pre, key), logged_values(fly, key), key);
  Overrides unfused = precompute;
  unfused["compile"] = "false";
  run_ok(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                     dist_kd_overrides(eager, corpus, 4, unfused)),
         tmp / "s_eager");
  expect_same_curve(losses_of(logged_steps(eager)), want, "precomputed, compile: false");
  fs::create_directories(res);
  fs::copy(pre / "step_3", res / "step_3", fs::copy_options::recursive);
  Overrides resume = precompute;
  resume["resume_from_checkpoint"] = "true";
  const CliRun resumed =
      run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                            dist_kd_overrides(res, corpus, 4, resume)),
                tmp / "s_res");
  ASSERT_EQ(resumed.code, 0) << resumed.out << resumed.err;
  EXPECT_TRUE(contains(resumed.out, "(not loaded)")) << resumed.out;
  EXPECT_FALSE(contains(resumed.out, "computing")) << resumed.out;
  expect_same_curve(losses_of(logged_steps(res)), std::vector<double>(want.begin() + 3, want.end()),
                    "resumed from the file");
}

// A teacher that soft-caps its logits (Gemma 2's final_logit_softcapping) with top-k logits:
// its top-k log-probs are those of its capped distribution (the kernel's test checks them in
// double: FusedDivergenceKernel.TopKOfASoftCappedTeacherHasTheCappedDistributionsLogProbs),
// so under `compile: true` the student's head still fuses (the teacher has no head in the
// step) and trains on `compile: false`'s losses, to 1e-5; the cap changes the KD loss.
TEST(KdTopK, ASoftCappedTeacherTrainsFromTheTopKOfItsCappedLogits) {
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  // A random Gemma 2 teacher (its config.json: the family that reads the caps). Its logits are
  // about 0.1: a cap of 0.05 bends every one of them; null is no cap.
  const auto teacher_json = [&](const std::string& name, const std::string& cap) {
    const fs::path p = tmp / (name + ".json");
    write_text(p,
               "{\"model_type\": \"gemma2\", \"vocab_size\": 259, \"hidden_size\": 32, "
               "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
               "\"num_key_value_heads\": 2, \"head_dim\": 8, \"max_position_embeddings\": 256, "
               "\"attn_logit_softcapping\": null, \"final_logit_softcapping\": " +
                   cap + "}");
    return p.string();
  };
  const auto run = [&](const std::string& name, const std::string& compile,
                       const std::string& cap) {
    Overrides o = dist_kd_overrides(
        tmp / name, corpus, 4,
        {{"teacher_logits.top_k", "16"}, {"max_steps_per_epoch", "3"}, {"compile", compile}});
    for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads"})
      o.erase(std::string("teacher_model.") + key);
    o["teacher_model.config"] = teacher_json(name, cap);
    const CliRun r =
        run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full", o),
                  tmp / ("s_" + name));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return r;
  };
  const CliRun fused = run("fused", "true", "0.05");
  EXPECT_TRUE(contains(fused.out,
                       "kd: the student's head and the teacher's top-k run inside the fused "
                       "divergence"))
      << fused.out;
  run("unfused", "false", "0.05");
  const std::vector<double> want = logged_values(tmp / "unfused", "kd_loss");
  ASSERT_EQ(want.size(), 3u);
  expect_same_curve(logged_values(tmp / "fused", "kd_loss"), want, "kd_loss, fused vs unfused");
  expect_same_curve(losses_of(logged_steps(tmp / "fused")),
                    losses_of(logged_steps(tmp / "unfused")), "losses, fused vs unfused");
  // The same run without the cap (the runs are deterministic: any change is the cap's). A
  // random teacher is near uniform either way, so the change is small, but well above 1e-5.
  run("uncapped", "true", "null");
  EXPECT_GT(std::abs(logged_values(tmp / "uncapped", "kd_loss")[0] - want[0]), 1e-5 * want[0]);
}

// Validation data with a top-k teacher: the validation loss takes the validation samples'
// top-k, as training takes its own. Precomputed, they come from their own file
// (teacher_topk_val.safetensors, keyed by dataset_val's fingerprint), computed with the
// training file by the one teacher load (samples 40-44 of the corpus: not the training file's
// first rows, which validation must not read); its val_loss (a partial last batch included) and
// losses are those of the run computing the top-k from the teacher every step, to 1e-5.
// Another dataset_val is an error naming that file.
TEST(KdTopK, ValidationReadsItsOwnPrecomputedFile) {
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  const fs::path val_file = tmp / "topk" / "teacher_topk_val.safetensors";
  Overrides fly = {
      {"teacher_logits.top_k", "16"},          {"dataset_val._component_", "text_completion"},
      {"dataset_val.source", corpus.string()}, {"dataset_val.split", "train[40:45]"},
      {"dataset_val.packed", "false"},         {"run_val_every_n_steps", "3"}};
  Overrides pre = fly;
  pre["teacher_logits.precompute"] = "true";
  pre["teacher_logits.path"] = (tmp / "topk").string();
  run_ok(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                     dist_kd_overrides(tmp / "fly", corpus, 4, fly)),
         tmp / "s_fly");
  const std::vector<double> want = logged_values(tmp / "fly", "val_loss");
  ASSERT_EQ(want.size(), 2u);
  const CliRun r = run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                                         dist_kd_overrides(tmp / "pre", corpus, 4, pre)),
                             tmp / "s_pre");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "over 5 samples into " + val_file.string())) << r.out;
  ASSERT_TRUE(fs::exists(val_file));
  expect_same_curve(logged_values(tmp / "pre", "val_loss"), want, "val_loss, precomputed");
  expect_same_curve(losses_of(logged_steps(tmp / "pre")), losses_of(logged_steps(tmp / "fly")),
                    "losses, precomputed");
  pre["dataset_val.split"] = "train[40:46]";
  const CliRun other =
      run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                            dist_kd_overrides(tmp / "other", corpus, 4, pre)),
                tmp / "s_other");
  EXPECT_NE(other.code, 0);
  EXPECT_TRUE(
      contains(other.out + other.err, val_file.string() + " was computed for another dataset"))
      << other.out << other.err;
}

// The precomputed file is checked before training: computed for another teacher, another
// dataset or another top_k, or corrupt (a flipped byte, cut short), the run stops with an
// error naming the file and what differs.
TEST(KdTopK, APrecomputedFileOfAnotherRunOrCorruptIsAClearError) {
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  const fs::path file = tmp / "topk" / "teacher_topk.safetensors";
  const Overrides precompute = {{"teacher_logits.top_k", "8"},
                                {"teacher_logits.precompute", "true"},
                                {"teacher_logits.path", (tmp / "topk").string()},
                                {"max_steps_per_epoch", "1"}};
  const auto run = [&](const std::string& name, const Overrides& extra) {
    Overrides o = precompute;
    for (const auto& [k, v] : extra) o[k] = v;
    return run_shell(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                                 dist_kd_overrides(tmp / name, corpus, 4, o)),
                     tmp / ("s_" + name));
  };
  const CliRun ok = run("ok", {});
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const auto expect_error = [&](const CliRun& r, const std::string& what) {
    EXPECT_NE(r.code, 0) << what;
    EXPECT_TRUE(contains(r.out + r.err, file.string())) << r.out << r.err;
    EXPECT_TRUE(contains(r.out + r.err, what)) << r.out << r.err;
  };
  expect_error(run("teacher", {{"teacher_model.hidden_size", "48"}}),
               "was computed for another teacher");
  std::string other;
  for (int i = 0; i < 8; ++i)
    other += "{\"text\": \"another corpus, row " + std::to_string(i) + "\"}\n";
  fs::create_directories(tmp / "data2");
  write_text(tmp / "data2" / "corpus.jsonl", other);
  expect_error(run("dataset", {{"dataset.source", (tmp / "data2" / "corpus.jsonl").string()}}),
               "was computed for another dataset");
  expect_error(run("k", {{"teacher_logits.top_k", "4"}}), "was computed for another top_k");
  std::string bytes = fusetune::read_file(file);
  bytes[bytes.size() / 2] = char(bytes[bytes.size() / 2] ^ 0x5a);
  write_text(file, bytes);
  expect_error(run("flipped", {}), "is corrupt (checksum mismatch)");
  write_text(file, bytes.substr(0, 40));
  expect_error(run("short", {}), "is corrupt");
}

// teacher_logits is validated: top_k at least 1, precompute with a path (and a path only with
// it; validation data allowed), and only the forward KL (the divergence defined on the top-k
// support).
TEST(KdTopK, TeacherLogitsKeysAreValidated) {
  const auto problems = [](const std::vector<std::string>& overrides) -> std::string {
    Config c = kd_yaml("259");
    c.apply_overrides(overrides);
    try {
      validate(c, knowledge_distillation_schema());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(problems({"teacher_logits.top_k=32"}), "");
  EXPECT_EQ(problems({"teacher_logits.top_k=32", "teacher_logits.precompute=true",
                      "teacher_logits.path=/tmp/t"}),
            "");
  EXPECT_NE(problems({"teacher_logits.top_k=0"}), "");
  EXPECT_TRUE(contains(problems({"teacher_logits.top_k=8", "teacher_logits.precompute=true"}),
                       "needs teacher_logits.path"));
  EXPECT_TRUE(contains(problems({"teacher_logits.top_k=8", "teacher_logits.path=/tmp/t"}),
                       "only read with precompute: true"));
  // Validation data has its own file (KdTopK.ValidationReadsItsOwnPrecomputedFile).
  EXPECT_EQ(problems({"teacher_logits.top_k=8", "teacher_logits.precompute=true",
                      "teacher_logits.path=/tmp/t", "dataset_val._component_=text_completion",
                      "dataset_val.source=v.txt"}),
            "");
  EXPECT_TRUE(contains(problems({"teacher_logits.top_k=8", "kd_loss._component_=ReverseKLLoss"}),
                       "takes kd_loss ForwardKLLoss"));
}

// A stand-in teacher's top-k for the file-writing tests: a function of each sample's index
// and position alone (as a real teacher's is of its tokens), whatever batch it is in.
void fake_top_k_of(const Batch& b, Tensor& ids, Tensor& logprobs, int64_t K, int64_t V) {
  ids = Tensor::zeros({b.batch_size * b.seq_len, K}, DType::I32);
  logprobs = Tensor::zeros({b.batch_size * b.seq_len, K}, DType::F32);
  for (int64_t r = 0; r < b.batch_size; ++r)
    for (int64_t t = 0; t < b.seq_len; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t at = (r * b.seq_len + t) * K + k, s = b.items[size_t(r)];
        ids.data<int32_t>()[at] = int32_t((s * 5 + t + k) % V);
        logprobs.data<float>()[at] = -float(s) - 0.01f * float(t) - 0.1f * float(k);
      }
}

// Over ranks each rank computes its share of the batches (batch k: rank k % ranks) into a
// part file, and the merge of the parts is byte for byte the one-process file, for 2 and 3
// ranks over 7 samples in batches of 2 (uneven shares, a short last batch); the parts are
// deleted after. A part of another run (another top_k, another split) is refused by name.
TEST(KdTopK, SharesOfAnyRankCountMergeIntoTheOneProcessFile) {
  TempDir tmp;
  constexpr int64_t K = 3, V = 11;
  std::vector<Sample> samples;
  for (int i = 0; i < 7; ++i) {
    Sample s;
    for (int t = 0; t < 1 + (i * 4) % 9; ++t) s.tokens.push_back(int32_t(1 + (i + t) % 10));
    s.labels = s.tokens;
    samples.push_back(s);
  }
  const SampleDataset d(samples, {});
  CollateOptions collate;
  collate.pad_multiple = 4;
  TeacherTopKKey key;
  key.top_k = K;
  key.vocab_size = V;
  key.samples = d.size();
  key.dataset = dataset_fingerprint(d);
  const TopKOfBatch f = [](const Batch& b, Tensor& ids, Tensor& lp) {
    fake_top_k_of(b, ids, lp, K, V);
  };
  const fs::path one = tmp / "one" / "teacher_topk.safetensors";
  write_teacher_topk(one, key, d, collate, 2, f);
  for (const int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const fs::path merged = tmp / std::to_string(ranks) / "teacher_topk.safetensors";
    for (int r = 0; r < ranks; ++r)
      write_teacher_topk_part(merged, key, d, collate, 2, r, ranks, f);
    merge_teacher_topk_parts(merged, key, 2, ranks);
    EXPECT_EQ(fusetune::read_file(merged), fusetune::read_file(one));
    for (int r = 0; r < ranks; ++r)
      EXPECT_FALSE(fs::exists(teacher_topk_part_file(merged, r, ranks)));
  }
  const fs::path bad = tmp / "bad" / "teacher_topk.safetensors";
  write_teacher_topk_part(bad, key, d, collate, 2, 0, 2, f);
  TeacherTopKKey other = key;
  other.top_k = 2;
  write_teacher_topk_part(
      bad, other, d, collate, 2, 1, 2,
      [](const Batch& b, Tensor& i, Tensor& l) { fake_top_k_of(b, i, l, 2, V); });
  EXPECT_TRUE(contains(error_of([&] { merge_teacher_topk_parts(bad, key, 2, 2); }),
                       teacher_topk_part_file(bad, 1, 2).string() +
                           " is not a part of this run's file (its top_k)"));
  write_teacher_topk_part(bad, key, d, collate, 3, 1, 2, f);
  EXPECT_TRUE(contains(error_of([&] { merge_teacher_topk_parts(bad, key, 2, 2); }), "(its rows)"));
}

// knowledge_distillation_distributed, 2 ranks x 1 thread at ZeRO-3 (the student sharded, the
// frozen teacher sharded too, each rank loading only its share and gathering the others' for
// its forward; compile: true as the demo config: the fused heads): 2 ranks
// x 2 rows give the losses and the class_loss / kd_loss of one process x 4 rows (the loss is a
// mean over the global unmasked labels, the metrics' sums and counts are reduced before
// dividing), and the 2-rank checkpoint of step 3 resumes in one process on that curve.
TEST(DistKd, TwoRanksMatchOneProcessAndResumeInOne) {
  FT_REQUIRE_MPIRUN();
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  const fs::path ref = tmp / "ref", two = tmp / "two", to_one = tmp / "to_one";
  run_ok(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                     dist_kd_overrides(ref, corpus, 4, {})),
         tmp / "s_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 6u);
  const CliRun r2 =
      run_shell(mpirun_command(2, "knowledge_distillation_distributed", "demo/tiny_full",
                               dist_kd_overrides(two, corpus, 2, {{"zero_stage", "3"}})),
                tmp / "s_two");
  ASSERT_EQ(r2.code, 0) << r2.out << r2.err;
  EXPECT_TRUE(contains(r2.out,
                       "teacher: sharded over 2 ranks (zero_stage: 3), each loading only "
                       "its share"))
      << r2.out;
  std::smatch held;
  ASSERT_TRUE(
      std::regex_search(r2.out, held, std::regex("this rank holds (\\d+) of (\\d+) weights")))
      << r2.out;
  EXPECT_GT(std::stoi(held[1]), 0);
  EXPECT_LT(std::stoi(held[1]), std::stoi(held[2]));
  expect_same_curve(losses_of(logged_steps(two)), want, "2 ranks x 2 vs 1 x 4");
  for (const char* key : {"class_loss", "kd_loss"})
    expect_same_curve(logged_values(two, key), logged_values(ref, key), key);
  fs::create_directories(to_one);
  fs::copy(two / "step_3", to_one / "step_3", fs::copy_options::recursive);
  run_ok(run_command("knowledge_distillation_distributed", "demo/tiny_full",
                     dist_kd_overrides(to_one, corpus, 4, {{"resume_from_checkpoint", "true"}})),
         tmp / "s_to_one");
  expect_same_curve(losses_of(logged_steps(to_one)),
                    std::vector<double>(want.begin() + 3, want.end()), "resumed 2 ranks -> 1");
}

// Precomputed top-k teacher logits over 2 ranks at ZeRO-3: each rank computes its share of
// the batches, rank 0 merges them; the file is byte for byte the one process's (2 x 2 rows:
// the batches of 1 x 4), and both train from it: the losses are one process's with the global
// batch, to 1e-5.
TEST(DistKd, PrecomputedTopKOnTwoRanksMatchesOneProcess) {
  FT_REQUIRE_MPIRUN();
  TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp / "data");
  const auto top8 = [&](const std::string& dir) {
    return Overrides{{"teacher_logits.top_k", "8"},
                     {"teacher_logits.precompute", "true"},
                     {"teacher_logits.path", (tmp / dir).string()}};
  };
  const fs::path ref = tmp / "ref", two = tmp / "two";
  run_ok(run_command("knowledge_distillation_single_device", "demo/tiny_full",
                     dist_kd_overrides(ref, corpus, 4, top8("topk_one"))),
         tmp / "s_ref");
  Overrides o = top8("topk_two");
  o["zero_stage"] = "3";
  const CliRun r = run_shell(mpirun_command(2, "knowledge_distillation_distributed",
                                            "demo/tiny_full", dist_kd_overrides(two, corpus, 2, o)),
                             tmp / "s_two");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "(2 ranks, each its share)")) << r.out;
  const fs::path file = tmp / "topk_two" / "teacher_topk.safetensors";
  ASSERT_TRUE(fs::exists(file));
  EXPECT_TRUE(fusetune::read_file(file) ==
              fusetune::read_file(tmp / "topk_one" / "teacher_topk.safetensors"))
      << "the 2-rank file is not the one-process file";
  EXPECT_FALSE(fs::exists(teacher_topk_part_file(file, 1, 2)));
  expect_same_curve(losses_of(logged_steps(two)), losses_of(logged_steps(ref)),
                    "2 ranks x 2 vs 1 x 4, precomputed top-8");
}

}  // namespace kd_recipe_test
