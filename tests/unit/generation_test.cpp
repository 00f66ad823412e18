// Generation with a KV cache: the attention kernel against a direct formula, every step's
// cached logits against a full recomputation (build_logits_graph, an independent path: causal
// mask + softmax over the whole sequence), left-padded batches against one prompt at a time,
// the three compile modes, and the sampler against hand-computed distributions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "fusetune/compile/compiler.h"
#include "fusetune/generation/generator.h"
#include "fusetune/kernels/cpu/kv_cache_attention.h"
#include "fusetune/models/decode_graph.h"
#include "fusetune/models/parameters.h"
#include "fusetune/models/training_graph.h"
#include "fusetune/runtime/eager_executor.h"
#include "fusetune/util/error.h"
#include "tiny_models.h"

using namespace fusetune;
using namespace fusetune::testing;

namespace {

std::vector<double> randn(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d;
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

TEST(KVCacheAttention, MatchesTheFormulaWithGqaPaddingAndAnOffset) {
  const int64_t B = 2, T = 3, H = 4, KV = 2, hd = 5, S = 9, pos = 4;
  const kernels::KVCacheDims d{B, T, H, KV, hd, S};
  auto q = randn(size_t(B * T * H * hd), 1), k = randn(size_t(B * T * KV * hd), 2),
       v = randn(size_t(B * T * KV * hd), 3);
  auto kc = randn(size_t(B * S * KV * hd), 4), vc = randn(size_t(B * S * KV * hd), 5);
  const auto kc0 = kc, vc0 = vc;
  const std::vector<int32_t> start{1, 6};  // row 1: its first query (slot 4) sees nothing
  std::vector<double> o(q.size());
  const double scale = 0.37;
  kernels::kv_cache_attention<double>(q.data(), k.data(), v.data(), kc.data(), vc.data(), pos,
                                      start.data(), o.data(), d, scale);
  // The cache: new slots [pos, pos + T) hold k, v; every other slot is untouched.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t e = 0; e < KV * hd; ++e) {
        const size_t at = size_t((b * S + s) * KV * hd + e);
        const bool fresh = s >= pos && s < pos + T;
        const size_t src = size_t((b * T + (s - pos)) * KV * hd + e);
        EXPECT_EQ(kc[at], fresh ? k[src] : kc0[at]);
        EXPECT_EQ(vc[at], fresh ? v[src] : vc0[at]);
      }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / KV), last = pos + t;
        std::vector<double> w;
        double mx = -INFINITY;
        for (int64_t j = start[size_t(b)]; j <= last; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += q[size_t(((b * T + t) * H + h) * hd + e)] *
                   kc[size_t(((b * S + j) * KV + g) * hd + e)];
          w.push_back(scale * dot);
          mx = std::max(mx, w.back());
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double ref = 0;
          for (size_t i = 0; i < w.size(); ++i)
            ref += w[i] / sum *
                   vc[size_t(((b * S + start[size_t(b)] + int64_t(i)) * KV + g) * hd + e)];
          EXPECT_NEAR(o[size_t(((b * T + t) * H + h) * hd + e)], ref, 1e-12)
              << "b " << b << " t " << t << " h " << h;
        }
      }
}

TEST(KVCacheAttention, RefusesToWritePastTheCache) {
  const kernels::KVCacheDims d{1, 2, 2, 1, 2, 4};
  std::vector<float> q(4), k(4), v(4), kc(8), vc(8), o(4);
  const int32_t start = 0;
  EXPECT_THROW(kernels::kv_cache_attention<float>(q.data(), k.data(), v.data(), kc.data(),
                                                  vc.data(), 3, &start, o.data(), d, 1.0),
               Error);
}

struct Model {
  ModelConfig cfg;
  TensorMap params;
  DType dtype;
};

// `family`: another family's tiny config (tiny_models.h) instead of the Qwen2-like Llama.
Model tiny_model(DType dt, bool tied = false, const ModelConfig* family = nullptr) {
  Model m{family ? *family : tiny_config(tied, /*qkv_bias=*/true, 2), {}, dt};
  m.cfg.vocab_size = 29;
  Graph g = build_logits_graph(m.cfg, 1, 4, dt);
  m.params = init_parameters(graph_parameters(g), 7, dt, 0.5);
  return m;
}

