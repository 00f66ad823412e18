// Quantization-aware training (quant/qat.h, kernels/cpu/fake_quant.h): each scheme's fake
// quantization against a reference written out here (torchao's formulas; ggml's functions for
// the gguf schemes) and hand-computed values; the tiled FakeQuantMatMul against fake-quantizing
// the whole weight first; the straight-through gradients against float64 finite differences
// (of the surrogate the STE differentiates, and of the exact function with fake quantization
// switched off); the three compile modes agreeing on QAT graphs; the config section; and
// recipe runs: fake_quant_after_n_steps switching on at the right step, validation on the
// fake-quantized model, the loss decreasing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "fusetune/compile/compiler.h"
#include "fusetune/config/recipe_schemas.h"
#include "fusetune/config/schema.h"
#include "fusetune/core/dtype.h"
#include "fusetune/data/hub_datasets.h"
#include "fusetune/graph/autodiff.h"
#include "fusetune/kernels/cpu/fake_quant.h"
#include "fusetune/kernels/cpu/ggml_quant.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/quant/qat.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"
#include "graph_compare.h"
#include "qat_models.h"
#include "recipe_runs.h"
#include "test_support.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;
namespace k = fusetune::kernels;

namespace {

// ---- references, written the way torchao's Python reads ----------------------------------

float bf16_round(float v) {  // round to nearest even at 16 bits (finite values)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// torchao get_group_qparams_symmetric + _fake_quantize_per_channel_group (int4, zp 0).
std::vector<float> ref_int4_symmetric(const std::vector<float>& x, size_t group,
                                      std::vector<bool>* mask = nullptr) {
  std::vector<float> y(x.size());
  if (mask) mask->assign(x.size(), true);
  for (size_t g0 = 0; g0 < x.size(); g0 += group) {
    float mn = 0, mx = 0;  // min(min, 0), max(max, 0)
    for (size_t i = g0; i < g0 + group; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    float scale = std::max(-mn, mx) / (float(7 - (-8)) / 2);
    scale = std::max(scale, std::numeric_limits<float>::epsilon());
    for (size_t i = g0; i < g0 + group; ++i) {
      const float q = std::nearbyint(x[i] * (1.0f / scale));
      if (mask) (*mask)[i] = q >= -8 && q <= 7;
      y[i] = std::min(std::max(q, -8.0f), 7.0f) * scale;
    }
  }
  return y;
}

// torchao get_groupwise_affine_qparams (bf16 scales and zeros) + the FLOAT zero-point domain.
std::vector<float> ref_uint4_asymmetric(const std::vector<float>& x, size_t group) {
  std::vector<float> y(x.size());
  for (size_t g0 = 0; g0 < x.size(); g0 += group) {
    float mn = x[g0], mx = x[g0];
    for (size_t i = g0; i < g0 + group; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    const float scales = std::max(mx - mn, 1e-6f) / 15;
    const float zeros = mn + scales * 8;
    const float s = bf16_round(scales), z = bf16_round(zeros);
    const float min_val = bf16_round(z - s * 8);  // bf16 tensor arithmetic
    for (size_t i = g0; i < g0 + group; ++i) {
      const float q = std::min(std::max(std::nearbyint((x[i] - min_val) / s), 0.0f), 15.0f);
      y[i] = (q - 8) * s + z;
    }
  }
  return y;
}

// torchao choose_qparams_affine(ASYMMETRIC, per token) + _fake_quantize_per_token (int8).
std::vector<float> ref_int8_per_token(const std::vector<float>& x, size_t row) {
  std::vector<float> y(x.size());
  for (size_t r0 = 0; r0 < x.size(); r0 += row) {
    float mn = 0, mx = 0;
    for (size_t i = r0; i < r0 + row; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
    float scale = (mx - mn) / float(127 - (-128));
    scale = std::max(scale, std::numeric_limits<float>::epsilon());
    float zp = -128 - std::nearbyint(mn / scale);
    zp = std::min(std::max(zp, -128.0f), 127.0f);
    for (size_t i = r0; i < r0 + row; ++i) {
      const float q =
          std::min(std::max(std::nearbyint(x[i] * (1.0f / scale)) + zp, -128.0f), 127.0f);
      y[i] = (q - zp) * scale;
    }
  }
  return y;
}

std::vector<float> normal_values(size_t n, uint64_t seed, double std = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, std);
  std::vector<float> v(n);
  for (auto& x : v) x = float(d(rng));
  return v;
}

std::vector<float> run_rows(const k::FakeQuantSpec& spec, const std::vector<float>& x,
                            int64_t cols) {
  std::vector<float> y(x.size());
  k::fake_quantize_rows<float>(spec, x.data(), y.data(), int64_t(x.size()) / cols, cols);
  return y;
}

// ---- tiny QAT models --------------------------------------------------------------------

quant::QatConfig qat(quant::QatScheme s, int64_t groupsize = 16) {
  quant::QatConfig q;
  q.scheme = s;
  q.groupsize = groupsize;
  q.inner_k_tiles = 2;  // rows of 32 are multiples of 16 x 2
  return q;
}

const quant::QatScheme kSchemes[] = {quant::QatScheme::Int8DynActInt4Weight,
                                     quant::QatScheme::Int4WeightOnly, quant::QatScheme::GgufQ4_0,
                                     quant::QatScheme::GgufQ8_0};

bool gguf(quant::QatScheme s) {
  return s == quant::QatScheme::GgufQ4_0 || s == quant::QatScheme::GgufQ8_0;
}

}  // namespace

// ---- the schemes -------------------------------------------------------------------------

TEST(FakeQuantSchemes, HandComputedValues) {
  {  // int4 symmetric, group of 4: scale = 0.75 / 7.5 = 0.1; 7.5 rounds to 8 -> clamped to 7
    const std::vector<float> x{0.75f, -0.3f, 0.1f, 0.2f};
    const auto y = run_rows({k::FakeQuant::Int4Symmetric, 4}, x, 4);
    const float s = 0.75f / 7.5f;
    EXPECT_FLOAT_EQ(y[0], 7 * s);
    EXPECT_FLOAT_EQ(y[1], -3 * s);
    EXPECT_FLOAT_EQ(y[2], 1 * s);
    EXPECT_FLOAT_EQ(y[3], 2 * s);
    // The STE mask: only the element whose unclamped q (8) is out of range loses its gradient.
    std::vector<float> dy{1, 1, 1, 1}, dx(4);
    k::fake_quantize_backward<float>({k::FakeQuant::Int4Symmetric, 4}, x.data(), dy.data(),
                                     dx.data(), 1, 4);
    EXPECT_EQ(dx, (std::vector<float>{0, 1, 1, 1}));
  }
  {  // uint4 asymmetric: min 0, max 1.5 -> scale 0.1 -> bf16 0.10009765625, zero bf16(0.8)
    const std::vector<float> x{0.0f, 1.5f, 0.7f, 0.2f};
    const auto y = run_rows({k::FakeQuant::Uint4Asymmetric, 4}, x, 4);
    const float s = 0.10009765625f, z = 0.80078125f;  // bf16(0.1), bf16(0.8)
    EXPECT_FLOAT_EQ(y[0], (0 - 8) * s + z);
    EXPECT_FLOAT_EQ(y[1], (15 - 8) * s + z);
    EXPECT_FLOAT_EQ(y[2], (7 - 8) * s + z);
    EXPECT_FLOAT_EQ(y[3], (2 - 8) * s + z);
  }
  {  // int8 per token: lo -1, hi 2 -> scale 3/255, zero point -128 + 85 = -43
    const std::vector<float> x{-1.0f, 0.5f, 2.0f};
    const auto y = run_rows({k::FakeQuant::Int8PerToken, 3}, x, 3);
    const float s = 3.0f / 255.0f;
    EXPECT_NEAR(y[0], -85 * s, 1e-7);
    EXPECT_NEAR(y[1], std::nearbyint(0.5f / s) * s, 1e-7);
    EXPECT_NEAR(y[2], 170 * s, 1e-7);
  }
}

TEST(FakeQuantSchemes, TorchaoSchemesMatchTheReferenceOnRandomRows) {
  const int64_t rows = 24, cols = 128;
  for (double std : {0.02, 1.0, 30.0}) {
    std::vector<float> x = normal_values(size_t(rows * cols), uint64_t(std * 1000) + 3, std);
    x[5] = 0;  // a row with an exact zero and a constant group
    for (int i = 64; i < 96; ++i) x[size_t(i)] = 0.25f;
    EXPECT_EQ(run_rows({k::FakeQuant::Int4Symmetric, 32}, x, cols), ref_int4_symmetric(x, 32));
    EXPECT_EQ(run_rows({k::FakeQuant::Uint4Asymmetric, 64}, x, cols), ref_uint4_asymmetric(x, 64));
    EXPECT_EQ(run_rows({k::FakeQuant::Int8PerToken, cols}, x, cols),
              ref_int8_per_token(x, size_t(cols)));
    std::vector<bool> mask;
    ref_int4_symmetric(x, 32, &mask);
    std::vector<float> ones(x.size(), 1.0f), dx(x.size());
    k::fake_quantize_backward<float>({k::FakeQuant::Int4Symmetric, 32}, x.data(), ones.data(),
                                     dx.data(), rows, cols);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(dx[i], mask[i] ? 1.0f : 0.0f) << i;
  }
}

// The gguf schemes are ggml's quantize-then-dequantize (ggml_quant.h, bit for bit with
// llama.cpp's reference quantizers), block by block along each row.
TEST(FakeQuantSchemes, GgufSchemesAreGgmlQuantizeThenDequantize) {
  const int64_t rows = 6, cols = 96;
  std::vector<float> x = normal_values(size_t(rows * cols), 17, 0.5);
  x[40] = 0;  // zeros and a constant block
  for (int i = 64; i < 96; ++i) x[size_t(i)] = -0.125f;
  std::vector<float> q4(x.size()), q8(x.size());
  std::vector<ggml::BlockQ4_0> b4(size_t(cols / 32));
  std::vector<ggml::BlockQ8_0> b8(size_t(cols / 32));
  for (int64_t r = 0; r < rows; ++r) {
    ggml::quantize_row_q4_0(x.data() + r * cols, b4.data(), cols);
    ggml::dequantize_row_q4_0(b4.data(), q4.data() + r * cols, cols);
    ggml::quantize_row_q8_0(x.data() + r * cols, b8.data(), cols);
    ggml::dequantize_row_q8_0(b8.data(), q8.data() + r * cols, cols);
  }
  EXPECT_EQ(run_rows({k::FakeQuant::GgufQ4_0, 32}, x, cols), q4);
  EXPECT_EQ(run_rows({k::FakeQuant::GgufQ8_0, 32}, x, cols), q8);
  // float64 rounds through fp32: the same values.
  std::vector<double> xd(x.begin(), x.end()), yd(x.size());
  k::fake_quantize_rows<double>({k::FakeQuant::GgufQ4_0, 32}, xd.data(), yd.data(), rows, cols);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(yd[i], double(q4[i])) << i;
  // The straight-through gradient is dy itself.
  std::vector<float> dy = normal_values(x.size(), 5), dx(x.size());
  k::fake_quantize_backward<float>({k::FakeQuant::GgufQ4_0, 32}, x.data(), dy.data(), dx.data(),
                                   rows, cols);
  EXPECT_EQ(dx, dy);
}

TEST(FakeQuantSchemes, RowsThatAreNotWholeGroupsAreAnError) {
  std::vector<float> x(30), y(30);
  EXPECT_THROW(
      k::fake_quantize_rows<float>({k::FakeQuant::Int4Symmetric, 32}, x.data(), y.data(), 1, 30),
      Error);
}

// ---- the tiled matmul --------------------------------------------------------------------

TEST(FakeQuantMatMul, TiledEqualsTheMatMulOfTheWholeFakeQuantizedWeight) {
  // K = 2048: 128 weight rows per tile, so O = 300 takes three tiles.
  const int64_t N = 5, O = 300, K = 2048;
  ASSERT_LT(k::fake_quant_tile_rows(O, K), O);
  const std::vector<float> W = normal_values(size_t(O * K), 1, 0.05),
                           x = normal_values(size_t(N * K), 2);
  const std::vector<float> dy = normal_values(size_t(N * O), 3);
  for (k::FakeQuant s :
       {k::FakeQuant::Int4Symmetric, k::FakeQuant::Uint4Asymmetric, k::FakeQuant::GgufQ4_0}) {
    const k::FakeQuantSpec spec{s, s == k::FakeQuant::GgufQ4_0 ? 32 : 256};
    const std::vector<float> Wq = run_rows(spec, W, K);
    std::vector<float> y(size_t(N * O)), y_ref(size_t(N * O)), dx(size_t(N * K)),
        dx_ref(size_t(N * K));
    k::fake_quant_matmul<float>(spec, W.data(), x.data(), N, O, K, y.data());
    k::gemm<float>(false, true, N, O, K, 1.0f, x.data(), K, Wq.data(), K, 0.0f, y_ref.data(), O);
    k::fake_quant_matmul_backward<float>(spec, W.data(), dy.data(), N, O, K, dx.data());
    k::gemm<float>(false, false, N, K, O, 1.0f, dy.data(), O, Wq.data(), K, 0.0f, dx_ref.data(), K);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], y_ref[i], 1e-5 * (1 + std::abs(y_ref[i])));
    for (size_t i = 0; i < dx.size(); ++i)
      ASSERT_NEAR(dx[i], dx_ref[i], 1e-5 * (1 + std::abs(dx_ref[i])));
    // bf16 storage: the rows widened, then the same.
    std::vector<uint16_t> Wb(W.size());
    std::vector<float> Ww(W.size());
    for (size_t i = 0; i < W.size(); ++i) Wb[i] = f32_to_bf16(W[i]), Ww[i] = bf16_to_f32(Wb[i]);
    std::vector<float> yb(y.size()), yw(y.size());
    k::fake_quant_matmul_bf16(spec, Wb.data(), x.data(), N, O, K, yb.data());
    k::fake_quant_matmul<float>(spec, Ww.data(), x.data(), N, O, K, yw.data());
    EXPECT_EQ(yb, yw);
  }
}

// ---- the straight-through estimator ------------------------------------------------------

namespace {

// loss = sum(R * (fqa(x) fqw(W)^T)) for x [N, K], W [O, K] (both trainable), in float64.
struct SteGraph {
  Graph g{DType::F64};
  Value loss;
};

SteGraph ste_graph(const quant::QatConfig& q, int64_t N, int64_t O, int64_t K) {
  SteGraph s;
  Builder b(s.g);
  ModelConfig m = qat_model_config(false);
  m.hidden_size = K;
  LlamaOptions o = quant::qat_llama_options(q, std::make_shared<ModelConfig>(m), true);
  Value x = s.g.param("x", {N, K}, true);
  Value y = o.linear(b, x, LinearSite{"model.layers.0.self_attn.q_proj", O, K, true, "w"});
  Value R = s.g.input("R", {N, O}, DType::F64);
  s.loss = b.sum(b.mul(y, R));
  s.g.mark_output("loss", s.loss);
  return s;
}

}  // namespace

TEST(FakeQuantSte, GradientsAreTheChainRuleThroughTheQuantizedValuesInFloat64) {
  const int64_t N = 3, O = 5, K = 32;
  for (quant::QatScheme scheme : kSchemes) {
    SCOPED_TRACE(quant::scheme_name(scheme));
    const quant::QatConfig q = qat(scheme);
    const quant::SiteQuant sq = quant::site_quant(
        q, qat_model_config(false), LinearSite{"model.layers.0.mlp.up_proj", O, K, true, "w"});
    SteGraph s = ste_graph(q, N, O, K);
    append_backward(s.g, s.loss);
    TensorMap params{{"x", random_tensor({N, K}, DType::F64, 1)},
                     {"w", random_tensor({O, K}, DType::F64, 2)}};
    const TensorMap inputs = with_enable({{"R", random_tensor({N, O}, DType::F64, 3)}}, 1);
    auto out = EagerExecutor(s.g).run(inputs, params);
    // The surrogate: L(xq, wq) = sum(R * xq wq^T) with xq, wq the fake-quantized values, its
    // derivatives by central differences, then masked where the scheme masks.
    auto fq = [](const k::FakeQuantSpec& sp, const Tensor& t) {
      Tensor r = t.clone();
      if (sp.scheme != k::FakeQuant::None)
        k::fake_quantize_rows<double>(sp, t.data<double>(), r.data<double>(), t.dim(0), t.dim(1));
      return r;
    };
    auto mask = [](const k::FakeQuantSpec& sp, const Tensor& t) {
      Tensor ones = Tensor::empty(t.shape(), DType::F64), m = Tensor::empty(t.shape(), DType::F64);
      for (int64_t i = 0; i < t.numel(); ++i) ones.data<double>()[i] = 1;
      if (sp.scheme == k::FakeQuant::None) return ones;
      k::fake_quantize_backward<double>(sp, t.data<double>(), ones.data<double>(), m.data<double>(),
                                        t.dim(0), t.dim(1));
      return m;
    };
    Tensor xq = fq(sq.activation, params["x"]), wq = fq(sq.weight, params["w"]);
    const Tensor& R = inputs.at("R");
    auto L = [&]() {
      double l = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < O; ++o) {
          double acc = 0;
          for (int64_t j = 0; j < K; ++j)
            acc += xq.data<double>()[n * K + j] * wq.data<double>()[o * K + j];
          l += R.data<double>()[n * O + o] * acc;
        }
      return l;
    };
    EXPECT_NEAR(out[0].data<double>()[0], L(), 1e-12);
    const Tensor mx = mask(sq.activation, params["x"]), mw = mask(sq.weight, params["w"]);
    int masked = 0;
    for (auto [t, m, grad] : {std::tuple{&xq, &mx, &out[1]}, std::tuple{&wq, &mw, &out[2]}}) {
      for (int64_t i = 0; i < t->numel(); ++i) {
        double& v = t->data<double>()[i];
        const double v0 = v, h = 1e-6;
        v = v0 + h;
        const double lp = L();
        v = v0 - h;
        const double lm = L();
        v = v0;
        const double expected = m->data<double>()[i] * (lp - lm) / (2 * h);
        masked += m->data<double>()[i] == 0;
        EXPECT_NEAR(grad->data<double>()[i], expected, 1e-7 * (1 + std::abs(expected))) << i;
      }
    }
    if (scheme == quant::QatScheme::Int8DynActInt4Weight) {
      EXPECT_GT(masked, 0);  // torchao's mask is exercised (the positive extreme of a group)
    }
    // Switched off (fake_quant_after_n_steps), the graph is the plain product: exact
    // gradients by finite differences of the graph itself.
    SteGraph off = ste_graph(q, N, O, K);
    check_gradients(off.g, off.loss, params, with_enable(inputs, 0), 40, 1e-7);
  }
}

