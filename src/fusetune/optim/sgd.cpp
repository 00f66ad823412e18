#include "fusetune/optim/sgd.h"

#include <cmath>

#include "fusetune/util/error.h"

namespace fusetune {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

struct Coefficients {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// buf == nullptr: no momentum. first: the buffer is initialized with d (torch clones grad).
template <class T>
void sgd_update(T* p, const T* g, T* buf, bool first, int64_t n, const Coefficients& c) {
  const bool decay = c.weight_decay != 0;
  const T wd = T(c.weight_decay);
  const T mom = T(c.momentum);
  const T keep = T(1 - c.dampening);
  const T neg_lr = T(-c.lr);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if (decay) d = d + wd * p[i];
    if (buf) {
      const T b = first ? d : buf[i] * mom + keep * d;
      buf[i] = b;
      d = c.nesterov ? d + mom * b : b;
    }
    p[i] = p[i] + neg_lr * d;
  }
}

}  // namespace

SGD::SGD(SGDOptions options) : options_(options) {
  const auto& o = options_;
  FT_CHECK(o.momentum >= 0 && std::isfinite(o.momentum),
           "SGD: momentum must be >= 0, got " + std::to_string(o.momentum));
  FT_CHECK(std::isfinite(o.dampening), "SGD: dampening must be finite");
  FT_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay),
           "SGD: weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
  FT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
           "SGD: nesterov momentum requires momentum > 0 and dampening = 0");
}

void SGD::step(const std::vector<ParamRef>& params, double lr) {
  optim_detail::check_lr(lr, "SGD");
  check_params(params, "SGD");
  const bool use_momentum = options_.momentum != 0;
  for (const ParamRef& p : params) {
    auto it = momentum_buffer_.find(p.name);
    if (!has_grad(p) || it == momentum_buffer_.end()) continue;
    FT_CHECK(it->second.shape() == p.value->shape() && it->second.dtype() == p.value->dtype(),
             "SGD: parameter '" + p.name + "' is " + dtype_name(p.value->dtype()) + " " +
                 shape_str(p.value->shape()) + " but its momentum buffer is " +
                 dtype_name(it->second.dtype()) + " " + shape_str(it->second.shape()));
  }
  const Coefficients c{lr, options_.momentum, options_.dampening, options_.weight_decay,
                       options_.nesterov};
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const Tensor& value = *p.value;
    Tensor* buf = nullptr;
    bool first = false;
    if (use_momentum) {
      Tensor& b = momentum_buffer_[p.name];
      first = !b.defined();
      if (first) b = Tensor::empty(value.shape(), value.dtype());  // filled by the update
      buf = &b;
    }
    if (value.dtype() == DType::F32)
      sgd_update(value.data<float>(), p.grad->data<float>(), buf ? buf->data<float>() : nullptr,
                 first, value.numel(), c);
    else
      sgd_update(value.data<double>(), p.grad->data<double>(), buf ? buf->data<double>() : nullptr,
                 first, value.numel(), c);
  }
}

void SGD::save_state(NamedTensors& out) const {
  for (const auto& [name, buf] : momentum_buffer_) out.emplace_back(name + ".momentum_buffer", buf);
}

void SGD::load_state(const StateMap& state, const std::vector<ParamRef>& params) {
  check_params(params, "SGD");
  std::map<std::string, Tensor> loaded;
  if (!state.empty()) {
    optim_detail::StateReader reader(state, "SGD");
    if (options_.momentum != 0)
      for (const ParamRef& p : params)
        loaded.emplace(
            p.name, reader.tensor(p.name + ".momentum_buffer", p.value->shape(), p.value->dtype()));
    reader.expect_all_consumed();
  }
  momentum_buffer_ = std::move(loaded);
}

int64_t SGD::state_bytes() const {
  int64_t total = 0;
  for (const auto& kv : momentum_buffer_) total += int64_t(kv.second.nbytes());
  return total;
}

}  // namespace fusetune
