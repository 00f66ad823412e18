// NF4 (QLoRA) weights: the code books, quantize/dequantize round trip within the table's
// resolution, the tiled matmuls against a dense reference, and the memory they save.
#include <gtest/gtest.h>

#include <atomic>

#include <cmath>
#include <cstring>
#include <random>

#include "fusetune/compile/compiler.h"
#include "fusetune/core/memory.h"
#include "fusetune/kernels/cpu/kernels.h"
#include "fusetune/kernels/cpu/nf4.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/peft/lora.h"
#include "fusetune/peft/nf4_weight.h"
#include "fusetune/util/error.h"
#include "gradcheck.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

Tensor normal_matrix(int64_t r, int64_t c, uint64_t seed, double std = 0.05) {
  Tensor t = Tensor::empty({r, c}, DType::F32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, std);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(n(rng));
  // An outlier, as real weights have: its block's absmax is large.
  t.data<float>()[7] = float(20 * std);
  return t;
}

double max_table_gap() {
  double g = 0;
  for (int i = 0; i + 1 < 16; ++i)
    g = std::max(g, double(kernels::nf4_table()[i + 1] - kernels::nf4_table()[i]));
  return g;
}

}  // namespace

TEST(NF4, CodeBooksAreSortedAndSpanMinusOneToOne) {
  const float* t = kernels::nf4_table();
  EXPECT_EQ(t[0], -1.0f);
  EXPECT_EQ(t[7], 0.0f);
  EXPECT_EQ(t[15], 1.0f);
  for (int i = 0; i + 1 < 16; ++i) EXPECT_LT(t[i], t[i + 1]);
  const float* m = kernels::nf4_dynamic_map();
  for (int i = 0; i + 1 < 256; ++i) EXPECT_LE(m[i], m[i + 1]) << i;
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_NEAR(m[0], -0.99297, 1e-4);  // bitsandbytes' signed map has no -1
  int zeros = 0;
  for (int i = 0; i < 256; ++i) zeros += m[i] == 0.0f;
  EXPECT_EQ(zeros, 1);
}

TEST(NF4, RoundTripErrorIsWithinHalfTheLargestGapTimesAbsmax) {
  // 70 x 96: 105 blocks of 64 (blocks straddle rows), one partial 256-block of absmax.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{70, 96}, {3, 7}, {600, 512}}) {
    Tensor w = normal_matrix(rows, cols, uint64_t(rows * cols));
    peft::NF4Weight q = peft::quantize_nf4(w);
    Tensor d = peft::dequantize_nf4(q, DType::F32);
    const kernels::NF4View v = q.view();
    const double half_gap = max_table_gap() / 2;
    double map_gap = 0;
    for (int i = 0; i + 1 < 256; ++i)
      map_gap = std::max(map_gap,
                         double(kernels::nf4_dynamic_map()[i + 1] - kernels::nf4_dynamic_map()[i]));
    const int64_t blocks = (w.numel() + 63) / 64;
    std::vector<double> absmax(size_t(blocks), 0.0);
    for (int64_t i = 0; i < w.numel(); ++i)
      absmax[size_t(i / 64)] =
          std::max(absmax[size_t(i / 64)], std::abs(double(w.data<float>()[i])));
    double worst_ratio = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i0 = b * 64, i1 = std::min(w.numel(), i0 + 64);
      const double am = absmax[size_t(b)];
      const double am_q = kernels::nf4_block_absmax(v, b);
      // Double quantization: (absmax - offset) / scale rounds to the dynamic map, so the
      // absmax is off by at most half the map's largest gap times its 256-block's scale.
      double scale = 0;
      for (int64_t c = b / 256 * 256; c < std::min(blocks, b / 256 * 256 + 256); ++c)
        scale = std::max(scale, std::abs(absmax[size_t(c)] - double(q.offset)));
      EXPECT_LE(std::abs(am_q - am), map_gap / 2 * scale + 1e-7) << "block " << b;
      for (int64_t i = i0; i < i1; ++i) {
        const double err = std::abs(double(d.data<float>()[i]) - double(w.data<float>()[i]));
        EXPECT_LE(err, half_gap * am + std::abs(am_q - am) + 1e-7) << "element " << i;
        // With the exact absmax the error is the table's alone.
        const double code = double(d.data<float>()[i]) / am_q;
        EXPECT_LE(std::abs(code * am - double(w.data<float>()[i])), half_gap * am + 1e-6)
            << "element " << i;
        worst_ratio = std::max(worst_ratio, err / am);
      }
    }
    EXPECT_GT(worst_ratio, 0.0);
  }
}

