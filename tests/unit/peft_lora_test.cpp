// LoRA / DoRA adapters on the model: step 0 is the base model, gradients against float64
// finite differences (NF4 base included), every compile mode agrees, dropout is seeded, and
// only adapters train.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "fusetune/compile/compiler.h"
#include "fusetune/kernels/cpu/peft_ops.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/optim/adamw.h"
#include "fusetune/peft/lora.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"
#include "peft_support.h"
#include "tensor_checks.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

peft::LoraConfig all_targets(bool output = false) {
  peft::LoraConfig c;
  c.attn_modules = {"q_proj", "k_proj", "v_proj", "output_proj"};
  c.apply_to_mlp = true;
  c.apply_to_output = output;
  c.rank = 3;
  c.alpha = 6;
  return c;
}

TensorMap base_params(const ModelConfig& cfg, DType dt, double std = 0.3) {
  TrainingGraph tg = build_training_graph(cfg, TrainingGraphOptions{});
  TensorMap p = init_parameters(graph_parameters(tg.graph), 7, dt, std);
  return p;
}

std::vector<Tensor> run_logits(const ModelConfig& cfg, const LlamaOptions& o,
                               const TensorMap& params, DType dt) {
  Graph g = build_logits_graph(cfg, 2, 6, dt, o);
  Batch b = random_batch(2, 6, cfg.vocab_size, 4);
  TensorMap in;
  in["tokens"] = ids_tensor(b.tokens, {2, 6});
  in["positions"] = ids_tensor(b.positions, {2, 6});
  EagerExecutor ex(g);
  return ex.run(in, params);
}

// Forward graph with loss (gradcheck.h appends the backward).
struct LossGraph {
  Graph g{DType::F64};
  Value loss;
  TensorMap inputs;
};

LossGraph loss_graph(const ModelConfig& cfg, const LlamaOptions& o, DType dt = DType::F64,
                     bool packed = false) {
  LossGraph lg;
  lg.g = Graph(dt);
  Graph& g = lg.g;
  Builder b(g);
  const int64_t B = 2, T = 6;
  LlamaInputs in;
  in.tokens = g.input("tokens", {B, T}, DType::I32);
  Value labels = g.input("labels", {B, T}, DType::I32);
  in.positions = g.input("positions", {B, T}, DType::I32);
  if (packed) in.doc_ids = g.input("doc_ids", {B, T}, DType::I32);
  Value scale = g.input("loss_scale", {}, dt);
  LlamaOutputs m = build_llama(
      b, cfg, in, [](const std::string& n) { return peft::is_adapter_param(n); }, o);
  Value flat = b.reshape(labels, {B * T});
  if (m.logits.valid()) {
    Value logp = b.log_softmax(m.logits);
    lg.loss = b.mul(b.nll_sum(logp, flat), scale);
  } else {
    lg.loss =
        b.mul(b.nll_sum(b.log_softmax(b.matmul(m.hidden, m.lm_head, false, true)), flat), scale);
  }
  g.mark_output("loss", lg.loss);
  Batch batch = random_batch(B, T, cfg.vocab_size, 3, packed);
  lg.inputs = batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels()));
  return lg;
}

}  // namespace

TEST(Lora, StepZeroLogitsEqualTheBaseModel) {
  for (bool tied : {false, true})
    for (bool dora : {false, true}) {
      ModelConfig cfg = tiny_config(tied, true);
      TensorMap params = base_params(cfg, DType::F64);
      auto base = run_logits(cfg, {}, params, DType::F64);
      peft::LoraConfig c = all_targets(!tied);
      c.use_dora = dora;
      peft::init_adapters(params, cfg, c, 1, DType::F64);
      auto lora = run_logits(cfg, peft::lora_llama_options(c), params, DType::F64);
      // LoRA adds exactly 0 (B = 0); DoRA scales by ||W|| / ||W|| = 1 up to rounding.
      if (dora)
        EXPECT_LT(max_abs_diff(base[0], lora[0]), 1e-12);
      else
        EXPECT_EQ(max_abs_diff(base[0], lora[0]), 0.0);
    }
}