// The last position's logits of one unpadded sequence, computed without any cache.
std::vector<double> full_logits(const Model& m, const std::vector<int32_t>& ids) {
  const int64_t T = int64_t(ids.size());
  EagerExecutor ex(build_logits_graph(m.cfg, 1, T, m.dtype));
  Tensor tok = Tensor::empty({1, T}, DType::I32), pos = Tensor::empty({1, T}, DType::I32);
  for (int64_t i = 0; i < T; ++i) {
    tok.data<int32_t>()[i] = ids[size_t(i)];
    pos.data<int32_t>()[i] = int32_t(i);
  }
  Tensor logits = ex.run({{"tokens", tok}, {"positions", pos}}, m.params)[0];
  std::vector<double> row;
  for (int64_t j = 0; j < m.cfg.vocab_size; ++j)
    row.push_back(element_as_double(logits, (T - 1) * m.cfg.vocab_size + j));
  return row;
}

double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / std::max(den, 1e-30);
}

std::vector<double> row_of(const Tensor& logits, int64_t b) {
  std::vector<double> row;
  for (int64_t j = 0; j < logits.dim(1); ++j)
    row.push_back(element_as_double(logits, b * logits.dim(1) + j));
  return row;
}

// Greedy generation; checks every run's logits against recomputing each row from scratch.
void check_cache_against_recomputation(DType dt, CompileMode mode, double tol,
                                       const ModelConfig* family = nullptr) {
  Model m = tiny_model(dt, /*tied=*/mode == CompileMode::Model, family);
  const std::vector<std::vector<int32_t>> prompts{{3, 7, 1, 20, 5}, {11, 2}, {8}};
  Generator gen(m.cfg, m.params, {}, mode, dt);
  std::vector<std::vector<int32_t>> seqs = prompts;
  int64_t runs = 0;
  gen.on_logits = [&](const Tensor& logits) {
    for (size_t b = 0; b < prompts.size(); ++b)
      EXPECT_LE(rel_diff(row_of(logits, int64_t(b)), full_logits(m, seqs[b])), tol)
          << "run " << runs << " row " << b << " mode " << compile_mode_name(mode);
    ++runs;
  };
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.sampling.temperature = 0;
  GenerationResult r =
      gen.generate(prompts, o, [&](int64_t b, int32_t id) { seqs[size_t(b)].push_back(id); });
  EXPECT_EQ(runs, 12);
  EXPECT_EQ(r.stats.decode_steps, 11);
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(r.tokens[b].size(), 12u);
    EXPECT_EQ(r.finish_reason[b], "length");
  }
}

TEST(Generator, CachedLogitsEqualRecomputationF64AllModes) {
  for (CompileMode mode : {CompileMode::None, CompileMode::Model, CompileMode::Full})
    check_cache_against_recomputation(DType::F64, mode, 1e-12);
}

// Gemma 2: sequences of up to 17 tokens against a window of 3, soft-capped scores and logits.
TEST(Generator, Gemma2CachedLogitsEqualRecomputationPastTheWindow) {
  const ModelConfig gemma2 = tiny_gemma2_config();
  for (CompileMode mode : {CompileMode::None, CompileMode::Full})
    check_cache_against_recomputation(DType::F64, mode, 1e-12, &gemma2);
}

// The other families' own cache entries: Qwen3's and Gemma 3's q/k norms before the cached
// keys, Gemma's scaled embeddings and MQA, Gemma 3's local layers (window 3) on their own RoPE
// base, Phi-3's fused projections sliced before the cache.
TEST(Generator, Qwen3GemmaGemma3Phi3CachedLogitsEqualRecomputation) {
  for (const ModelConfig& family :
       {tiny_qwen3_config(), tiny_gemma_config(), tiny_gemma3_config(), tiny_phi3_config()}) {
    SCOPED_TRACE(family.model_type);
    for (CompileMode mode : {CompileMode::None, CompileMode::Full})
      check_cache_against_recomputation(DType::F64, mode, 1e-12, &family);
  }
}

TEST(Generator, CachedLogitsEqualRecomputationF32) {
  check_cache_against_recomputation(DType::F32, CompileMode::Full, 1e-5);
}