// dtype: bf16 loads the base in bf16: it is quantized from its exact fp32 widening.
TEST(NF4, Bf16BaseIsQuantizedAsItsFp32Widening) {
  const Tensor b = normal_matrix(70, 96, 3).to(DType::BF16);
  const peft::NF4Weight q = peft::quantize_nf4(b), r = peft::quantize_nf4(b.to(DType::F32));
  EXPECT_EQ(q.offset, r.offset);
  for (const auto& [x, y] : {std::pair{&q.codes, &r.codes},
                             {&q.absmax_codes, &r.absmax_codes},
                             {&q.absmax_scales, &r.absmax_scales}}) {
    ASSERT_EQ(x->numel(), y->numel());
    EXPECT_EQ(std::memcmp(x->data<int32_t>(), y->data<int32_t>(), x->numel() * 4), 0);
  }
}

TEST(NF4, TableValuesTimesAbsmaxAreExactUpToTheAbsmax) {
  Tensor w = Tensor::empty({1, 64}, DType::F32);
  for (int i = 0; i < 64; ++i) w.data<float>()[i] = 0.5f * kernels::nf4_table()[i % 16];
  peft::NF4Weight q = peft::quantize_nf4(w);
  Tensor d = peft::dequantize_nf4(q, DType::F32);
  const double am_q = kernels::nf4_block_absmax(q.view(), 0);
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(d.data<float>()[i], kernels::nf4_table()[i % 16] * am_q, 1e-7);
  EXPECT_NEAR(am_q, 0.5, 0.5 * 0.01);
}

TEST(NF4, ZeroBlocksAndBadInput) {
  Tensor z = Tensor::zeros({4, 32}, DType::F32);
  Tensor d = peft::dequantize_nf4(peft::quantize_nf4(z), DType::F32);
  for (int64_t i = 0; i < d.numel(); ++i) EXPECT_EQ(d.data<float>()[i], 0.0f);
  EXPECT_THROW(peft::quantize_nf4(Tensor::zeros({4}, DType::F32)), Error);
  EXPECT_THROW(peft::quantize_nf4(Tensor::zeros({4, 4}, DType::I32)), Error);
}

TEST(NF4, TiledMatmulsMatchTheDequantizedDenseGemm) {
  // 200 x 4096: tiles of 64 rows, the last one partial.
  for (auto [O, K] : {std::pair<int64_t, int64_t>{200, 4096}, {13, 24}}) {
    Tensor w = normal_matrix(O, K, 3);
    peft::NF4Weight q = peft::quantize_nf4(w);
    Tensor wd = peft::dequantize_nf4(q, DType::F64);
    const int64_t N = 5;
    Tensor x = random_tensor({N, K}, DType::F64, 1), dy = random_tensor({N, O}, DType::F64, 2);
    Tensor y = Tensor::empty({N, O}, DType::F64), ref = Tensor::empty({N, O}, DType::F64);
    kernels::nf4_matmul(q.view(), x.data<double>(), N, y.data<double>());
    kernels::gemm<double>(false, true, N, O, K, 1.0, x.data<double>(), K, wd.data<double>(), K, 0.0,
                          ref.data<double>(), O);
    for (int64_t i = 0; i < y.numel(); ++i)
      EXPECT_NEAR(y.data<double>()[i], ref.data<double>()[i], 1e-10);
    Tensor dx = Tensor::empty({N, K}, DType::F64), dref = Tensor::empty({N, K}, DType::F64);
    kernels::nf4_matmul_backward(q.view(), dy.data<double>(), N, dx.data<double>());
    kernels::gemm<double>(false, false, N, K, O, 1.0, dy.data<double>(), O, wd.data<double>(), K,
                          0.0, dref.data<double>(), K);
    for (int64_t i = 0; i < dx.numel(); ++i)
      EXPECT_NEAR(dx.data<double>()[i], dref.data<double>()[i], 1e-10);
  }
}