// ---- QAT models in every compile mode ----------------------------------------------------

TEST(QatModel, AllCompileModesAgree) {
  for (quant::QatScheme scheme : kSchemes)
    for (int64_t hidden : {32, 256})  // 256: gguf_q4_0's head (and tied table) is Q6_K
      for (bool tied : {false, true})
        for (DType dt : {DType::F64, DType::F32}) {
          if (hidden == 256 && scheme != quant::QatScheme::GgufQ4_0) continue;
          SCOPED_TRACE(std::string(quant::scheme_name(scheme)) + (tied ? " tied " : " untied ") +
                       dtype_name(dt) + " hidden " + std::to_string(hidden));
          const ModelConfig cfg = qat_model_config(tied, hidden);
          TrainingGraphOptions o;
          o.batch_size = 2;
          o.seq_len = 8;
          o.dtype = dt;
          o.llama = quant::qat_llama_options(qat(scheme), std::make_shared<ModelConfig>(cfg), true);
          TrainingGraph tg = build_training_graph(cfg, o);
          // The head is quantized except torchao's tied one.
          EXPECT_EQ(count_ops(tg.graph, Op::FakeQuantMatMul),
                    7 * 2 + (tied && !gguf(scheme) ? 0 : 1));
          if (hidden == 256) {  // the head Q6_K on Q8_K activations, the tied table's rows Q6_K
            int k_quants = 0;
            for (const Node& n : tg.graph.nodes())
              k_quants += !n.backward && (n.attrs.groups == int64_t(k::FakeQuant::GgufQ6_K) ||
                                          n.attrs.groups == int64_t(k::FakeQuant::GgufQ8_K));
            EXPECT_EQ(k_quants, tied ? 3 : 2);
          }
          // One activation fake quantization per distinct input (q/k/v share one, gate/up one),
          // + the head's input, + gguf's gathered embedding rows.
          if (scheme != quant::QatScheme::Int4WeightOnly) {
            int forward = 0;
            for (const Node& n : tg.graph.nodes())
              forward += n.op == Op::FakeQuantize && !n.backward;
            EXPECT_EQ(forward, 4 * 2 + (tied && !gguf(scheme) ? 0 : 1) + (gguf(scheme) ? 1 : 0));
          }
          TensorMap params = init_parameters(graph_parameters(tg.graph), 11, dt, 0.2);
          Batch batch = random_batch(2, 8, cfg.vocab_size, 5);
          const TensorMap inputs =
              with_enable(batch_inputs(batch, dt, 1.0 / double(batch.num_valid_labels())), 1);
          auto ref = EagerExecutor(tg.graph).run(inputs, params);
          for (CompileMode mode : {CompileMode::Model, CompileMode::Full}) {
            PassOptions po;
            po.mode = mode;
            po.ce_chunk_budget_bytes = 5 * cfg.vocab_size * int64_t(dtype_size(dt));
            po.tiled_head_ce_chunk_budget_bytes = po.ce_chunk_budget_bytes;
            auto out = compile_graph(tg.graph, po).executor->run(inputs, params);
            ASSERT_EQ(out.size(), ref.size());
            const double tol = dt == DType::F64 ? 1e-10 : 1e-4;
            EXPECT_LE(max_rel_diff(out[0], ref[0]), tol / 10) << compile_mode_name(mode);
            for (size_t i = 1; i < out.size(); ++i)
              EXPECT_LE(max_rel_diff(out[i], ref[i]), tol)
                  << compile_mode_name(mode) << " " << tg.graph.outputs()[i].first;
          }
        }
}

