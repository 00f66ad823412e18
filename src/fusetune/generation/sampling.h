#pragma once
// Choosing the next token from logits, as torchtune's and Hugging Face's generate do:
// temperature, then top-k, then top-p (nucleus) filtering, then a seeded draw.
#include <cstdint>
#include <random>
#include <vector>

namespace fusetune {

struct SamplingOptions {
  double temperature = 0.6;  // 0: greedy (the argmax, ties to the lowest id)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the fewest most likely tokens whose mass reaches p; 1: all
  void validate() const;     // throws fusetune::Error naming the key at fault
};

// The distribution the next token is drawn from: softmax(logits / temperature) over the
// tokens that survive top_k (ties at the k-th logit broken towards lower ids), then top_p (a
// token survives when the mass of the tokens ranked above it is below p, so the most likely
// one always does), renormalized; 0 for filtered tokens. Greedy: all mass on the argmax.
std::vector<double> sampling_distribution(const double* logits, int64_t vocab,
                                          const SamplingOptions& o);

// Draws tokens from sampling_distribution with a seeded generator: the same seed, logits and
// options give the same tokens on every machine (std::mt19937_64 is fully specified, and the
// uniform is built from its bits here rather than by a library distribution).
class Sampler {
 public:
  Sampler(SamplingOptions o, uint64_t seed) : o_(o), rng_(seed) {}
  int32_t next(const double* logits, int64_t vocab);
  double uniform();  // in [0, 1), 53 random bits

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

}  // namespace fusetune