TEST(Generator, BatchedRowsEqualOnePromptAtATimeAndNoCacheAgrees) {
  Model m = tiny_model(DType::F32);
  const std::vector<std::vector<int32_t>> prompts{{4, 9, 9, 1}, {17}, {2, 6}};
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.sampling.temperature = 0;
  Generator gen(m.cfg, m.params, {}, CompileMode::Full, DType::F32);
  GenerationResult batched = gen.generate(prompts, o);
  o.use_kv_cache = false;
  GenerationResult recomputed = gen.generate(prompts, o);
  EXPECT_EQ(recomputed.tokens, batched.tokens);
  EXPECT_EQ(recomputed.stats.kv_cache_bytes, 0);
  o.use_kv_cache = true;
  for (size_t b = 0; b < prompts.size(); ++b)
    EXPECT_EQ(gen.generate({prompts[b]}, o).tokens[0], batched.tokens[b]) << "row " << b;
}

TEST(Generator, StopsAtAStopTokenPerRow) {
  Model m = tiny_model(DType::F32);
  GenerationOptions o;
  o.max_new_tokens = 8;
  o.sampling.temperature = 0;
  Generator gen(m.cfg, m.params, {}, CompileMode::None, DType::F32);
  const std::vector<int32_t> free_run = gen.generate({{5, 3}}, o).tokens[0];
  o.stop_tokens = {free_run[2]};
  GenerationResult r = gen.generate({{5, 3}, {5, 3}}, o);
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_EQ(r.finish_reason[b], "stop");
    // Up to and including the first occurrence of the stop token.
    const auto first = std::find(free_run.begin(), free_run.end(), free_run[2]);
    EXPECT_EQ(r.tokens[b], std::vector<int32_t>(free_run.begin(), first + 1));
  }
}

TEST(Generator, SeededSamplingIsDeterministic) {
  Model m = tiny_model(DType::F32);
  GenerationOptions o;
  o.max_new_tokens = 20;
  o.sampling = {1.0, 10, 0.9};
  o.seed = 5;
  Generator gen(m.cfg, m.params, {}, CompileMode::Full, DType::F32);
  const auto a = gen.generate({{1, 2, 3}}, o).tokens;
  EXPECT_EQ(gen.generate({{1, 2, 3}}, o).tokens, a);
  o.seed = 6;
  EXPECT_NE(gen.generate({{1, 2, 3}}, o).tokens, a);
}

TEST(Generator, StopsWhenTheContextIsFullAndRejectsBadPrompts) {
  Model m = tiny_model(DType::F32);
  m.cfg.max_position_embeddings = 8;
  Generator gen(m.cfg, m.params, {}, CompileMode::Full, DType::F32);
  GenerationOptions o;
  o.max_new_tokens = 50;
  o.sampling.temperature = 0;
  GenerationResult r = gen.generate({{1, 2, 3}}, o);
  EXPECT_EQ(r.finish_reason[0], "context");
  EXPECT_EQ(r.tokens[0].size(), 6u);  // 3 + 6 = 9 tokens: the last predicted at position 7
  EXPECT_THROW(gen.generate({std::vector<int32_t>(8, 1)}, o), Error);  // no room left
  EXPECT_THROW(gen.generate({{}}, o), Error);
  EXPECT_THROW(gen.generate({{1, 99}}, o), Error);  // outside the vocabulary
  o.sampling.top_p = 0;
  EXPECT_THROW(gen.generate({{1}}, o), Error);
}

// ---- sampling -----------------------------------------------------------------------------