TEST(QatModel, GgufFollowsLlamaQuantizeDefaultsForEmbeddingAndHead) {
  const ModelConfig untied = qat_model_config(false), tied = qat_model_config(true);
  const LinearSite head{"lm_head", 37, 32, true, "lm_head.weight"};
  const LinearSite embed{"model.embed_tokens", 37, 32, true, "model.embed_tokens.weight"};
  const auto q4 = qat(quant::QatScheme::GgufQ4_0), q8 = qat(quant::QatScheme::GgufQ8_0);
  EXPECT_EQ(quant::site_quant(q4, untied, embed).weight.scheme, k::FakeQuant::GgufQ4_0);
  EXPECT_EQ(quant::site_quant(q4, untied, embed).activation.scheme, k::FakeQuant::None);
  EXPECT_EQ(quant::site_quant(q4, untied, head).weight.scheme, k::FakeQuant::GgufQ8_0);
  EXPECT_EQ(quant::site_quant(q4, untied, head).activation.scheme, k::FakeQuant::GgufQ8_0);
  EXPECT_EQ(quant::site_quant(q4, tied, embed).weight.scheme, k::FakeQuant::GgufQ8_0);
  EXPECT_EQ(quant::site_quant(q8, untied, embed).weight.scheme, k::FakeQuant::GgufQ8_0);
  // Rows of 256 (hidden a multiple of 256): the head and a tied table Q6_K, the head's input
  // Q8_K; gguf_q8_0 keeps Q8_0.
  const LinearSite head256{"lm_head", 37, 256, true, "lm_head.weight"};
  const LinearSite embed256{"model.embed_tokens", 37, 256, true, "model.embed_tokens.weight"};
  const ModelConfig untied256 = qat_model_config(false, 256), tied256 = qat_model_config(true, 256);
  EXPECT_EQ(quant::site_quant(q4, untied256, head256).weight.scheme, k::FakeQuant::GgufQ6_K);
  EXPECT_EQ(quant::site_quant(q4, untied256, head256).weight.group, 256);
  EXPECT_EQ(quant::site_quant(q4, untied256, head256).activation.scheme, k::FakeQuant::GgufQ8_K);
  EXPECT_EQ(quant::site_quant(q4, untied256, embed256).weight.scheme, k::FakeQuant::GgufQ4_0);
  EXPECT_EQ(quant::site_quant(q4, tied256, embed256).weight.scheme, k::FakeQuant::GgufQ6_K);
  EXPECT_EQ(quant::site_quant(q4, tied256, head256).weight.scheme, k::FakeQuant::GgufQ6_K);
  EXPECT_EQ(quant::site_quant(q8, untied256, head256).weight.scheme, k::FakeQuant::GgufQ8_0);
  EXPECT_EQ(quant::site_quant(q8, untied256, head256).activation.scheme, k::FakeQuant::GgufQ8_0);
  // Rows of 288: whole Q8_0 blocks, not whole super-blocks: Q8_0 (llama_tensor_get_type).
  const LinearSite head288{"lm_head", 37, 288, true, "lm_head.weight"};
  EXPECT_EQ(quant::site_quant(q4, qat_model_config(false, 288), head288).weight.scheme,
            k::FakeQuant::GgufQ8_0);
  const auto layer =
      quant::site_quant(q4, untied, {"model.layers.1.mlp.down_proj", 32, 64, true, "w"});
  EXPECT_EQ(layer.weight.scheme, k::FakeQuant::GgufQ4_0);
  EXPECT_EQ(layer.activation.scheme, k::FakeQuant::GgufQ8_0);
  // stories260K: down_proj's rows of 172 cannot be Q4_0 blocks and stay float.
  ModelConfig s = untied;
  s.intermediate_size = 172;
  const auto left = quant::check_model(q4, s);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_NE(left[0].find("down_proj"), std::string::npos);
}

