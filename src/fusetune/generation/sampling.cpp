#include "fusetune/generation/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune {

void SamplingOptions::validate() const {
  FT_CHECK(std::isfinite(temperature) && temperature >= 0,
           "temperature must be >= 0 (0: greedy), got " + std::to_string(temperature));
  FT_CHECK(top_k >= 0, "top_k must be >= 0 (0: no top-k filtering), got " + std::to_string(top_k));
  FT_CHECK(top_p > 0 && top_p <= 1,
           "top_p must be in (0, 1] (1: no nucleus filtering), got " + std::to_string(top_p));
}

std::vector<double> sampling_distribution(const double* logits, int64_t vocab,
                                          const SamplingOptions& o) {
  FT_CHECK(vocab >= 1, "sampling: empty vocabulary");
  std::vector<double> p(size_t(vocab), 0.0);
  if (o.temperature == 0) {
    p[size_t(std::max_element(logits, logits + vocab) - logits)] = 1.0;
    return p;
  }
  // Token ids by logit, highest first (lower id first among equals).
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  const double mx = logits[order[0]];
  double sum = 0;
  for (int64_t r = 0; r < k; ++r) {
    const int64_t id = order[size_t(r)];
    p[size_t(id)] = std::exp((logits[id] - mx) / o.temperature);
    sum += p[size_t(id)];
  }
  // Nucleus: keep ranks while the mass above them is below top_p.
  double above = 0, kept = 0;
  for (int64_t r = 0; r < k; ++r) {
    double& pr = p[size_t(order[size_t(r)])];
    pr /= sum;
    if (above < o.top_p) {
      above += pr;
      kept += pr;
    } else {
      pr = 0;
    }
  }
  for (int64_t r = 0; r < k; ++r) p[size_t(order[size_t(r)])] /= kept;
  return p;
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::next(const double* logits, int64_t vocab) {
  if (o_.temperature == 0) return int32_t(std::max_element(logits, logits + vocab) - logits);
  const std::vector<double> p = sampling_distribution(logits, vocab, o_);
  const double u = uniform();
  double acc = 0;
  int32_t last = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (p[size_t(i)] == 0) continue;
    acc += p[size_t(i)];
    last = int32_t(i);
    if (u < acc) return last;
  }
  return last;  // rounding left u above the total: the last token with mass
}

}  // namespace fusetune