TEST(Lora, AdaptersAreInitializedLikePeft) {
  ModelConfig cfg = tiny_config(false, false);
  TensorMap params = base_params(cfg, DType::F32);
  peft::LoraConfig c = all_targets(true);
  c.use_dora = true;
  peft::init_adapters(params, cfg, c, 5, DType::F32);
  const Tensor& a = params.at("model.layers.1.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(a.shape(), (Shape{3, cfg.intermediate_size}));
  const double bound = 1.0 / std::sqrt(double(cfg.intermediate_size));
  double amax = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    amax = std::max(amax, std::abs(double(a.data<float>()[i])));
  EXPECT_LE(amax, bound);
  EXPECT_GT(amax, 0.5 * bound);
  const Tensor& bm = params.at("lm_head.lora_B.weight");
  EXPECT_EQ(bm.shape(), (Shape{cfg.vocab_size, 3}));
  for (int64_t i = 0; i < bm.numel(); ++i) EXPECT_EQ(bm.data<float>()[i], 0.0f);
  const Tensor& m = params.at("model.layers.0.self_attn.q_proj.lora_magnitude_vector");
  const Tensor& w = params.at("model.layers.0.self_attn.q_proj.weight");
  double n0 = 0;
  for (int64_t j = 0; j < cfg.hidden_size; ++j)
    n0 += double(w.data<float>()[j]) * w.data<float>()[j];
  EXPECT_NEAR(m.data<float>()[0], std::sqrt(n0), 1e-5);
  // Same seed, same adapters.
  TensorMap again = base_params(cfg, DType::F32);
  peft::init_adapters(again, cfg, c, 5, DType::F32);
  EXPECT_EQ(max_abs_diff(again.at("model.layers.1.mlp.down_proj.lora_A.weight"), a), 0.0);
}

TEST(Lora, GradientsMatchFiniteDifferences) {
  for (bool output : {false, true})
    for (double dropout : {0.0, 0.4}) {
      ModelConfig cfg = tiny_config(false, true);
      peft::LoraConfig c = all_targets(output);
      c.dropout = dropout;
      LossGraph lg = loss_graph(cfg, peft::lora_llama_options(c), DType::F64, true);
      TensorMap params = base_params(cfg, DType::F64);
      peft::init_adapters(params, cfg, c, 2, DType::F64);
      perturb_adapters(params, 9);
      if (dropout > 0) lg.inputs[peft::kDropoutSeedInput] = ids_tensor({12345}, {});
      double worst = check_gradients(lg.g, lg.loss, params, lg.inputs, 6, 1e-6);
      EXPECT_LT(worst, 1e-6) << "output " << output << " dropout " << dropout;
    }
}

TEST(Lora, DoraGradientsAreThoseOfTheDetachedNorm) {
  // PEFT detaches ||W + s B A||: the gradient is that of the same function with the norm held
  // constant. Reference: a graph where 1 / norm is a Constant computed at this point, checked
  // against finite differences; DoRA's gradients must equal the reference's.
  ModelConfig cfg = tiny_config(false, false);
  peft::LoraConfig c = all_targets(false);
  c.use_dora = true;
  TensorMap params = base_params(cfg, DType::F64);
  peft::init_adapters(params, cfg, c, 2, DType::F64);
  perturb_adapters(params, 4);

  LinearFn frozen_norm = [&](Builder& b, Value x, const LinearSite& s) -> Value {
    Graph& g = b.graph();
    Value w = g.param(s.weight, {s.out, s.in}, false);
    const Tensor& W = params.at(s.weight);
    const Tensor& A = params.at(s.module + ".lora_A.weight");
    const Tensor& B = params.at(s.module + ".lora_B.weight");
    Tensor inv = Tensor::empty({s.out}, DType::F64);
    for (int64_t o = 0; o < s.out; ++o) {
      double n2 = 0;
      for (int64_t i = 0; i < s.in; ++i) {
        double v = W.data<double>()[o * s.in + i];
        for (int64_t k = 0; k < c.rank; ++k)
          v += c.scale() * B.data<double>()[o * c.rank + k] * A.data<double>()[k * s.in + i];
        n2 += v * v;
      }
      inv.data<double>()[o] = 1.0 / std::sqrt(n2);
    }
    Value xa = b.linear(b.linear(x, g.param(s.module + ".lora_A.weight", {c.rank, s.in}, true)),
                        g.param(s.module + ".lora_B.weight", {s.out, c.rank}, true));
    Value y = b.add(b.linear(x, w), b.scale(xa, c.scale()));
    Value mag = g.param(s.module + ".lora_magnitude_vector", {s.out}, true);
    return b.mul(y, b.mul(mag, g.constant(inv, s.module + ".inv_norm")));
  };
  LlamaOptions ref_opts;
  ref_opts.linear = frozen_norm;
  LossGraph ref = loss_graph(cfg, ref_opts);
  EXPECT_LT(check_gradients(ref.g, ref.loss, params, ref.inputs, 6, 1e-6), 1e-6);
  auto ref_out = EagerExecutor(ref.g).run(ref.inputs, params);

  LossGraph dora = loss_graph(cfg, peft::lora_llama_options(c));
  append_backward(dora.g, dora.loss);
  auto out = EagerExecutor(dora.g).run(dora.inputs, params);
  ASSERT_EQ(out.size(), ref_out.size());
  std::map<std::string, Tensor> ref_by_name;
  for (size_t k = 0; k < ref_out.size(); ++k) ref_by_name[ref.g.outputs()[k].first] = ref_out[k];
  for (size_t k = 0; k < out.size(); ++k) {
    const std::string& name = dora.g.outputs()[k].first;
    ASSERT_TRUE(ref_by_name.count(name)) << name;
    EXPECT_LT(max_rel_diff(out[k], ref_by_name.at(name)), 1e-12) << name;
  }
}

TEST(Lora, Nf4BaseGradientsMatchFiniteDifferencesAndTheDequantizedModel) {
  ModelConfig cfg = tiny_config(false, false);
  peft::LoraConfig c = all_targets(false);
  c.quantize_base = true;
  TensorMap params = base_params(cfg, DType::F64);
  auto store = peft::quantize_base_weights(params, cfg);
  peft::init_adapters(params, cfg, c, 2, DType::F64, store.get());
  perturb_adapters(params, 5);
  LossGraph lg = loss_graph(cfg, peft::lora_llama_options(c, store));
  int nf4_nodes = 0;
  for (const Node& n : lg.g.nodes()) nf4_nodes += n.op == Op::NF4MatMul;
  EXPECT_EQ(nf4_nodes, 7 * cfg.num_hidden_layers + 1);  // + the NF4 head
  EXPECT_LT(check_gradients(lg.g, lg.loss, params, lg.inputs, 6, 1e-6), 1e-6);
  auto out = EagerExecutor(lg.g).run(lg.inputs, params);

  // Reference: the same model with the dequantized weights as float parameters.
  TensorMap deq = params;
  for (const auto& [name, w] : *store) deq[name] = peft::dequantize_nf4(w, DType::F64);
  peft::LoraConfig plain = c;
  plain.quantize_base = false;
  LossGraph ref = loss_graph(cfg, peft::lora_llama_options(plain));
  append_backward(ref.g, ref.loss);
  auto ref_out = EagerExecutor(ref.g).run(ref.inputs, deq);
  ASSERT_EQ(out.size(), ref_out.size());
  for (size_t k = 0; k < out.size(); ++k) EXPECT_LT(max_rel_diff(out[k], ref_out[k]), 1e-12) << k;
}

TEST(Lora, AllCompileModesAgreeInFloat32) {
  struct Case {
    const char* name;
    bool tied, output, packed, nf4, dora;
    double dropout;
  };
  const Case cases[] = {
      {"lora_untied", false, false, false, false, false, 0.0},
      {"lora_head_packed_dropout", false, true, true, false, false, 0.1},
      {"lora_tied", true, false, false, false, false, 0.0},
      {"qlora", false, false, true, true, false, 0.0},
      {"dora", false, false, false, false, true, 0.05},
  };
  for (const Case& k : cases) {
    ModelConfig cfg = tiny_config(k.tied, false);
    cfg.vocab_size = 37;
    peft::LoraConfig c = all_targets(k.output);
    c.dropout = k.dropout;
    c.use_dora = k.dora;
    c.quantize_base = k.nf4;
    TensorMap params = base_params(cfg, DType::F32, 0.2);
    std::shared_ptr<peft::NF4Store> store;
    if (k.nf4) store = peft::quantize_base_weights(params, cfg);
    peft::init_adapters(params, cfg, c, 3, DType::F32, store.get());
    perturb_adapters(params, 6);
    TrainingGraphOptions o;
    o.batch_size = 2;
    o.seq_len = 8;
    o.packed = k.packed;
    o.trainable = peft::is_adapter_param;
    o.llama = peft::lora_llama_options(c, store);
    TrainingGraph tg = build_training_graph(cfg, o);
    for (const auto& n : tg.trainable_params) EXPECT_TRUE(peft::is_adapter_param(n)) << n;
    Batch batch = random_batch(2, 8, cfg.vocab_size, 5, k.packed);
    TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
    if (k.dropout > 0) inputs[peft::kDropoutSeedInput] = ids_tensor({77}, {});
    auto ref = EagerExecutor(tg.graph).run(inputs, params);
    for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
      PassOptions po;
      po.mode = mode;
      po.ce_chunk_budget_bytes = 5 * cfg.vocab_size * 4;
      po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
      std::vector<std::string> report;
      Graph compiled = run_passes(tg.graph, po, &report);
      int fused = 0;
      for (const Node& n : compiled.nodes())
        fused += n.op == Op::FusedLinearCrossEntropy || n.op == Op::FusedNF4LinearCrossEntropy;
      // The frozen head still fuses (dh only); a head with an adapter computes its own logits.
      EXPECT_EQ(fused, mode == CompileMode::Full && !k.output ? 1 : 0) << k.name;
      auto out = compile_graph(tg.graph, po).executor->run(inputs, params);
      ASSERT_EQ(out.size(), ref.size());
      EXPECT_LE(max_rel_diff(out[0], ref[0]), 1e-5)
          << k.name << " " << compile_mode_name(mode) << " loss";
      for (size_t j = 1; j < out.size(); ++j)
        EXPECT_LE(max_rel_diff(out[j], ref[j]), 1e-4)
            << k.name << " " << compile_mode_name(mode) << " " << tg.graph.outputs()[j].first;
    }
  }
}