// llama.cpp gathers rows of the quantized token_embd; Q4_0/Q8_0 blocks lie along a row, so the
// hook fake-quantizes only the gathered rows. Reference: the whole table fake-quantized, then
// gathered (bitwise the same); the straight-through gradient is the scatter-add of dy. No
// FakeQuantize of the [V, D] table exists.
TEST(QatModel, GgufEmbeddingFakeQuantizesTheGatheredRowsAsTheWholeTableThenGathered) {
  const int64_t V = 37, D = 64, B = 2, T = 6;  // rows of two blocks
  for (const auto& [scheme, tied, want] :
       {std::tuple{quant::QatScheme::GgufQ4_0, false, k::FakeQuant::GgufQ4_0},
        std::tuple{quant::QatScheme::GgufQ4_0, true, k::FakeQuant::GgufQ8_0},
        std::tuple{quant::QatScheme::GgufQ8_0, false, k::FakeQuant::GgufQ8_0}}) {
    SCOPED_TRACE(std::string(quant::scheme_name(scheme)) + (tied ? " tied" : " untied"));
    ModelConfig m = qat_model_config(tied);
    m.hidden_size = D;
    const LinearSite site{"model.embed_tokens", V, D, true, "model.embed_tokens.weight"};
    ASSERT_EQ(quant::site_quant(qat(scheme), m, site).weight.scheme, want);
    Graph g(DType::F32);
    Builder b(g);
    const LlamaOptions o =
        quant::qat_llama_options(qat(scheme), std::make_shared<ModelConfig>(m), true);
    ASSERT_TRUE(o.embedding);
    const Value ids = g.input("ids", {B, T}, DType::I32);
    const Value y = o.embedding(b, ids, site);
    const Value loss = b.sum(b.mul(y, g.input("R", {B, T, D}, DType::F32)));
    g.mark_output("loss", loss);
    g.mark_output("y", y);
    append_backward(g, loss);  // outputs: loss, y, grad:model.embed_tokens.weight
    int fake_quantized = 0;
    for (const Node& n : g.nodes())
      if (n.op == Op::FakeQuantize) {
        ++fake_quantized;
        EXPECT_EQ(g.shape(n.inputs[0]), (Shape{B * T, D})) << "only the gathered rows";
      }
    EXPECT_EQ(fake_quantized, 1);

    const Tensor table = random_tensor({V, D}, DType::F32, 7, -0.5, 0.5);
    Tensor id = Tensor::empty({B, T}, DType::I32);
    const int32_t rows[B * T] = {3, 0, 36, 3, 17, 5, 5, 5, 22, 1, 36, 9};  // repeats
    std::copy(rows, rows + B * T, id.data<int32_t>());
    const Tensor R = random_tensor({B, T, D}, DType::F32, 8);
    // The reference: fake-quantize the whole table, then gather.
    std::vector<float> fq(size_t(V * D));
    k::fake_quantize_rows<float>({want, 32}, table.data<float>(), fq.data(), V, D);
    for (int on : {1, 0}) {
      const auto out = EagerExecutor(g).run(with_enable({{"ids", id}, {"R", R}}, on),
                                            TensorMap{{"model.embed_tokens.weight", table}});
      const float* src = on ? fq.data() : table.data<float>();
      std::vector<float> expected, got(out[1].data<float>(), out[1].data<float>() + B * T * D);
      for (int32_t r : rows) expected.insert(expected.end(), src + r * D, src + (r + 1) * D);
      EXPECT_EQ(got, expected) << "fake quantization " << (on ? "on" : "off");
      // d table = the rows of R added into their ids (dy straight through).
      std::vector<double> dtable(size_t(V * D), 0.0);
      for (int64_t i = 0; i < B * T; ++i)
        for (int64_t j = 0; j < D; ++j)
          dtable[size_t(rows[i] * D + j)] += R.data<float>()[i * D + j];
      for (int64_t i = 0; i < V * D; ++i)
        ASSERT_NEAR(out[2].data<float>()[i], dtable[size_t(i)], 1e-6) << i;
    }
  }
}

