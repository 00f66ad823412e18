#pragma once
// Classifier checkpoints for the PPO tests, made from a causal one, and a hand-made reward
// model: make_token_reward's score is how close the last token's embedding is to `target`'s. The
// layers' outputs are zeroed (o_proj and down_proj), so the residual stream is the token's
// embedding, and the score head reads along the target's embedding, scaled to `scale` at the target
// itself.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "fusetune/io/hf_checkpoint.h"
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

// The causal checkpoint in `causal` as a classifier of `labels` scores (a fresh score head:
// to_sequence_classifier with `seed`, std 0.02), after `edit`, written to `dir`; returns dir.
inline std::filesystem::path write_classifier_checkpoint(
    const std::filesystem::path& causal, const std::filesystem::path& dir, uint64_t seed,
    int64_t labels = 1, const std::function<void(LoadedModel&)>& edit = {}) {
  HFCheckpoint ck = load_hf_checkpoint_owned(causal, {}, DType::F32);
  LoadedModel m;
  m.config = ck.config;
  for (auto& [name, t] : ck.tensors) m.params[name] = t.clone();
  to_sequence_classifier(m, labels, seed, 0.02);
  if (edit) edit(m);
  NamedTensors tensors;
  for (const auto& [name, shape] : expected_parameters(m.config))
    tensors.push_back({name, m.params.at(name)});
  save_hf_checkpoint(dir, m.config, tensors);
  return dir;
}

}  // namespace fusetune::testing