TEST(Lora, OnlyAdaptersGetGradientsAndTheBaseHasNoDwWork) {
  ModelConfig cfg = tiny_config(false, false);
  TrainingGraphOptions o;
  o.trainable = peft::is_adapter_param;
  peft::LoraConfig c = all_targets(false);
  c.attn_modules = {"q_proj", "v_proj"};
  o.llama = peft::lora_llama_options(c);
  TrainingGraph tg = build_training_graph(cfg, o);
  EXPECT_EQ(tg.trainable_params.size(),
            size_t(2 * 5 * cfg.num_hidden_layers));  // q, v, gate, up, down
  for (const auto& n : tg.trainable_params) EXPECT_TRUE(peft::is_adapter_param(n)) << n;
  // Matmuls whose output has a base weight's shape would be dW work for a frozen weight.
  for (const Node& n : tg.graph.nodes())
    if (n.op == Op::MatMul) {
      EXPECT_NE(n.outputs[0].shape, (Shape{cfg.intermediate_size, cfg.hidden_size}));
    }
}

TEST(Lora, DropoutIsSeededAndZeroDropoutAddsNoOp) {
  std::vector<double> x(10000, 1.0), y1(10000), y2(10000), y3(10000);
  kernels::dropout(x.data(), y1.data(), 10000, 0.25, 1, 2);
  kernels::dropout(x.data(), y2.data(), 10000, 0.25, 1, 2);
  kernels::dropout(x.data(), y3.data(), 10000, 0.25, 2, 2);
  int dropped = 0, differ = 0;
  for (int i = 0; i < 10000; ++i) {
    EXPECT_EQ(y1[i], y2[i]);
    EXPECT_TRUE(y1[i] == 0.0 || std::abs(y1[i] - 1.0 / 0.75) < 1e-15);
    dropped += y1[i] == 0.0;
    differ += y1[i] != y3[i];
  }
  EXPECT_NEAR(dropped / 10000.0, 0.25, 0.02);
  EXPECT_GT(differ, 1000);

  ModelConfig cfg = tiny_config(false, false);
  peft::LoraConfig c = all_targets(false);
  TrainingGraphOptions o;
  o.trainable = peft::is_adapter_param;
  o.llama = peft::lora_llama_options(c);
  auto count = [](const Graph& g, Op op) {
    int n = 0;
    for (const Node& node : g.nodes()) n += node.op == op;
    return n;
  };
  EXPECT_EQ(count(build_training_graph(cfg, o).graph, Op::Dropout), 0);
  c.dropout = 0.1;
  o.llama = peft::lora_llama_options(c);
  TrainingGraph tg = build_training_graph(cfg, o);
  // One per site forward, one per VJP, except layer 0's q/k/v: their input (the frozen
  // embedding, normed) needs no gradient.
  EXPECT_EQ(count(tg.graph, Op::Dropout), 2 * 7 * cfg.num_hidden_layers - 3);
  int seeds = 0;
  for (const Node& n : tg.graph.nodes())
    seeds += n.op == Op::Input && n.name == peft::kDropoutSeedInput;
  EXPECT_EQ(seeds, 1);
}

