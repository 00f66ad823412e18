#include "fusetune/models/rope_tables.h"

#include <cmath>

#include "fusetune/util/error.h"

namespace fusetune {

std::vector<double> rope_inv_freq(const ModelConfig& cfg, int64_t seq_len) {
  const int64_t hd = cfg.head_dim;
  std::vector<double> inv(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i)
    inv[size_t(i)] = 1.0 / std::pow(cfg.rope_theta, double(2 * i) / double(hd));
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.rope_type == "llama3") {
    // transformers' _compute_llama3_parameters
    const double pi = 3.14159265358979323846;
    const double old_ctx = double(rs.original_max_position_embeddings);
    const double low_wavelen = old_ctx / rs.low_freq_factor;
    const double high_wavelen = old_ctx / rs.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f = f / rs.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1 - smooth) * f / rs.factor + smooth * f;
      }
    }
  } else if (rs.rope_type == "linear") {
    for (double& f : inv) f /= rs.factor;
  } else if (rs.rope_type == "longrope") {
    // transformers' _compute_longrope_parameters: inv_freq / ext_factors.
    const auto& ext =
        seq_len > rs.original_max_position_embeddings ? rs.long_factor : rs.short_factor;
    FT_CHECK(ext.size() == inv.size(),
             "rope_scaling: LongRoPE needs head_dim / 2 = " + std::to_string(inv.size()) +
                 " factors, got " + std::to_string(ext.size()));
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= ext[i];
  } else {
    FT_CHECK(rs.rope_type.empty() || rs.rope_type == "default",
             "unsupported rope_scaling type '" + rs.rope_type +
                 "' (supported: llama3, linear, longrope)");
  }
  return inv;
}

std::pair<Tensor, Tensor> rope_tables(const ModelConfig& cfg, int64_t n_positions, DType dtype) {
  const auto inv = rope_inv_freq(cfg, n_positions);
  const int64_t half = int64_t(inv.size());
  const double scale =
      cfg.rope_scaling.rope_type == "longrope" ? cfg.rope_scaling.attention_factor : 1.0;
  Tensor c = Tensor::empty({n_positions, half}, DType::F64);
  Tensor s = Tensor::empty({n_positions, half}, DType::F64);
  for (int64_t p = 0; p < n_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // float32 angle as transformers computes it (inv_freq and positions in fp32).
      const double angle = dtype == DType::F32 ? double(float(p) * float(inv[size_t(i)]))
                                               : double(p) * inv[size_t(i)];
      c.data<double>()[p * half + i] = std::cos(angle) * scale;
      s.data<double>()[p * half + i] = std::sin(angle) * scale;
    }
  if (dtype == DType::F64) return {c, s};
  return {c.to(dtype), s.to(dtype)};
}

}  // namespace fusetune