TEST(Sampling, TemperatureTopKTopPMatchAHandComputedDistribution) {
  const std::vector<double> logits{1.0, 3.0, 2.0, 3.0, -1.0};
  // temperature 2, no filtering: softmax(logits / 2).
  {
    auto p = sampling_distribution(logits.data(), 5, {2.0, 0, 1.0});
    double z = 0;
    for (double l : logits) z += std::exp(l / 2);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(p[i], std::exp(logits[i] / 2) / z, 1e-15);
  }
  // top_k 2: the two 3.0 logits (ids 1 and 3) share the mass.
  {
    auto p = sampling_distribution(logits.data(), 5, {1.0, 2, 1.0});
    EXPECT_EQ(p, (std::vector<double>{0, 0.5, 0, 0.5, 0}));
  }
  // top_p 0.7 at temperature 1: probabilities e^3, e^3, e^2, e^1, e^-1 over their sum
  // (0.4223, 0.4223, 0.1554, 0.0571, 0.0077): ids 1 and 3 hold 0.8446 >= 0.7 after two
  // tokens, so only they survive; top_p 0.9 also keeps id 2 (0.8446 < 0.9).
  {
    auto p = sampling_distribution(logits.data(), 5, {1.0, 0, 0.7});
    EXPECT_EQ(p, (std::vector<double>{0, 0.5, 0, 0.5, 0}));
    auto q = sampling_distribution(logits.data(), 5, {1.0, 0, 0.9});
    const double z = 2 * std::exp(3.0) + std::exp(2.0);
    EXPECT_NEAR(q[1], std::exp(3.0) / z, 1e-15);
    EXPECT_NEAR(q[2], std::exp(2.0) / z, 1e-15);
    EXPECT_EQ(q[0], 0.0);
    EXPECT_EQ(q[4], 0.0);
  }
  // Greedy: the first of the largest.
  EXPECT_EQ(sampling_distribution(logits.data(), 5, {0.0, 0, 1.0})[1], 1.0);
}

// Over a vocabulary larger than the first candidates the nucleus ranks (256), with tied logits:
// top-k and top-p keep the tokens a full stable sort by logit keeps, as torchtune's sort does.
TEST(Sampling, TopKAndTopPOverALargeVocabularyKeepAFullSortsTokens) {
  const int64_t V = 3000;
  std::vector<double> logits(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) logits[size_t(i)] = double((i * 7919) % 401) / 100.0;
  std::vector<int64_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  const double mx = logits[size_t(order[0])];
  for (const SamplingOptions o : {SamplingOptions{0.8, 300, 1.0}, SamplingOptions{0.8, 0, 0.9},
                                  SamplingOptions{0.8, 1000, 0.5}}) {
    const int64_t k = o.top_k > 0 ? o.top_k : V;
    double z = 0;
    for (int64_t r = 0; r < k; ++r) z += std::exp((logits[size_t(order[size_t(r)])] - mx) / 0.8);
    std::vector<double> expect(static_cast<size_t>(V), 0.0);
    double above = 0, kept = 0;
    for (int64_t r = 0; r < k && above < o.top_p; ++r) {
      const auto id = size_t(order[size_t(r)]);
      expect[id] = std::exp((logits[id] - mx) / 0.8) / z;
      above += expect[id];
      kept += expect[id];
    }
    const std::vector<double> p = sampling_distribution(logits.data(), V, o);
    int64_t survivors = 0;
    for (int64_t i = 0; i < V; ++i) {
      EXPECT_NEAR(p[size_t(i)], expect[size_t(i)] / kept, 1e-12) << "token " << i;
      EXPECT_EQ(p[size_t(i)] > 0, expect[size_t(i)] > 0) << "token " << i;
      survivors += p[size_t(i)] > 0;
    }
    EXPECT_GT(survivors, o.top_k > 0 ? 200 : 300);  // past the first 256 candidates
  }
}

TEST(Sampling, DrawsFollowTheDistribution) {
  const std::vector<double> logits{0.0, std::log(3.0), -50.0};
  Sampler s({1.0, 0, 1.0}, 9);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 20000; ++i) ++counts[s.next(logits.data(), 3)];
  EXPECT_NEAR(counts[1] / 20000.0, 0.75, 0.015);
  EXPECT_EQ(counts[2], 0);
  Sampler greedy({0.0, 0, 1.0}, 9);
  EXPECT_EQ(greedy.next(logits.data(), 3), 1);
}

TEST(Sampling, RejectsBadOptions) {
  EXPECT_THROW((SamplingOptions{-1.0, 0, 1.0}.validate()), Error);
  EXPECT_THROW((SamplingOptions{1.0, -2, 1.0}.validate()), Error);
  EXPECT_THROW((SamplingOptions{1.0, 0, 1.5}.validate()), Error);
}

}  // namespace