TEST(Lora, BadConfigsAreRejectedNamingTheKey) {
  peft::LoraConfig c;
  c.rank = 0;
  EXPECT_THROW(c.validate(), Error);
  c = {};
  c.attn_modules = {"qkv"};
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora_attn_modules"), std::string::npos);
  }
  c = {};
  c.use_dora = c.quantize_base = true;
  EXPECT_THROW(c.validate(), Error);
  c = {};
  c.attn_modules.clear();
  EXPECT_THROW(c.validate(), Error);
  c = {};
  c.dropout = 1.0;
  EXPECT_THROW(c.validate(), Error);
}

TEST(Lora, TrainingOnATinyModelLowersTheLoss) {
  ModelConfig cfg = tiny_config(false, false);
  cfg.vocab_size = 29;
  peft::LoraConfig c = all_targets(false);
  c.rank = 4;
  c.alpha = 8;
  TensorMap params = base_params(cfg, DType::F32, 0.1);
  peft::init_adapters(params, cfg, c, 1, DType::F32);
  TrainingGraphOptions o;
  o.batch_size = 2;
  o.seq_len = 12;
  o.trainable = peft::is_adapter_param;
  o.llama = peft::lora_llama_options(c);
  TrainingGraph tg = build_training_graph(cfg, o);
  CompiledStep step = compile_graph(tg.graph, PassOptions{});
  Batch batch = random_batch(2, 12, cfg.vocab_size, 8);
  TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
  const TensorMap base_before = params;
  AdamW opt(AdamWOptions{});
  double first = 0, last = 0;
  for (int it = 0; it < 30; ++it) {
    auto out = step.executor->run(inputs, params);
    if (it == 0) first = element_as_double(out[0], 0);
    last = element_as_double(out[0], 0);
    TensorMap grads;
    std::vector<ParamRef> refs;
    for (size_t k = 0; k < tg.trainable_params.size(); ++k)
      grads[tg.trainable_params[k]] = out[1 + k];
    for (const auto& n : tg.trainable_params) refs.push_back({n, &params.at(n), &grads.at(n)});
    opt.step(refs, 1e-2);
  }
  EXPECT_LT(last, 0.7 * first);
  for (const auto& [n, t] : base_before)
    if (!peft::is_adapter_param(n)) {
      EXPECT_TRUE(params.at(n).shares_storage(t)) << n;
    }
}