TEST(QatModel, TorchaoLeavesATiedHeadAndTheEmbeddingInFloatAndSkipsPartialGroups) {
  const quant::QatConfig q = qat(quant::QatScheme::Int8DynActInt4Weight, 32);
  ModelConfig m = qat_model_config(true);
  m.intermediate_size = 48;  // down_proj's rows of 48: not whole groups of 32
  const std::vector<std::string> left = quant::check_model(q, m);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_NE(left[0].find("mlp.down_proj"), std::string::npos) << left[0];
  EXPECT_EQ(
      quant::site_quant(q, m, {"lm_head", 37, 32, true, "model.embed_tokens.weight"}).weight.scheme,
      k::FakeQuant::None);
  m.tie_word_embeddings = false;
  EXPECT_EQ(quant::site_quant(q, m, {"lm_head", 37, 32, true, "lm_head.weight"}).weight.scheme,
            k::FakeQuant::Int4Symmetric);
  // Int4WeightOnly refuses what it cannot quantize, as torchao does.
  EXPECT_THROW(quant::check_model(qat(quant::QatScheme::Int4WeightOnly, 32), m), Error);
}

// ---- config ------------------------------------------------------------------------------

namespace {

std::string validate_error(const std::string& yaml, const Schema& schema) {
  try {
    validate(Config::from_string(yaml, "qat.yaml"), schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kQatYaml = R"(output_dir: /tmp/x
model: {init: random, vocab_size: 32, hidden_size: 32, intermediate_size: 64,
        num_hidden_layers: 1, num_attention_heads: 4}
tokenizer: {_component_: byte}
dataset: {_component_: text_completion, source: x.txt}
optimizer: {_component_: AdamW, lr: 1e-3}
)";

}  // namespace

TEST(QatConfig, QuantizerSectionWithTorchtuneNames) {
  const Schema& s = qat_schema();
  const std::string base = kQatYaml;
  EXPECT_NE(validate_error(base, s).find("quantizer"), std::string::npos);
  EXPECT_EQ(
      validate_error(base + "quantizer: {_component_: "
                            "torchtune.training.quantization.Int8DynActInt4WeightQATQuantizer,"
                            " groupsize: 32}\nfake_quant_after_n_steps: 10\n",
                     s),
      "");
  EXPECT_EQ(validate_error(base + "quantizer: {_component_: gguf_q4_0}\n", s), "");
  EXPECT_EQ(validate_error(base + "quantizer: {_component_: "
                                  "torchtune.training.quantization.Int4WeightOnlyQATQuantizer, "
                                  "groupsize: 128, inner_k_tiles: 8}\n",
                           s),
            "");
  const std::string typo =
      validate_error(base +
                         "quantizer: {_component_: Int8DynActInt4WeightQATQuantizer, "
                         "group_size: 32}\n",
                     s);
  EXPECT_NE(typo.find("groupsize"), std::string::npos) << typo;
  const std::string bad = validate_error(base + "quantizer: {_component_: gguf_q4_1}\n", s);
  EXPECT_NE(bad.find("gguf_q4_0"), std::string::npos) << bad;
  EXPECT_NE(validate_error(base + "quantizer: {_component_: gguf_q8_0}\n"
                                  "fake_quant_after_n_steps: -1\n",
                           s),
            "");
  // The scheme and the switch as the recipe reads them.
  Config c = Config::from_string(base +
                                     "quantizer: {_component_: "
                                     "torchao.quantization.qat.Int8DynActInt4WeightQATQuantizer,"
                                     " groupsize: 64}\nfake_quant_after_n_steps: 2\n",
                                 "q.yaml");
  const quant::QatConfig q = quant::qat_config_from(with_defaults(c, s));
  EXPECT_EQ(q.scheme, quant::QatScheme::Int8DynActInt4Weight);
  EXPECT_EQ(q.groupsize, 64);
  EXPECT_FALSE(quant::fake_quant_enabled_at(q, 1));
  EXPECT_TRUE(quant::fake_quant_enabled_at(q, 2));
}

TEST(QatConfig, LoraRecipeRefusesAnNf4BaseAndDora) {
  const std::string base = std::string(kQatYaml) + "quantizer: {_component_: gguf_q8_0}\n";
  std::string yaml = base;
  yaml.replace(yaml.find("num_attention_heads: 4}"), 23,
               "num_attention_heads: 4, lora_attn_modules: [q_proj], quantize_base: true}");
  EXPECT_NE(validate_error(yaml, qat_lora_schema()).find("quantize_base"), std::string::npos);
}

// torchtune's own QAT configs, unmodified but for a local copy of the Hub dataset.
TEST(QatConfig, TorchtuneQatConfigsValidate) {
  FT_REQUIRE_ASSET("torchtune_configs/llama3_2/1B_qat_lora.yaml");
  const std::pair<const char*, const Schema*> configs[] = {
      {"llama3_2/1B_qat_lora.yaml", &qat_lora_schema()},
      {"llama3/8B_qat_lora.yaml", &qat_lora_schema()},
      {"qwen2_5/3B_qat_single_device.yaml", &qat_schema()},
      {"qwen2_5/1.5B_qat_single_device.yaml", &qat_schema()}};
  for (const auto& [name, schema] : configs) {
    Config c = Config::from_file((assets_dir() / "torchtune_configs" / name).string());
    c.apply_overrides({"dataset.source=/data/copy.json"});
    apply_dataset_builders(c);
    EXPECT_NO_THROW(validate(c, *schema)) << name;
    const quant::QatConfig q = quant::qat_config_from(with_defaults(c, *schema));
    EXPECT_EQ(q.scheme, quant::QatScheme::Int8DynActInt4Weight) << name;
    EXPECT_EQ(q.groupsize, 256) << name;
  }
}

// ---- recipe runs -------------------------------------------------------------------------

namespace {

// The demo config (configs/demo/tiny_full.yaml: rows of 64, MLP 176) made small.
std::vector<LoggedStep> demo_run(const std::string& recipe, const TempDir& dir,
                                 const std::string& name, const Overrides& extra) {
  const rr_fs::path out = dir / name;
  const CliRun r = run_shell(run_command(recipe, "demo/tiny_full", demo_overrides(out, extra)),
                             dir / (name + "_log"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return logged_steps(out);
}

}  // namespace

TEST(QatRecipe, FakeQuantAfterNStepsSwitchesOnAtThatStepAndValidationIsQuantized) {
  TempDir dir;
  const Overrides val = {
      {"dataset_val._component_", "text_completion"},
      {"dataset_val.source", std::string(source_dir()) + "/configs/demo/demo_corpus.txt"},
      {"dataset_val.split", "train[90%:]"},
      {"dataset_val.packed", "true"},
      {"run_val_every_n_steps", "1"}};
  Overrides qat_keys = val;
  qat_keys["quantizer._component_"] = "gguf_q8_0";
  qat_keys["fake_quant_after_n_steps"] = "3";
  const auto plain = demo_run("full_finetune_single_device", dir, "plain", val);
  const auto delayed = demo_run("qat_single_device", dir, "delayed", qat_keys);
  qat_keys.erase("fake_quant_after_n_steps");
  const auto on = demo_run("qat_single_device", dir, "on", qat_keys);
  ASSERT_EQ(plain.size(), 6u);
  ASSERT_EQ(delayed.size(), 6u);
  ASSERT_EQ(on.size(), 6u);
  // Steps 1-3 (global_step 0, 1, 2) train without fake quantization: the plain run's losses.
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(delayed[i].loss, plain[i].loss) << i;
  EXPECT_NE(delayed[3].loss, plain[3].loss);
  EXPECT_NE(on[0].loss, plain[0].loss);
  EXPECT_LT(on.back().loss, on.front().loss);
  // After step 1 both hold the same weights, yet the QAT run validates the fake-quantized
  // model: a different loss, close to the float one.
  const auto plain_val = logged_values(dir / "plain", "val_loss"),
             delayed_val = logged_values(dir / "delayed", "val_loss");
  ASSERT_GE(plain_val.size(), 1u);
  ASSERT_GE(delayed_val.size(), 1u);
  EXPECT_NE(delayed_val[0], plain_val[0]);
  EXPECT_NEAR(delayed_val[0], plain_val[0], 0.05 * plain_val[0]);
}

TEST(QatRecipe, LoraOnAFakeQuantizedBaseTrainsInEveryCompileMode) {
  TempDir dir;
  std::vector<double> first;
  for (const char* mode : {"false", "model", "true"}) {
    const auto steps = demo_run("qat_lora_finetune_single_device", dir, std::string("lora_") + mode,
                                {{"quantizer._component_", "Int8DynActInt4WeightQATQuantizer"},
                                 {"quantizer.groupsize", "32"},
                                 {"model.lora_attn_modules", "[q_proj, v_proj]"},
                                 {"model.apply_lora_to_mlp", "true"},
                                 {"model.lora_rank", "4"},
                                 {"model.lora_alpha", "8"},
                                 {"optimizer.lr", "1e-2"},
                                 {"compile", mode}});
    ASSERT_EQ(steps.size(), 6u) << mode;
    EXPECT_LT(steps.back().loss, steps.front().loss) << mode;
    if (first.empty()) first = losses_of(steps);
    for (size_t i = 0; i < steps.size(); ++i)
      EXPECT_NEAR(steps[i].loss, first[i], 1e-4 * first[i]) << mode << " step " << i + 1;
  }
}
