#include "fusetune/optim/sgd.h"

#include <cmath>

#include "fusetune/optim/parallel_min.h"
#include "fusetune/optim/stochastic_rounding.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

struct Coefficients {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// buf == nullptr: no momentum. first: the buffer is initialized with d (torch clones grad).
// T: the compute type; P, B: how the parameter (and gradient) and the buffer are stored (T, or
// uint16_t for bf16, written back with the streams' stochastic rounding).
template <class T, class P, class B>
void sgd_update(P* p, const P* g, B* buf, bool first, int64_t n, const Coefficients& c,
                const bf16::Stream& round) {
  const bool decay = c.weight_decay != 0;
  const T wd = T(c.weight_decay);
  const T mom = T(c.momentum);
  const T keep = T(1 - c.dampening);
  const T neg_lr = T(-c.lr);
#pragma omp parallel for schedule(static) if (n >= kOptimizerParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T pi = bf16::load(p[i]);
    T d = bf16::load(g[i]);
    if (decay) d = d + wd * pi;
    if (buf) {
      const T b = first ? d : bf16::load(buf[i]) * mom + keep * d;
      bf16::store(buf[i], b, round, bf16::Buffer::Momentum, i);
      d = c.nesterov ? d + mom * b : b;
    }
    bf16::store(p[i], pi + neg_lr * d, round, bf16::Buffer::Value, i);
  }
}

template <class T, class P, class B>
void sgd_tensors(const Tensor& value, const Tensor& grad, Tensor* buf, bool first,
                 const Coefficients& c, uint64_t seed, int64_t step, const std::string& name) {
  sgd_update<T>(value.data<P>(), grad.data<P>(), buf ? buf->data<B>() : static_cast<B*>(nullptr),
                first, value.numel(), c, bf16::Stream(seed, step, name));
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
  FT_CHECK(o.state_dtype == DType::F32 || o.state_dtype == DType::BF16,
           std::string("SGD: state_dtype must be F32 or BF16, got ") + dtype_name(o.state_dtype));
}

DType SGD::buffer_dtype(DType param) const {
  if (options_.state_dtype != DType::BF16) return param == DType::F64 ? DType::F64 : DType::F32;
  FT_CHECK(param != DType::F64,
           "SGD: optimizer.state_dtype bf16 is for F32 and BF16 parameters, not F64 ones");
  return DType::BF16;
}

bool SGD::uses_rounding(DType param) const {
  return param == DType::BF16 || (options_.momentum != 0 && buffer_dtype(param) == DType::BF16);
}

void SGD::step(const std::vector<ParamRef>& params, double lr) {
  optim_detail::check_lr(lr, "SGD");
  check_params(params, "SGD");
  const bool use_momentum = options_.momentum != 0;
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const DType bd = buffer_dtype(p.value->dtype());  // F64 with bf16 state: throws here
    auto it = momentum_buffer_.find(p.name);
    if (it == momentum_buffer_.end()) continue;
    FT_CHECK(it->second.shape() == p.value->shape() && it->second.dtype() == bd,
             "SGD: parameter '" + p.name + "' is " + dtype_name(p.value->dtype()) + " " +
                 shape_str(p.value->shape()) + " but its momentum buffer is " +
                 dtype_name(it->second.dtype()) + " " + shape_str(it->second.shape()));
  }
  const Coefficients c{lr, options_.momentum, options_.dampening, options_.weight_decay,
                       options_.nesterov};
  for (const ParamRef& p : params) {
    if (!has_grad(p)) continue;
    const Tensor& value = *p.value;
    const DType pd = value.dtype(), bd = buffer_dtype(pd);
    Tensor* buf = nullptr;
    bool first = false;
    if (use_momentum) {
      Tensor& b = momentum_buffer_[p.name];
      first = !b.defined();
      if (first) b = Tensor::empty(value.shape(), bd);  // filled by the update
      buf = &b;
    }
    const int64_t step = uses_rounding(pd) ? ++steps_[p.name] : 0;
    const uint64_t seed = options_.seed;
    if (pd == DType::F64)
      sgd_tensors<double, double, double>(value, *p.grad, buf, first, c, seed, step, p.name);
    else if (pd == DType::F32 && bd == DType::F32)
      sgd_tensors<float, float, float>(value, *p.grad, buf, first, c, seed, step, p.name);
    else if (pd == DType::F32)
      sgd_tensors<float, float, uint16_t>(value, *p.grad, buf, first, c, seed, step, p.name);
    else if (bd == DType::F32)
      sgd_tensors<float, uint16_t, float>(value, *p.grad, buf, first, c, seed, step, p.name);
    else
      sgd_tensors<float, uint16_t, uint16_t>(value, *p.grad, buf, first, c, seed, step, p.name);
  }
}

void SGD::save_state(NamedTensors& out) const {
  std::map<std::string, Tensor> all;  // in name order, as the other optimizers write
  for (const auto& [name, buf] : momentum_buffer_) all.emplace(name + ".momentum_buffer", buf);
  for (const auto& [name, step] : steps_)
    all.emplace(name + ".step", optim_detail::step_tensor(step));
  for (auto& e : all) out.emplace_back(e.first, std::move(e.second));
}

void SGD::load_state(const StateMap& state, const std::vector<ParamRef>& params) {
  check_params(params, "SGD");
  std::map<std::string, Tensor> loaded;
  std::map<std::string, int64_t> steps;
  if (!state.empty()) {
    optim_detail::StateReader reader(state, "SGD");
    for (const ParamRef& p : params) {
      const DType bd = buffer_dtype(p.value->dtype());
      if (options_.momentum != 0) {
        const std::string key = p.name + ".momentum_buffer";
        auto it = state.find(key);
        if (it != state.end() && it->second.defined() && it->second.dtype() != bd)
          throw Error("SGD state: entry '" + key + "' is " + dtype_name(it->second.dtype()) +
                      ", expected " + dtype_name(bd) + " (with optimizer.state_dtype " +
                      (options_.state_dtype == DType::BF16 ? "bf16" : "fp32") +
                      ", the momentum buffer of " + dtype_name(p.value->dtype()) + " parameter '" +
                      p.name + "' is " + dtype_name(bd) +
                      "); resume with the state_dtype (and dtype) the state was saved with");
        loaded.emplace(p.name, reader.tensor(key, p.value->shape(), bd));
      }
      if (uses_rounding(p.value->dtype())) steps.emplace(p.name, reader.step(p.name + ".step"));
    }
    reader.expect_all_consumed();
  }
  momentum_buffer_ = std::move(loaded);
  steps_ = std::move(steps);
}

int64_t SGD::state_bytes() const {
  int64_t total = 0;
  for (const auto& kv : momentum_buffer_) total += int64_t(kv.second.nbytes());
  return total;
}

}  // namespace fusetune
