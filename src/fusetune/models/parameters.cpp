#include "fusetune/models/parameters.h"

#include <cmath>
#include <random>
#include <set>

namespace fusetune {

std::vector<ParamInfo> graph_parameters(const Graph& g) {
  std::vector<ParamInfo> out;
  std::set<std::string> seen;
  for (const Node& n : g.nodes())
    if (n.op == Op::Param && seen.insert(n.name).second)
      out.push_back({n.name, n.outputs[0].shape, n.trainable});
  return out;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

TensorMap init_parameters(const std::vector<ParamInfo>& params, uint64_t seed, DType dtype,
                          double std) {
  TensorMap out;
  std::mt19937_64 rng(seed);
  // Box-Muller on raw 53-bit uniforms: identical across standard libraries, unlike
  // std::normal_distribution.
  auto uniform = [&] { return (double(rng() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  for (const ParamInfo& p : params) {
    Tensor t = Tensor::empty(p.shape, DType::F64);
    double* d = t.data<double>();
    const int64_t n = t.numel();
    if (ends_with(p.name, "norm.weight")) {
      for (int64_t i = 0; i < n; ++i) d[i] = 1.0;
    } else if (ends_with(p.name, ".bias")) {
      for (int64_t i = 0; i < n; ++i) d[i] = 0.0;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        double u1 = uniform(), u2 = uniform();
        d[i] = std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      }
    }
    out[p.name] = dtype == DType::F64 ? t : t.to(dtype);
  }
  return out;
}

}  // namespace fusetune