TEST(NF4, QuantizedBaseIsAboutAnEighthOfFp32) {
  ModelConfig cfg = tiny_config(false, false);
  cfg.hidden_size = 128;
  cfg.intermediate_size = 384;
  cfg.head_dim = 32;
  TrainingGraph tg = build_training_graph(cfg, TrainingGraphOptions{});
  TensorMap params = init_parameters(graph_parameters(tg.graph), 1, DType::F32);
  int64_t fp32 = 0;
  for (const auto& [n, t] : params)
    if (n.find("_proj.weight") != std::string::npos || n == "model.embed_tokens.weight" ||
        n == "lm_head.weight")
      fp32 += int64_t(t.nbytes());
  const size_t before = params.size();
  auto store = peft::quantize_base_weights(params, cfg);
  EXPECT_EQ(params.size() + store->size(), before);
  // The layers' projections, the embedding and the (untied) head.
  EXPECT_EQ(store->size(), size_t(7 * cfg.num_hidden_layers + 2));
  int64_t nf4 = 0;
  for (const auto& [n, w] : *store) nf4 += w.nbytes();
  // 4 bits per weight + 8 bits per 64 (absmax codes) + fp32 per 16384: ~0.127 of fp32's 32 bits.
  EXPECT_LT(double(nf4) / double(fp32), 0.135);
  EXPECT_GT(double(nf4) / double(fp32), 0.12);
}

TEST(NF4, QloraStepPeakIsFarBelowTheFp32Base) {
  ModelConfig cfg = tiny_config(false, false);
  cfg.vocab_size = 64;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 768;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 64;
  peft::LoraConfig c;
  c.attn_modules = {"q_proj", "v_proj"};
  c.rank = 8;
  auto peak_of = [&](bool quantize) {
    const int64_t before = memory::current_bytes();
    int64_t peak = 0;
    {
      TrainingGraph base = build_training_graph(cfg, TrainingGraphOptions{});
      TensorMap params = init_parameters(graph_parameters(base.graph), 1, DType::F32);
      std::shared_ptr<peft::NF4Store> store;
      if (quantize) store = peft::quantize_base_weights(params, cfg);
      peft::init_adapters(params, cfg, c, 1, DType::F32, store.get());
      TrainingGraphOptions o;
      o.batch_size = 1;
      o.seq_len = 8;
      o.trainable = peft::is_adapter_param;
      o.llama = peft::lora_llama_options(c, store);
      TrainingGraph tg = build_training_graph(cfg, o);
      CompiledStep step = compile_graph(tg.graph, PassOptions{});
      Batch batch = random_batch(1, 8, cfg.vocab_size, 2);
      TensorMap inputs = batch_inputs(batch, DType::F32, 1.0 / double(batch.num_valid_labels()));
      memory::reset_peak();
      step.executor->run(inputs, params);
      peak = memory::peak_bytes() - before;
    }
    return peak;
  };
  const int64_t fp32 = peak_of(false), nf4 = peak_of(true);
  EXPECT_LT(double(nf4), 0.35 * double(fp32))
      << "fp32 base " << fp32 << " bytes, NF4 base " << nf4 << " bytes";
}

