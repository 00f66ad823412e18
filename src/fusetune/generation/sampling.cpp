#include "fusetune/generation/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The ids of the `count` highest logits, highest first and the lower id first among equals:
// a stable sort's first `count`, found by a selection (O(vocab)) and a sort of those alone,
// since a rollout samples over 128K-token vocabularies for every row at every step.
std::vector<int64_t> sampling_top_ids(const double* logits, int64_t vocab, int64_t count) {
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const auto ranks_above = [logits](int64_t a, int64_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (count < vocab) {
    std::nth_element(ids.begin(), ids.begin() + count, ids.end(), ranks_above);
    ids.resize(size_t(count));
  }
  std::sort(ids.begin(), ids.end(), ranks_above);
  return ids;
}

// Nucleus over the ranked candidates `ids` whose weights w (exp((logit - max) / t)) sum to
// `sum`: p = w / sum for the ranks kept while the mass above them is below top_p, then
// renormalized; 0 elsewhere. Returns false when every candidate was kept before the mass
// reached top_p and more candidates exist (the caller ranks more and calls again).
bool sampling_nucleus(const std::vector<int64_t>& ids, const std::vector<double>& w, double sum,
                      double top_p, bool more, std::vector<double>& p) {
  double above = 0;
  size_t kept_ranks = 0;
  for (; kept_ranks < ids.size() && above < top_p; ++kept_ranks)
    above += w[size_t(ids[kept_ranks])] / sum;
  if (above < top_p && more) return false;
  double kept = 0;
  for (size_t r = 0; r < kept_ranks; ++r) {
    const auto id = size_t(ids[r]);
    p[id] = w[id] / sum;
    kept += p[id];
  }
  for (size_t r = 0; r < kept_ranks; ++r) p[size_t(ids[r])] /= kept;
  return true;
}

}  // namespace

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
  const int64_t argmax = std::max_element(logits, logits + vocab) - logits;
  if (o.temperature == 0) {
    p[size_t(argmax)] = 1.0;
    return p;
  }
  const double mx = logits[argmax];
  const auto weight = [&](int64_t id) { return std::exp((logits[id] - mx) / o.temperature); };
  if (o.top_k > 0) {  // the k highest, summed in rank order, then the nucleus among them
    const std::vector<int64_t> ids = sampling_top_ids(logits, vocab, std::min(o.top_k, vocab));
    std::vector<double> w(size_t(vocab), 0.0);
    double sum = 0;
    for (int64_t id : ids) sum += (w[size_t(id)] = weight(id));
    sampling_nucleus(ids, w, sum, o.top_p, false, p);
    return p;
  }
  // The whole vocabulary, summed in id order; without a nucleus, no ranking at all.
  double sum = 0;
  if (o.top_p >= 1) {
    for (int64_t id = 0; id < vocab; ++id) sum += (p[size_t(id)] = weight(id));
    for (int64_t id = 0; id < vocab; ++id) p[size_t(id)] /= sum;
    return p;
  }
  std::vector<double> w(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) sum += (w[size_t(id)] = weight(id));
  // The nucleus is usually a small part of the vocabulary: rank 256 candidates, 8x more
  // while they hold less than top_p.
  for (int64_t count = std::min<int64_t>(256, vocab);; count = std::min(vocab, count * 8))
    if (sampling_nucleus(sampling_top_ids(logits, vocab, count), w, sum, o.top_p, count < vocab, p))
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
