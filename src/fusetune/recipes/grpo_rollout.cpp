#include "fusetune/recipes/grpo_rollout.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "fusetune/util/error.h"
#include "fusetune/util/mix64.h"

namespace fusetune {
namespace {

// log softmax(logits[row] / t)[token] in one streaming pass over the row: a running max and
// the sum of exp below it, rescaled when the max grows; fp32 (or bf16) reads, double sums.
double rollout_token_logp(const Tensor& logits, int64_t row, int32_t token, double t) {
  const int64_t V = logits.dim(1);
  const bool f32 = logits.dtype() == DType::F32;
  const float* z = f32 ? logits.data<float>() + row * V : nullptr;
  const auto at = [&](int64_t v) {
    return (f32 ? double(z[v]) : element_as_double(logits, row * V + v)) / t;
  };
  double mx = at(0), sum = 1;
  for (int64_t v = 1; v < V; ++v) {
    const double x = at(v);
    if (x > mx) {
      sum = sum * std::exp(mx - x) + 1;
      mx = x;
    } else {
      sum += std::exp(x - mx);
    }
  }
  return at(token) - mx - std::log(sum);
}

// Appends each chosen token's log-prob to its row's list, the rows in parallel (each row's
// sum is one thread's, in one order: the same values for any thread count).
void record_rollout_logps(const Tensor& logits, const std::vector<int32_t>& chosen, double t,
                          std::vector<std::vector<double>>& logps) {
  const auto rows = int64_t(chosen.size());
#pragma omp parallel for schedule(dynamic, \
                                  1) if (rows > 1 && logits.dim(1) >= kParallelRowsMinVocab)
  for (int64_t b = 0; b < rows; ++b)
    if (chosen[size_t(b)] >= 0)
      logps[size_t(b)].push_back(rollout_token_logp(logits, b, chosen[size_t(b)], t));
}

}  // namespace

GrpoRollout generate_rollout(Generator& generator, const std::vector<std::vector<int32_t>>& prompts,
                             int64_t samples, const GenerationOptions& o,
                             const std::vector<uint64_t>& prompt_seeds, RolloutLogps logps) {
  FT_CHECK(samples >= 1, "grpo_samples must be >= 1");
  FT_CHECK(prompt_seeds.empty() || prompt_seeds.size() == prompts.size(),
           "generate_rollout: one seed per prompt");
  GrpoRollout r;
  GenerationOptions go = o;
  for (size_t p = 0; p < prompts.size(); ++p)
    for (int64_t s = 0; s < samples; ++s) {
      r.prompts.push_back(prompts[p]);
      if (!prompt_seeds.empty())
        go.row_seeds.push_back(mix64(prompt_seeds[p] + uint64_t(s + 1) * kMix64Gamma));
    }
  if (logps == RolloutLogps::Record) {
    r.logps.resize(r.prompts.size());
    const double t = o.sampling.temperature > 0 ? o.sampling.temperature : 1.0;
    generator.on_chosen = [&r, t](const Tensor& logits, const std::vector<int32_t>& chosen) {
      record_rollout_logps(logits, chosen, t, r.logps);
    };
  }
  GenerationResult g;
  try {
    g = generator.generate(r.prompts, go);
  } catch (...) {
    generator.on_chosen = nullptr;
    throw;
  }
  generator.on_chosen = nullptr;
  r.completions = std::move(g.tokens);
  for (const std::string& reason : g.finish_reason) r.stopped.push_back(reason == "stop");
  return r;
}

Batch rollout_batch(const GrpoRollout& r, int32_t pad_id, int64_t pad_to) {
  FT_CHECK(pad_to >= 1, "rollout_batch: pad_to must be >= 1");
  Batch b;
  b.batch_size = int64_t(r.prompts.size());
  for (size_t i = 0; i < r.prompts.size(); ++i)
    b.seq_len = std::max(b.seq_len, int64_t(r.prompts[i].size() + r.completions[i].size()));
  b.seq_len = (b.seq_len + pad_to - 1) / pad_to * pad_to;
  const auto T = size_t(b.seq_len);
  b.tokens.assign(size_t(b.batch_size) * T, pad_id);
  b.labels.assign(size_t(b.batch_size) * T, kIgnoreIndex);
  b.positions.resize(size_t(b.batch_size) * T);
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const size_t P = r.prompts[i].size(), C = r.completions[i].size();
    FT_CHECK(P >= 1, "a GRPO prompt has no tokens");
    std::copy(r.prompts[i].begin(), r.prompts[i].end(), b.tokens.begin() + long(i * T));
    std::copy(r.completions[i].begin(), r.completions[i].end(), b.tokens.begin() + long(i * T + P));
    // Position t predicts token t + 1: completion token k is predicted at P - 1 + k.
    for (size_t k = 0; k < C; ++k) b.labels[i * T + P - 1 + k] = r.completions[i][k];
    for (size_t t = 0; t < T; ++t) b.positions[i * T + t] = int32_t(t);
    b.items.push_back(int64_t(i));
  }
  return b;
}

std::vector<float> completion_mask(const Batch& b) {
  std::vector<float> m(b.labels.size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = b.labels[i] != kIgnoreIndex ? 1.0f : 0.0f;
  return m;
}

}  // namespace fusetune