// Each weight's 4-bit code is the nearest table entry to w / absmax, the lower one on an exact
// tie (bitsandbytes' rule), written out here as a plain argmin; the kernel counts table gaps
// instead, so that it vectorizes. Exact midpoints, both ends and values past them included.
TEST(NF4, CodesAreTheNearestTableEntryWithTiesToTheLowerOne) {
  const float* t = kernels::nf4_table();
  std::vector<float> w;
  w.push_back(1.0f);  // the block's absmax is 1: w / absmax == w exactly
  for (int j = 0; j + 1 < 16; ++j) {
    const float mid = t[j] + (t[j + 1] - t[j]) / 2;
    w.insert(w.end(), {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f), t[j]});
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  while (w.size() < 192 + 13) w.push_back(u(rng));  // three whole blocks and a tail of 13
  w[100] = -1.0f;
  const int64_t n = int64_t(w.size());
  const kernels::NF4Sizes s = kernels::nf4_sizes(n);
  std::vector<int32_t> codes(size_t(s.code_words)), am_codes(size_t(s.absmax_words));
  std::vector<float> scales(size_t(s.scales));
  float offset = 0;
  // Later blocks' absmax is < 1: their w / absmax is computed the way the kernel does.
  kernels::nf4_quantize(w.data(), n, codes.data(), am_codes.data(), scales.data(), &offset);
  for (int64_t i = 0; i < n; ++i) {
    float am = 0;
    for (int64_t k = i / 64 * 64; k < std::min(n, i / 64 * 64 + 64); ++k)
      am = std::max(am, std::abs(w[size_t(k)]));
    const float v = float(double(w[size_t(i)]) / double(am));
    int best = 0;
    for (int j = 1; j < 16; ++j)
      if (std::abs(v - t[j]) < std::abs(v - t[best])) best = j;
    const int got = int((uint32_t(codes[size_t(i >> 3)]) >> (4 * (i & 7))) & 15u);
    ASSERT_EQ(got, best) << "weight " << i << " = " << w[size_t(i)] << " (w/absmax " << v << ")";
  }
  EXPECT_EQ(uint32_t(codes.back()) >> (4 * (n % 8)), 0u);  // the last word's unused codes are 0
}

// A weight quantized a 2^20-element chunk at a time (a checkpoint's bf16 bytes, the random
// init) has the bits of the whole-tensor quantization: here 3 chunks, the last one partial.
TEST(NF4, ChunkedQuantizationHasTheWholeTensorBits) {
  const Tensor w = normal_matrix(1100, 2048, 9);  // 2.25M elements
  const Tensor wb = w.to(DType::BF16);
  const peft::NF4Weight whole = peft::quantize_nf4(wb.to(DType::F32));
  std::atomic<int> calls = 0;  // chunks are produced in parallel
  const peft::NF4Weight chunked =
      peft::quantize_nf4(w.shape(), [&](int64_t first, int64_t n, float* out) {
        ++calls;
        widen_to_f32(wb.data<uint16_t>() + first, DType::BF16, n, out);
      });
  const peft::NF4Weight from_bf16 = peft::quantize_nf4(wb);
  EXPECT_EQ(calls, 35);  // ceil(2.25M / 2^16)
  for (const peft::NF4Weight* q : {&chunked, &from_bf16}) {
    EXPECT_EQ(q->offset, whole.offset);
    EXPECT_EQ(0, std::memcmp(q->codes.raw(), whole.codes.raw(), whole.codes.nbytes()));
    EXPECT_EQ(0, std::memcmp(q->absmax_codes.raw(), whole.absmax_codes.raw(),
                             whole.absmax_codes.nbytes()));
    EXPECT_EQ(0, std::memcmp(q->absmax_scales.raw(), whole.absmax_scales.raw(),
                             whole.absmax_scales.nbytes()));
  }
}
