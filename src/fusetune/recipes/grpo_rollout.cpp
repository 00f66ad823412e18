#include "fusetune/recipes/grpo_rollout.h"

#include <algorithm>
#include <cmath>

#include "fusetune/util/error.h"
#include "fusetune/util/mix64.h"

namespace fusetune {
namespace {

// log softmax(logits[row] / t)[token], accumulated in double.
double rollout_token_logp(const Tensor& logits, int64_t row, int32_t token, double t) {
  const int64_t V = logits.shape()[1];
  const float* z = logits.data<float>() + row * V;
  double mx = double(z[0]) / t;
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(z[v]) / t);
  double s = 0;
  for (int64_t v = 0; v < V; ++v) s += std::exp(double(z[v]) / t - mx);
  return double(z[token]) / t - mx - std::log(s);
}

}  // namespace

GrpoRollout generate_rollout(Generator& generator, const std::vector<std::vector<int32_t>>& prompts,
                             int64_t samples, const GenerationOptions& o,
                             const std::vector<uint64_t>& prompt_seeds) {
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
  // Each run's logits [rows, V]; run k chose every unfinished row's k-th token.
  std::vector<Tensor> runs;
  generator.on_logits = [&runs](const Tensor& logits) {
    if (logits.dtype() == DType::F32) {
      runs.push_back(logits.clone());
      return;
    }
    // A bf16 model's logits, widened (each value exact in fp32).
    Tensor f = Tensor::empty({logits.dim(0), logits.dim(1)}, DType::F32);
    for (int64_t i = 0; i < f.numel(); ++i)
      f.data<float>()[i] = float(element_as_double(logits, i));
    runs.push_back(std::move(f));
  };
  const double t = o.sampling.temperature > 0 ? o.sampling.temperature : 1.0;
  GenerationResult g = generator.generate(r.prompts, go);
  generator.on_logits = nullptr;
  r.completions = std::move(g.tokens);
  for (size_t b = 0; b < r.completions.size(); ++b) {
    r.stopped.push_back(g.finish_reason[b] == "stop");
    std::vector<double> lp;
    for (size_t k = 0; k < r.completions[b].size(); ++k)
      lp.push_back(rollout_token_logp(runs.at(k), int64_t(b), r.completions[b][k], t));
    r.logps.push_back(std::move(lp));
  }
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
