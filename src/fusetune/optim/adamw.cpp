#include "fusetune/optim/adamw.h"

#include <cmath>

#include "fusetune/optim/adamw_math.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, const adamw_math::Coefficients& c) {
  const adamw_math::Update<T> update(c);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) update(p[i], g[i], m[i], v[i]);
}

}  // namespace

AdamW::AdamW(AdamWOptions options) : options_(options) {
  const auto& o = options_;
  FT_CHECK(o.beta1 >= 0 && o.beta1 < 1,
           "AdamW: beta1 must be in [0, 1), got " + std::to_string(o.beta1));
  FT_CHECK(o.beta2 >= 0 && o.beta2 < 1,
           "AdamW: beta2 must be in [0, 1), got " + std::to_string(o.beta2));
  FT_CHECK(o.eps >= 0 && std::isfinite(o.eps),
           "AdamW: eps must be >= 0, got " + std::to_string(o.eps));
  FT_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay),
           "AdamW: weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
}

void AdamW::step(const std::vector<ParamRef>& params, double lr) {
  optim_detail::check_lr(lr, "AdamW");
  check_params(params, "AdamW");
  // Validate everything before touching anything, so a bad call leaves no half-done step.
  for (const ParamRef& p : params) {
    auto it = state_.find(p.name);
    if (!has_grad(p) || it == state_.end()) continue;
    const Tensor& m = it->second.exp_avg;
    FT_CHECK(m.shape() == p.value->shape() && m.dtype() == p.value->dtype(),
             "AdamW: parameter '" + p.name + "' is " + dtype_name(p.value->dtype()) + " " +
                 shape_str(p.value->shape()) + " but its optimizer state is " +
                 dtype_name(m.dtype()) + " " + shape_str(m.shape()));
  }
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const Tensor& value = *p.value;
    State& s = state_[p.name];
    if (!s.exp_avg.defined()) {  // lazily, so the memory shows up when training starts
      s.exp_avg = Tensor::zeros(value.shape(), value.dtype());
      s.exp_avg_sq = Tensor::zeros(value.shape(), value.dtype());
    }
    s.step += 1;
    const adamw_math::Coefficients c = adamw_math::coefficients(options_, lr, s.step);
    if (value.dtype() == DType::F32)
      adamw_update(value.data<float>(), p.grad->data<float>(), s.exp_avg.data<float>(),
                   s.exp_avg_sq.data<float>(), value.numel(), c);
    else
      adamw_update(value.data<double>(), p.grad->data<double>(), s.exp_avg.data<double>(),
                   s.exp_avg_sq.data<double>(), value.numel(), c);
  }
}

void AdamW::save_state(NamedTensors& out) const {
  for (const auto& [name, s] : state_) {
    out.emplace_back(name + ".exp_avg", s.exp_avg);
    out.emplace_back(name + ".exp_avg_sq", s.exp_avg_sq);
    out.emplace_back(name + ".step", optim_detail::step_tensor(s.step));
  }
}

void AdamW::load_state(const StateMap& state, const std::vector<ParamRef>& params) {
  check_params(params, "AdamW");
  std::map<std::string, State> loaded;
  if (!state.empty()) {
    optim_detail::StateReader reader(state, "AdamW");
    for (const ParamRef& p : params) {
      State s;
      s.exp_avg = reader.tensor(p.name + ".exp_avg", p.value->shape(), p.value->dtype());
      s.exp_avg_sq = reader.tensor(p.name + ".exp_avg_sq", p.value->shape(), p.value->dtype());
      s.step = reader.step(p.name + ".step");
      loaded.emplace(p.name, std::move(s));
    }
    reader.expect_all_consumed();
  }
  state_ = std::move(loaded);
}

int64_t AdamW::state_bytes() const {
  int64_t total = 0;
  for (const auto& kv : state_) total += int64_t(kv.second.exp_avg.nbytes() * 2);
  return total;
}

int64_t AdamW::step_count(const std::string& param) const {
  auto it = state_.find(param);
  return it == state_.end() ? 0 : it->second.step;
}

}  // namespace fusetune
