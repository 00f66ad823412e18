#pragma once
// A hand-made reward model for the PPO tests: its score is how close the last token's
// embedding is to `target`'s. The layers' outputs are zeroed (o_proj and down_proj), so the
// residual stream is the token's embedding, and the score head reads along the target's
// embedding, scaled to `scale` at the target itself.
#include <algorithm>
#include <cmath>
#include <string>

#include "fusetune/recipes/recipe_setup.h"

namespace fusetune::testing {

inline void make_token_reward(LoadedModel& m, int32_t target, double scale) {
  for (auto& [name, t] : m.params)
    if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos)
      std::fill(t.data<float>(), t.data<float>() + t.numel(), 0.0f);
  const Tensor& e = m.params.at("model.embed_tokens.weight");
  const int64_t d = e.dim(1);
  double norm = 0;
  for (int64_t j = 0; j < d; ++j) norm += std::pow(e.data<float>()[target * d + j], 2);
  Tensor& s = m.params.at("score.weight");
  for (int64_t j = 0; j < d; ++j)
    s.data<float>()[j] = float(scale * e.data<float>()[target * d + j] / std::sqrt(norm));
}

}  // namespace fusetune::testing
